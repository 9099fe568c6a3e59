"""The folder layout is the architecture: no module imports from a layer above its own (imports inside functions
count too), and no import cycle. A new top-level module or package needs a layer here."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "fedpeft"
LAYERS = [  # lowest first; a module may import from its own layer and those below
    {"lazy", "rng", "registry", "comm", "config", "text_metrics", "metrics", "costs", "privacy", "outputs"},
    {"data", "backbones", "perturbation"},
    {"adapters", "prediction_files"},
    {"model", "clients", "attacks", "generation_eval", "suites"},
    {"trainers", "formats", "aggregators", "selection", "sharing", "downlink", "transforms", "post_tuning"},  # axes
    {"components", "exchange", "methods", "experiment", "tracking", "plugins"},
    {"build", "dryrun", "predict", "export", "publish", "report", "resolve", "runtime", "catalogue", "integrations"},
    {"cli"},
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _unit(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedpeft."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("fedpeft.")}
    return out


def test_every_module_has_a_layer_and_imports_only_from_its_own_or_below():
    upward, unplaced = [], set()
    for path in SRC.rglob("*.py"):
        unit = _unit(path)
        if unit == "__init__":
            continue
        if unit not in LAYER:
            unplaced.add(unit)
            continue
        for used in _imports(path) - {unit}:
            if used not in LAYER:
                unplaced.add(used)
            elif LAYER[used] > LAYER[unit]:
                upward.append(f"{path.relative_to(SRC)} imports fedpeft.{used} (layer {LAYER[used]} > {LAYER[unit]})")
    assert not unplaced, f"give these modules a layer in tests/conformance/test_layers.py: {sorted(unplaced)}"
    assert not upward, "imports from a layer above:\n" + "\n".join(sorted(upward))


def test_no_import_cycle():
    import subprocess
    import sys

    import pytest

    tool = SRC.parents[2] / "shared" / "tools" / "import_cycles.py"  # ../shared beside the repository
    if not tool.exists():
        pytest.skip(f"{tool} not found")
    out = subprocess.run([sys.executable, str(tool), str(SRC.parent), "fedpeft"], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "1", f"import cycle among {out[1:]}"
