"""The Flower app fedpeft writes (``runtime.flower.app_bundle``): FAB format v1 that ``flwr build`` accepts, and a
run config that is the experiment, round-tripped through Flower's own parsing and overrides."""

from __future__ import annotations

import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest

flwr = pytest.importorskip("flwr")

from flwr.common.config import get_fused_config_from_dir, parse_config_args  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from fedpeft.cli import app as cli  # noqa: E402
from fedpeft.config import ConfigError, dump_config  # noqa: E402
from fedpeft.methods import PRESETS  # noqa: E402
from fedpeft.resolve import load_config  # noqa: E402
from fedpeft.runtime.flower.app_bundle import RUN_KEYS, experiment_of, write_app  # noqa: E402
from fedpeft.runtime.flower.local import BIN, flower_env  # noqa: E402

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


def _run_config(app: Path, *overrides: str) -> dict:
    """What Flower's ServerApp receives: the app's config fused with `flwr run --run-config` overrides."""
    return get_fused_config_from_dir(app, parse_config_args(list(overrides)))


def _configs():
    for path in EXAMPLES:
        yield path.name, load_config(path)
    for name in PRESETS.names():
        try:
            yield name, load_config(None, [f"method.name={name}"])
        except ConfigError:  # a preset that needs a task of its kind (feddpo: preference pairs)
            continue


def test_every_example_and_preset_round_trips_through_the_apps_run_config(tmp_path):
    seen = 0
    for i, (name, cfg) in enumerate(_configs()):
        app = write_app(tmp_path / f"app-{i}", cfg)
        assert dump_config(experiment_of(_run_config(app))) == dump_config(cfg), name
        seen += 1
    assert seen >= len(EXAMPLES) + 30


def test_run_config_overrides_reach_the_experiment_and_unknown_keys_are_refused(tmp_path):
    app = write_app(tmp_path / "app", load_config(EXAMPLES[0].parent / "sst2_fedprompt.yaml"), {"out": "/r"})
    # one --run-config string: Flower 1.41 merges several of them shallowly (a later `task.x` drops an earlier `task.y`)
    rc = _run_config(app, """federation.rounds=7 method.trainer.lr=0.5 task.max_test=100 """
                          """task.label_words='["great", "awful"]' out='/elsewhere'""")
    cfg = experiment_of(rc)
    assert (cfg.federation.rounds, cfg.method.trainer.lr, cfg.task.max_test) == (7, 0.5, 100)
    assert cfg.task.label_words == ["great", "awful"] and rc["out"] == "/elsewhere"
    assert experiment_of(_run_config(app, "task.path='data/my.csv'")).task.path == "data/my.csv"  # text, not JSON
    with pytest.raises(ValueError, match="federation.roundz"):
        _run_config(app, "federation.roundz=3")  # Flower's own check: only the app's keys
    with pytest.raises(ConfigError, match=r"(?s)run config.*federation.rounds: Input should be a valid integer"):
        experiment_of(_run_config(app, "federation.rounds='many'"))
    assert {k: rc[k] for k in RUN_KEYS if k != "out"} == {k: v for k, v in RUN_KEYS.items() if k != "out"}


def test_flower_app_command_writes_a_fab_v1_that_flwr_build_accepts(tmp_path):
    res = CliRunner().invoke(cli, ["flower", "app", str(tmp_path / "my-app"), str(EXAMPLES[0]),
                                   "--set", "federation.rounds=2", "--run-dir", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    meta = tomllib.loads((tmp_path / "my-app" / "pyproject.toml").read_text())
    app = meta["tool"]["flwr"]["app"]
    assert app["fab-format-version"] == 1 and app["flwr-version-target"] == flwr.__version__
    assert meta["project"]["license"] == {"file": "LICENSE"}
    assert any(d.startswith("flwr") and ">=" in d for d in meta["project"]["dependencies"])
    assert any(d.startswith("fedpeft>=") for d in meta["project"]["dependencies"])
    assert app["config"]["federation"]["rounds"] == 2 and app["config"]["out"] == str(tmp_path / "run")
    assert "Apache License" in (tmp_path / "my-app" / "LICENSE").read_text()
    build = subprocess.run([str(BIN / "flwr"), "build", "--app", str(tmp_path / "my-app")], cwd=tmp_path,
                           capture_output=True, text=True, env=flower_env(), timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    (fab,) = tmp_path.glob("*.fab")
    with zipfile.ZipFile(fab) as z:
        files = {"LICENSE", "pyproject.toml", "fedpeft_flower_server.py", "fedpeft_flower_client.py"}
        assert files <= set(z.namelist())
    again = CliRunner().invoke(cli, ["flower", "app", str(tmp_path / "my-app")])
    assert again.exit_code == 2 and "already holds an app" in again.output


def test_app_directory_names_flwr_build_refuses_are_refused_here(tmp_path):
    with pytest.raises(ValueError, match="letters, digits and hyphens"):
        write_app(tmp_path / "flower_app", load_config(None))


def test_a_flower_past_the_tested_range_is_declared_with_a_warning(monkeypatch, caplog):
    """`make test-flower-versions` tries a release before fedpeft's bound moves: the app then declares up to that
    release's minor (flwr-version-target must satisfy the requirement), and says so; inside the range it is fedpeft's
    own bound."""
    from importlib import metadata

    from packaging.requirements import Requirement

    import fedpeft.runtime.flower.app_bundle as bundle

    own = Requirement(bundle.requirement("flwr"))
    assert bundle.flwr_requirement() == str(own) and flwr.__version__ in own.specifier
    real = metadata.version
    monkeypatch.setattr(bundle.metadata, "version", lambda name: "7.3.1" if name == "flwr" else real(name))
    lower = next(s.version for s in own.specifier if s.operator == ">=")
    with caplog.at_level("WARNING", logger="fedpeft.flower"):
        assert bundle.flwr_requirement() == f"flwr>={lower},<7.4"
    assert "outside fedpeft's tested range" in caplog.text
