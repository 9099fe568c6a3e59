"""Start-up (issue 35): listing the registries, resolving and validating a config, and the CLI's listing, help and
config-error paths import none of the heavy libraries (torch, transformers, peft, sklearn, pandas, flwr); only a
run that needs a model does. Each check runs in a fresh interpreter, so what this test process already imported
does not count; the assertions are on ``sys.modules``, not on times."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("torch", "transformers", "peft", "sklearn", "scipy", "pandas", "pyarrow", "flwr", "ray", "safetensors",
         "cma", "dp_accounting")

REPORT = """
import json, sys
heavy = {heavy!r}
print("\\nHEAVY " + json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
"""


def _heavy_after(code: str, tmp_path) -> list[str]:
    """The heavy modules (top-level package or below) in ``sys.modules`` after ``code`` ran in a fresh
    interpreter."""
    script = textwrap.dedent(code) + REPORT.format(heavy=HEAVY)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(x for x in reversed(res.stdout.splitlines()) if x.startswith("HEAVY "))
    return sorted({m.split(".")[0] for m in json.loads(line.removeprefix("HEAVY "))})


def test_resolving_listing_and_config_errors_import_no_heavy_library(tmp_path):
    code = """
    from fedpeft.backbones import BACKBONES
    from fedpeft.components import AXIS_REGISTRIES, LIST_REGISTRIES
    from fedpeft.config import ConfigError
    from fedpeft.data import TASKS
    from fedpeft.methods import PRESETS
    from fedpeft.resolve import load_config
    from fedpeft.runtime.registry import RUNTIMES

    cfg = load_config(None, [])
    assert cfg.method.name
    registries = [*AXIS_REGISTRIES.values(), *LIST_REGISTRIES.values(), PRESETS, TASKS, BACKBONES, RUNTIMES]
    assert all(list(r.names()) for r in registries)
    needs = {"feddpo": ["task.name=hh-rlhf", "model.name=smollm2"]}  # a preference preset needs preference pairs
    for name in PRESETS.names():  # every preset resolved and its combination checked
        load_config(None, [f"method.name={name}", *needs.get(name, [])])
    for overrides in (["federation.rounds=0"], ["method.name=no-such-method"], ["no_such_key=1"]):
        try:
            load_config(None, overrides)
        except ConfigError:
            pass
        else:
            raise AssertionError(f"{overrides} resolved")
    import fedpeft.cli
    """
    assert _heavy_after(code, tmp_path) == []


@pytest.mark.parametrize("argv", [["methods"], ["components"], ["tasks"], ["models"], ["--help"],
                                  ["run", "bad.yaml"], ["run", "--set", "federation.rounds=0"]])
def test_cli_listing_help_and_config_errors_import_no_heavy_library(tmp_path, argv):
    (tmp_path / "bad.yaml").write_text("federation: {rounds: 2\n")  # a YAML syntax error
    code = f"""
    import sys
    sys.argv = ["fedpeft", *{argv!r}]
    import fedpeft.cli
    try:
        fedpeft.cli.main()
    except SystemExit as e:
        code = e.code
    else:
        code = 0
    assert code == (2 if sys.argv[1] == "run" else 0), code
    """
    assert _heavy_after(code, tmp_path) == []


def test_a_model_still_brings_torch(tmp_path):
    """The check above can fail: building a classifier imports torch (the lazy proxies do import on use)."""
    code = """
    from fedpeft.comm.codec import WIRE_DTYPES
    assert str(WIRE_DTYPES["bfloat16"]) == "torch.bfloat16"
    """
    assert "torch" in _heavy_after(code, tmp_path)
