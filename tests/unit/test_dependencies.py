"""Every dependency is bounded to the releases tested: an upper bound on each requirement of ``pyproject.toml``
(extras included, ``hf`` aside: untested offline), and the exact version ``make`` installs from ``constraints.txt``
inside each range."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {k: v for k, v in project["optional-dependencies"].items() if k != "hf"}
    return [Requirement(r) for r in project["dependencies"] + [r for rs in extras.values() for r in rs]]


def test_every_dependency_has_an_upper_bound():
    unbounded = [str(r) for r in _requirements() if not any(s.operator in ("<", "<=", "==", "~=") for s in r.specifier)]
    assert not unbounded, f"unbounded dependencies: {unbounded}"


def test_the_pinned_versions_lie_in_the_declared_ranges():
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    checked = 0
    for req in _requirements():
        name = req.name.lower().replace("_", "-")
        if name in pins:
            assert req.specifier.contains(pins[name], prereleases=True), f"{req} excludes the pinned {pins[name]}"
            checked += 1
    assert checked >= 15  # torch, transformers, peft, accelerate, flwr, ... all pinned
