"""Components kept outside fedpeft: a package declares its modules in the ``fedpeft.plugins`` entry-point group and
they are imported, so that their registrations run, before any config is resolved (the command line, the Flower
apps and the Python API alike), as pytest loads its plugins::

    [project.entry-points."fedpeft.plugins"]
    fednova = "my_components.fednova"
"""

from __future__ import annotations

from importlib.metadata import entry_points

GROUP = "fedpeft.plugins"


class PluginError(ImportError):
    """An installed plugin module failed to import (the message names it)."""


def load_plugins() -> list[str]:
    """Import every installed plugin module; a PluginError names the plugin that failed and why."""
    loaded = []
    for ep in entry_points(group=GROUP):
        try:
            ep.load()
        except Exception as e:  # noqa: BLE001 - whatever a plugin raises, name it
            raise PluginError(f"fedpeft plugin '{ep.name}' ({ep.value}, entry point group {GROUP}) failed to "
                              f"import: {type(e).__name__}: {e}") from e
        loaded.append(ep.name)
    return loaded
