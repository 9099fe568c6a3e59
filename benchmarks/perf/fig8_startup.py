"""Figure 8: start-up of the CLI's listings, a config error and --help against ``import torch``."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path


from benchmarks.perf.common import Figure, alternate, figure


STARTUP_BEFORE = {"8a": 8.32, "8b": 7.95, "8c": 0.51, "torch": 3.08}  # s, median of 5 runs before issue 35
HEAVY = ("torch", "transformers", "peft", "sklearn", "scipy", "pandas", "pyarrow", "flwr", "ray", "safetensors", "cma",
         "dp_accounting")


def figure_8(args) -> list[Figure]:
    """Whole fresh processes: a CLI command against ``python -c "import torch"``; the before times (the docstring)
    are in each row's note."""
    import subprocess

    exe = Path(sys.executable).with_name("fedpeft")
    cli = [str(exe)] if exe.exists() else [sys.executable, "-c", "import sys; from fedpeft.cli import main; "
                                                                  "sys.exit(main())"]

    def call(argv: list[str], code: int, cwd: str) -> None:
        res = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
        if res.returncode != code:
            raise RuntimeError(f"{argv} exited {res.returncode}, not {code}: {res.stderr[-500:]}")

    def heavy_imported(argv: list[str], cwd: str) -> list[str]:
        """The heavy libraries in ``sys.modules`` after the command ran (once more, untimed)."""
        probe = ("import sys\nsys.argv = ['fedpeft', *sys.argv[1:]]\nfrom fedpeft.cli import main\ntry:\n    main()\n"
                 "except SystemExit:\n    pass\nprint('HEAVY', *sorted({m.split('.')[0] for m in sys.modules} & "
                 f"set({HEAVY!r})))")
        res = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=cwd)
        return next(x for x in reversed(res.stdout.splitlines()) if x.startswith("HEAVY")).split()[1:]

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "bad.yaml").write_text("federation: {rounds: 2\n")  # a YAML syntax error
        rows = {"8a": ("`fedpeft methods`", ["methods"], 0),
                "8b": ("a YAML syntax error (`fedpeft run bad.yaml`)", ["run", "bad.yaml"], 2),
                "8c": ("`fedpeft --help`", ["--help"], 0)}
        for key, (what, argv, code) in rows.items():
            ta, tb = alternate(lambda: call(cli + argv, code, tmp),
                               lambda: call([sys.executable, "-c", "import torch"], 0, tmp), args.reps)
            before = STARTUP_BEFORE[key]
            out.append(figure(key, f"start-up: {what}, a fresh process / `python -c \"import torch\"`",
                              ("fedpeft", "import torch"), ta, tb, "≤ 0.5× (about 1 s)", lambda r: r <= 0.5,
                              f"before: {before:.2f} s, {before / STARTUP_BEFORE['torch']:.2f}× of import torch's "
                              f"{STARTUP_BEFORE['torch']:.2f} s; heavy libraries imported now: "
                              f"{', '.join(heavy_imported(argv, tmp)) or 'none'}"))
    return out
