"""Components of an installed package (entry-point group ``fedpeft.plugins``) are registered before any config is
resolved: the command line knows them, and a plugin that fails to import is named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PLUGIN = '''
from fedpeft.aggregators.base import AGGREGATORS
from fedpeft.aggregators.fedavg import FedAvg


@AGGREGATORS.register("fedavg_from_a_plugin", "FedAvg, registered by an installed plugin package")
class PluginFedAvg(FedAvg):
    pass
'''


def _install(site: Path, module: str, source: str) -> None:
    """A distribution as pip leaves it: the module and a .dist-info with its entry point."""
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[fedpeft.plugins]\n{module} = {module}\n")


def _fedpeft(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "fedpeft.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[2])


def test_an_installed_plugins_component_is_known_to_the_command_line(tmp_path):
    _install(tmp_path, "my_fedpeft_plugin", PLUGIN)
    res = _fedpeft(tmp_path, "components", "fedavg_from_a_plugin")
    assert res.returncode == 0, res.stderr
    assert "method.aggregator: fedavg_from_a_plugin" in res.stdout
    res = _fedpeft(tmp_path, "config", "--set", "method.aggregator.name=fedavg_from_a_plugin")
    assert res.returncode == 0 and "name: fedavg_from_a_plugin" in res.stdout, res.stderr


def test_a_plugin_that_fails_to_import_is_named(tmp_path):
    _install(tmp_path, "broken_fedpeft_plugin", "raise RuntimeError('missing dependency xyz')\n")
    res = _fedpeft(tmp_path, "config")
    assert res.returncode == 2
    assert "fedpeft plugin 'broken_fedpeft_plugin'" in res.stderr and "missing dependency xyz" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1  # one line
