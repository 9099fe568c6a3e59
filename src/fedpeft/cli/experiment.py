"""``fedpeft run``: run, resume, extend or dry-run an experiment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from fedpeft.cli.console import console, fail, print_summary, run_dir, setup_logging, warn


def _run_target(config: Optional[Path], out: Optional[Path], resume: bool) -> tuple[Optional[Path], Optional[Path]]:
    """(config file, run directory): with ``--resume`` the positional argument may be the run directory itself,
    and without a config file the run's own config.yaml is used."""
    if config is not None and config.is_dir():
        if not resume:
            fail(f"{config} is a folder; to continue the run in it: fedpeft run --resume {config}")
        if out is not None and out.resolve() != config.resolve():
            fail(f"--resume {config} and --out {out} name two run directories; give one")
        return config / "config.yaml", config
    if resume and config is None:
        if out is None:
            fail("--resume needs the run directory: fedpeft run --resume RUN_DIR")
        return out / "config.yaml", out
    if resume and out is None and not config.exists():
        fail(f"--resume: {config} holds no run (no such folder); check the path")
    return config, out


def run(
    config: Annotated[Optional[Path], typer.Argument(help="experiment YAML (omit to use the defaults), or with "
                                                          "--resume the run directory")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="override a key, e.g. federation.rounds=2")] = [],
    out: Annotated[Optional[Path], typer.Option(help="run directory (default runs/<method>-<task>-<model>-<config "
                                                     "hash>-s<seed>)")] = None,
    resume: Annotated[bool, typer.Option(help="continue the run in --out (or RUN_DIR) from its last checkpoint; "
                                              "with --set federation.rounds=N, extend it to N rounds")] = False,
    runtime: Annotated[Optional[str], typer.Option(help="shortcut for --set runtime.name=...")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress bars")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="validate and show what would run: the classes and "
                                          "clients found, one example as the model sees it, trainable params and "
                                          "bytes per client-round; train nothing, write nothing")] = False,
) -> None:
    """Run an experiment and print the per-round table; or continue one (`fedpeft run --resume RUN_DIR`)."""
    from fedpeft.config import ConfigError
    from fedpeft.outputs import check_output_dir, os_error_line
    from fedpeft.registry import UnknownNameError
    from fedpeft.resolve import load_config
    from fedpeft.runtime.registry import runtime as runtime_fn
    from fedpeft.runtime.server import RoundFailed
    from fedpeft.tracking.rundir import RunDirLocked

    config, out = _run_target(config, out, resume)
    if resume and out is not None and not (out / "config.yaml").exists():
        fail(f"--resume: {out} holds no run (no config.yaml); check the path, or drop --resume to start a new run")
    overrides = (list(set_) + ([f"runtime.name={runtime}"] if runtime else [])
                 + (["runtime.progress=false"] if quiet else []))
    try:
        cfg = load_config(config, overrides)
    except ConfigError as e:
        fail(str(e))
    for note in cfg.notes:
        warn(note)
    out_dir = run_dir(cfg, out)
    setup_logging(cfg.runtime.progress and not dry_run)
    if dry_run:
        _dry_run(cfg, out_dir)
        return
    try:
        check_output_dir(out_dir, "--out")
        summary = runtime_fn(cfg.runtime.name)(cfg, out_dir, resume=resume)
    except RoundFailed as e:
        fail(f"{e}; the run stopped after its last checkpoint (continue with --resume)")
    except (FileExistsError, UnknownNameError, FileNotFoundError, ValueError, RunDirLocked) as e:
        fail(str(e))
    except ImportError as e:  # an optional extra a setting needs (tracking sinks, Flower)
        fail(str(e))
    except OSError as e:
        fail(os_error_line(e))
    print_summary(out_dir, summary)


def _dry_run(cfg, out_dir: Path) -> None:
    from fedpeft.config import dump_config
    from fedpeft.dryrun import dry_run

    try:
        d = dry_run(cfg)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    typer.echo(dump_config(cfg), nl=False)
    table = Table(title=f"classes found ({cfg.task.name})")
    for col, justify in (("class", "left"), ("train", "right"), ("test", "right")):
        table.add_column(col, justify=justify)
    for name, train, test in d.classes:
        table.add_row(name, f"{train:,}", f"{test:,}")
    table.add_row("all", f"{sum(c[1] for c in d.classes):,}", f"{sum(c[2] for c in d.classes):,}")
    if d.classes:  # a generation task has none: its clients' sizes follow
        console.print(table)
    if d.validation:
        console.print(f"validation: {d.validation:,} training examples held out (evaluation.keep_best)",
                      highlight=False)
    console.print("clients:\n  " + "\n  ".join(d.clients), highlight=False, markup=False)
    if d.example and d.generation:
        console.print(f"the first training example as the model sees it (its prompt, then the response it "
                      f"learns):\n  {d.example}", highlight=False, markup=False)
    elif d.example:
        console.print(f"the first training example as the model sees it (readout {d.readout}, label "
                      f"'{d.example_label}'):\n  {d.example}", highlight=False, markup=False)
    for split, line in d.cuts.items():
        console.print(f"{split}: {line}", highlight=False, markup=False)
    bound = "at most " if d.up_upper_bound else ""
    console.print(f"trainable params {d.trainable_params:,}", highlight=False)
    console.print(f"bytes per client-round (round 1, client {d.client} of {d.clients_per_round} selected):\n"
                  f"  receive {d.down_bytes:,} B (tensors {d.down_tensor_bytes:,} B)\n"
                  f"  send {bound}{d.up_bytes:,} B (tensors {d.up_tensor_bytes:,} B + framing "
                  f"{d.up_framing_bytes:,} B of a zero-filled reply)", highlight=False)
    console.print(f"dry run: nothing trained, {out_dir} not written", highlight=False)
