"""The catalogue of method components: one registry per axis (and per list of transforms and wrappers), with the
components of installed plugin packages registered too (``fedpeft.plugins``).

Only entry points (``fedpeft.resolve``, ``fedpeft.build``) import this module; the components themselves
import just their own axis's ``base`` module, so adding one is a new file plus a registration.
"""

from __future__ import annotations

from typing import Any

from fedpeft.adapters import ADAPTERS
from fedpeft.aggregators import AGGREGATORS, WRAPPERS
from fedpeft.downlink import DOWNLINKS
from fedpeft.plugins import load_plugins
from fedpeft.post_tuning import POST_TUNING
from fedpeft.registry import Registry
from fedpeft.selection import SELECTORS
from fedpeft.sharing import SHARING
from fedpeft.trainers import TRAINERS
from fedpeft.transforms import TRANSFORMS

# ``method.<axis>`` -> registry of that axis
AXIS_REGISTRIES: dict[str, Registry[Any]] = {
    "adapter": ADAPTERS, "trainer": TRAINERS, "aggregator": AGGREGATORS, "selector": SELECTORS, "sharing": SHARING,
    "downlink": DOWNLINKS, "post_tuning": POST_TUNING,
}
# ``method.<list>`` -> registry of its entries
LIST_REGISTRIES: dict[str, Registry[Any]] = {"transforms": TRANSFORMS, "wrappers": WRAPPERS}

PLUGINS = load_plugins()  # the names of the plugin modules imported (their components are registered above)
