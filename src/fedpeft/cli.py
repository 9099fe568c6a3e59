"""Command line: ``fedpeft run | export | predict | evaluate | report | compare | methods | components | tasks | models |
flower (superlink | supernode | certs | node-key | register | run)``."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Federated fine-tuning of frozen language models with parameter-efficient methods.")
console = Console(width=None if sys.stdout.isatty() else 120)


def _fail(msg: str) -> None:
    from rich.markup import escape

    Console(stderr=True).print(f"[bold red]error:[/] {escape(msg)}", soft_wrap=True)  # one line stays one line
    raise typer.Exit(2)


def _setup_logging(verbose: bool) -> None:
    """Warnings and errors on the terminal; the run's INFO lines too only with progress shown (run.log always
    keeps them). Quiet also silences the libraries' own progress bars (transformers' weight loading)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.INFO if verbose else logging.WARNING)
    if not verbose:
        from fedpeft.backbones.loading import quiet_libraries

        quiet_libraries()


def _warn(msg: str) -> None:
    from rich.markup import escape

    Console(stderr=True).print(f"[bold yellow]warning:[/] {escape(msg)}", soft_wrap=True)


def _run_target(config: Optional[Path], out: Optional[Path], resume: bool) -> tuple[Optional[Path], Optional[Path]]:
    """(config file, run directory): with ``--resume`` the positional argument may be the run directory itself,
    and without a config file the run's own config.yaml is used."""
    if config is not None and config.is_dir():
        if not resume:
            _fail(f"{config} is a folder; to continue the run in it: fedpeft run --resume {config}")
        if out is not None and out.resolve() != config.resolve():
            _fail(f"--resume {config} and --out {out} name two run directories; give one")
        return config / "config.yaml", config
    if resume and config is None:
        if out is None:
            _fail("--resume needs the run directory: fedpeft run --resume RUN_DIR")
        return out / "config.yaml", out
    if resume and out is None and not config.exists():
        _fail(f"--resume: {config} holds no run (no such folder); check the path")
    return config, out


@app.command()
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
        _fail(f"--resume: {out} holds no run (no config.yaml); check the path, or drop --resume to start a new run")
    overrides = list(set_) + ([f"runtime.name={runtime}"] if runtime else []) + (["runtime.progress=false"] if quiet else [])
    try:
        cfg = load_config(config, overrides)
    except ConfigError as e:
        _fail(str(e))
    for note in cfg.notes:
        _warn(note)
    out_dir = out or Path("runs") / (cfg.name or cfg.default_name())
    _setup_logging(cfg.runtime.progress and not dry_run)
    if dry_run:
        _dry_run(cfg, out_dir)
        return
    try:
        check_output_dir(out_dir, "--out")
        summary = runtime_fn(cfg.runtime.name)(cfg, out_dir, resume=resume)
    except RoundFailed as e:
        _fail(f"{e}; the run stopped after its last checkpoint (continue with --resume)")
    except (FileExistsError, UnknownNameError, FileNotFoundError, ValueError, RunDirLocked) as e:
        _fail(str(e))
    except OSError as e:
        _fail(os_error_line(e))
    _print_table(out_dir, summary)


def _dry_run(cfg, out_dir: Path) -> None:
    from fedpeft.config import dump_config
    from fedpeft.dryrun import dry_run

    try:
        d = dry_run(cfg)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
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
    if d.example:
        console.print(f"the first training example as the model sees it (readout {d.readout}, label "
                      f"'{d.example_label}'):\n  {d.example}", highlight=False, markup=False)
    bound = "at most " if d.up_upper_bound else ""
    console.print(f"trainable params {d.trainable_params:,}", highlight=False)
    console.print(f"bytes per client-round (round 1, client {d.client} of {d.clients_per_round} selected):\n"
                  f"  receive {d.down_bytes:,} B (tensors {d.down_tensor_bytes:,} B)\n"
                  f"  send {bound}{d.up_bytes:,} B (tensors {d.up_tensor_bytes:,} B + framing "
                  f"{d.up_framing_bytes:,} B of a zero-filled reply)", highlight=False)
    console.print(f"dry run: nothing trained, {out_dir} not written", highlight=False)


def _print_table(out_dir: Path, summary: dict) -> None:
    from fedpeft.tracking.rundir import RunDir

    table = Table(title=f"{summary['method']} on {summary['task']} with {summary['model']}")
    for col in ("round", "accuracy", "loss", "local acc (mean/min/max)", "bytes up", "bytes down", "seconds"):
        table.add_column(col, justify="right")
    for r in RunDir(out_dir).read_metrics():
        local = ("-" if r["local_accuracy_mean"] is None else
                 f"{r['local_accuracy_mean']:.3f}/{r['local_accuracy_min']:.3f}/{r['local_accuracy_max']:.3f}")
        table.add_row(str(r["round"]), f"{r['accuracy']:.4f}", f"{r['loss']:.4f}", local,
                      f"{r['bytes_up']:,}", f"{r['bytes_down']:,}", f"{r['wall_seconds']:.1f}")
    console.print(table)
    console.print(
        f"final accuracy {summary['final_accuracy']:.4f} (best {summary['best_accuracy']:.4f}); "
        f"upload per client-round {summary['bytes_up_per_client_round']:,.0f} B = "
        f"{summary['upload_ratio_vs_full']:.3e} x full fine-tuning ({summary['full_model_bytes_fp32']:,} B); "
        f"trainable params {summary['trainable_params']:,}; {summary['wall_seconds']:.0f} s")
    console.print(f"run directory: {out_dir}", highlight=False)
    if (out_dir / "report.html").exists():
        console.print(f"report: {out_dir / 'report.html'}", highlight=False)


def _list(title: str, rows: list[tuple[str, str]]) -> None:
    table = Table(title=title)
    table.add_column("name")
    table.add_column("description")
    for n, d in rows:
        table.add_row(n, d)
    console.print(table)


_CLIENT = typer.Option(help="client K's personalised adapter (methods with private tensors, e.g. FedPepTAO, "
                            "FedSA-LoRA): its id, or its name with natural clients (partition by_column)")
_BEST = typer.Option("--best", help="the checkpoint of the best round on the validation split "
                                    "(evaluation.keep_best) instead of the last")


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="a finished (or checkpointed) run directory")],
    out: Annotated[Path, typer.Argument(help="output folder")],
    format: Annotated[str, typer.Option(help="peft: a Hugging Face PEFT adapter directory")] = "peft",
    best: Annotated[bool, _BEST] = False,
    client: Annotated[Optional[str], _CLIENT] = None,
) -> None:
    """Export a run's global adapter (or client K's personalised one) as a PEFT adapter directory
    (PeftModel.from_pretrained(base, OUT) loads it), with the task's classes, readout and templates beside it
    (fedpeft_task.json)."""
    from fedpeft.config import ConfigError
    from fedpeft.export import export_peft
    from fedpeft.outputs import check_output_dir, os_error_line

    if format != "peft":
        _fail(f"--format: unknown '{format}'; allowed: peft")
    try:
        check_output_dir(out, "OUT")
        path, note = export_peft(run_dir, out, best=best, client=client)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        _fail(str(e))
    except OSError as e:
        _fail(os_error_line(e))
    Console(stderr=True).print(note, highlight=False, markup=False)
    console.print(f"wrote {path}", highlight=False)


def _open_model(run_dir: Path, client: Optional[str], best: bool):
    from fedpeft.predict import open_model

    _setup_logging(False)
    model = open_model(run_dir, client, best)
    Console(stderr=True).print(f"predicting with {model.describe()}", highlight=False, markup=False)
    return model


@app.command()
def predict(
    run_dir: Annotated[Path, typer.Argument(help="a finished (or checkpointed) run directory")],
    text: Annotated[list[str], typer.Option("--text", help="a text to classify (repeatable)")] = [],
    file: Annotated[Optional[Path], typer.Option("--file", help="texts: a .csv/.tsv/.jsonl/.parquet file with the "
                                                 "run's text column (or 'text'), or one text per line")] = None,
    client: Annotated[Optional[str], _CLIENT] = None,
    out: Annotated[Optional[Path], typer.Option(help="write OUT.csv or OUT.jsonl (the input's columns, then "
                                                     "'prediction' and one 'p(<class>)' per class) instead of a "
                                                     "table")] = None,
    best: Annotated[bool, _BEST] = False,
) -> None:
    """Labels and class probabilities from a run's global adapter (or client K's personalised one); says which
    round's adapter it is."""
    from rich.markup import escape

    from fedpeft.outputs import check_output_file, os_error_line
    from fedpeft.prediction_files import (OUTPUT_SUFFIXES, prediction_rows, read_inputs, texts_only, write_rows)

    if out is not None and out.suffix.lower() not in OUTPUT_SUFFIXES:
        _fail(f"--out: '{out.name}' must end in .csv or .jsonl")
    if not text and file is None:
        _fail("no texts to classify: give --text or --file")
    try:
        if out is not None:
            check_output_file(out, "--out")
        model = _open_model(run_dir, client, best)
        inputs = [texts_only(text)] if text else []
        if file is not None:
            inputs.append(read_inputs(file, model.cfg.task))
        rows = []
        for part in inputs:
            probs = model.probabilities(part.examples(model.classifier.task.is_pair))
            rows += prediction_rows(part, model.class_names, probs.argmax(-1).tolist(), probs.tolist())
        if out is not None:
            write_rows(rows, out)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    except OSError as e:
        _fail(os_error_line(e))
    if out is not None:
        console.print(f"wrote {out} ({len(rows)} texts)", highlight=False)
        return
    table = Table(title=f"{run_dir}" + (f", client {client}" if client is not None else ""))
    columns = list(dict.fromkeys(k for r in rows for k in r))
    for col in columns:
        table.add_column(col, justify="right" if isinstance(rows[0].get(col), float) else "left")
    for r in rows:
        table.add_row(*(f"{r[c]:.3f}" if isinstance(r.get(c), float) else escape(str(r.get(c, ""))) for c in columns))
    console.print(table)


@app.command()
def generate(
    run_dir: Annotated[Path, typer.Argument(help="a generation run's directory (finished or checkpointed)")],
    prompt: Annotated[list[str], typer.Option("--prompt", help="an instruction to complete (repeatable)")] = [],
    file: Annotated[Optional[Path], typer.Option("--file", help="instructions, one per line")] = None,
    client: Annotated[Optional[str], _CLIENT] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(min=1, help="most tokens per completion (default: the "
                                                                      "run's evaluation.max_new_tokens)")] = None,
    best: Annotated[bool, _BEST] = False,
) -> None:
    """Greedy completions from a generation run's global adapter (or client K's personalised one), with the
    prompt format the run trained with (the model's chat template, or task.prompt_template)."""
    from rich.markup import escape

    from fedpeft.outputs import os_error_line

    prompts = list(prompt)
    try:
        if file is not None:
            prompts += [line.rstrip("\n") for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not prompts:
            _fail("no prompts: give --prompt or --file")
        model = _open_model(run_dir, client, best)
        for text, completion in zip(prompts, model.generate(prompts, max_new_tokens)):
            console.print(f"[bold]> {escape(text)}[/bold]")
            console.print(completion, highlight=False, markup=False)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    except OSError as e:
        _fail(os_error_line(e))


@app.command()
def evaluate(
    run_dir: Annotated[Path, typer.Argument(help="a finished (or checkpointed) run directory")],
    file: Annotated[Path, typer.Option("--file", help="a labelled .csv/.tsv/.jsonl/.parquet file with the run's "
                                       "text and label columns; labels are class names or class indices")],
    client: Annotated[Optional[str], _CLIENT] = None,
    out: Annotated[Optional[Path], typer.Option(help="also write the metrics as JSON")] = None,
    best: Annotated[bool, _BEST] = False,
) -> None:
    """Score a labelled file: accuracy, macro-F1, per-class precision/recall/F1 and the confusion matrix."""
    from fedpeft.metrics import confusion, table as metrics_table
    from fedpeft.outputs import check_output_file, os_error_line
    from fedpeft.prediction_files import label_indices, read_inputs

    try:
        if out is not None:
            check_output_file(out, "--out")
        model = _open_model(run_dir, client, best)
        inputs = read_inputs(file, model.cfg.task, labelled=True)
        labels = label_indices(inputs, model.class_names)
        preds = model.probabilities(inputs.examples(model.classifier.task.is_pair)).argmax(-1).tolist()
        result = metrics_table(confusion(labels, preds, len(model.class_names)), model.class_names)
        result |= {"file": str(file), "adapter": model.describe()}
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    except OSError as e:
        _fail(os_error_line(e))
    print_class_table(result, model.class_names, f"{file}: {result['num_examples']:,} examples")
    if out is not None:
        console.print(f"wrote {out}", highlight=False)


def print_class_table(result: dict, class_names: list[str], title: str) -> None:
    """Accuracy and macro-F1, the per-class table and the confusion matrix (rows true, columns predicted)."""
    table = Table(title=title)
    for col in ("class", "precision", "recall", "F1", "support"):
        table.add_column(col, justify="left" if col == "class" else "right")
    for name, m in result["per_class"].items():
        table.add_row(name, f"{m['precision']:.3f}", f"{m['recall']:.3f}", f"{m['f1']:.3f}", f"{m['support']:,}")
    console.print(table)
    cm = Table(title="confusion matrix (rows: true class, columns: predicted)")
    cm.add_column("")
    for name in class_names:
        cm.add_column(name, justify="right")
    for name, row in zip(class_names, result["confusion"]):
        cm.add_row(name, *(f"{v:,}" for v in row))
    console.print(cm)
    f1 = result["macro_f1"]
    console.print(f"accuracy {result['accuracy']:.4f}, macro-F1 " + ("–" if f1 is None else f"{f1:.4f}"),
                  highlight=False)


@app.command()
def methods() -> None:
    """List method presets."""
    from fedpeft.methods import PRESETS

    _list("methods", [(e.name, e.obj.description) for e in PRESETS.entries()])


@app.command()
def components() -> None:
    """List the components of every axis (method.adapter, trainer, aggregator, selector, sharing, ...), the
    objectives (by task kind) and the classification readouts (model.readout)."""
    from fedpeft.components import AXIS_REGISTRIES, LIST_REGISTRIES
    from fedpeft.model import OBJECTIVES
    from fedpeft.model.readouts import READOUTS

    rows = [(f"method.{axis}: {e.name}", e.description)
            for axis, reg in (AXIS_REGISTRIES | LIST_REGISTRIES).items() for e in reg.entries()]
    rows += [(f"objective (task kind): {e.name}", e.description) for e in OBJECTIVES.entries()]
    rows += [(f"model.readout: {e.name}", e.description) for e in READOUTS.entries()]
    _list("components", rows)


@app.command()
def tasks() -> None:
    """List tasks (plus hf:<dataset> for users with a network)."""
    from fedpeft.data import TASKS

    _list("tasks", [(e.name, e.description) for e in TASKS.entries()]
          + [("hf:<name>[:<config>]", "any Hugging Face dataset (needs a network)")])


@app.command()
def models() -> None:
    """List built-in backbones (any Hugging Face id or local path also works)."""
    from fedpeft.backbones import BACKBONES

    _list("models", [(e.name, e.description) for e in BACKBONES.entries()]
          + [("<hf id or path>", "any Hugging Face encoder, masked LM or causal LM")])


def _report(run_dirs: list[Path], out: Optional[Path], target: Optional[float]) -> None:
    from fedpeft.outputs import check_output_file, os_error_line
    from fedpeft.report import report_path, write_report

    try:
        path = check_output_file(report_path(run_dirs, out), "--out")
        write_report(run_dirs, path, target)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    except OSError as e:
        _fail(os_error_line(e))
    console.print(f"wrote {path}", highlight=False)


_RUN_DIRS = typer.Argument(help="run directories (a folder holding run directories stands for all of them)")
_REPORT_OUT = typer.Option(help="output HTML (default: RUN_DIR/report.html for one run, ./report.html for several)")
_TARGET = typer.Option(help="accuracy for 'bytes up to reach' (default: 95 % of the best final accuracy)")


@app.command()
def report(
    run_dirs: Annotated[list[Path], _RUN_DIRS],
    out: Annotated[Optional[Path], _REPORT_OUT] = None,
    target: Annotated[Optional[float], _TARGET] = None,
) -> None:
    """Write a self-contained report.html (SVG plots, config and summary tables) of one or several runs."""
    _report(run_dirs, out, target)


@app.command()
def compare(
    run_dirs: Annotated[list[Path], _RUN_DIRS],
    out: Annotated[Optional[Path], _REPORT_OUT] = None,
    target: Annotated[Optional[float], _TARGET] = None,
) -> None:
    """Overlay several runs in one report.html; runs differing only in seed/name are shown as mean ± std."""
    _report(run_dirs, out, target)


flower_app = typer.Typer(no_args_is_help=True, help="Run on Flower: a SuperLink, SuperNodes owning partitions, runs.")
app.add_typer(flower_app, name="flower")


_INSECURE = typer.Option("--insecure", help="no TLS: traffic in plain text (trusted networks only; explicit on purpose)")
_ROOT_CERT = typer.Option(help="CA certificate that signed the SuperLink's (from `fedpeft flower certs`): TLS")


def _exec(cmd: list[str]) -> None:
    import os

    from fedpeft.runtime.flower.local import flower_env

    console.print(" ".join(cmd))
    os.execve(cmd[0], cmd, flower_env())


def _need_tls_or_insecure(tls: bool, insecure: bool, what: str) -> None:
    """Exactly one of TLS and --insecure: plain text is never a default."""
    if tls == insecure:
        files = "--ssl-certfile, --ssl-keyfile, --ssl-ca-certfile" if what == "superlink" else "--root-certificates"
        _fail(f"{what}: give the TLS files ({files}) or --insecure, not both and not neither")


@flower_app.command("superlink")
def flower_superlink(
    host: Annotated[str, typer.Option(help="address to bind (0.0.0.0 to accept other machines)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="one port for Flower's Fleet, Control and Runtime APIs")] = 9093,
    ssl_certfile: Annotated[Optional[Path], typer.Option(help="the SuperLink's TLS certificate (server.pem)")] = None,
    ssl_keyfile: Annotated[Optional[Path], typer.Option(help="its private key (server.key)")] = None,
    ssl_ca_certfile: Annotated[Optional[Path], typer.Option(help="the CA certificate that signed it (ca.crt)")] = None,
    enable_supernode_auth: Annotated[bool, typer.Option(
        "--enable-supernode-auth", help="admit only SuperNodes registered with `fedpeft flower register`")] = False,
    insecure: Annotated[bool, _INSECURE] = False,
) -> None:
    """Start a Flower SuperLink in the foreground: TLS with the three files, or --insecure."""
    from fedpeft.runtime.flower.local import superlink_cmd
    from fedpeft.runtime.flower.security import Certificates

    files = (ssl_ca_certfile, ssl_certfile, ssl_keyfile)
    if any(files) and not all(files):
        _fail("superlink: TLS needs all of --ssl-certfile, --ssl-keyfile and --ssl-ca-certfile")
    _need_tls_or_insecure(all(files), insecure, "superlink")
    missing = [str(f) for f in files if f is not None and not f.is_file()]
    if missing:
        _fail(f"superlink: no such file {', '.join(missing)}")
    _exec(superlink_cmd(host, port, Certificates(*files) if all(files) else None, enable_supernode_auth))


@flower_app.command("supernode")
def flower_supernode(
    superlink: Annotated[str, typer.Option(help="SuperLink address host:port")],
    partitions: Annotated[str, typer.Option(help="fedpeft client ids this node owns, e.g. 0,1")],
    state_dir: Annotated[Path, typer.Option(help="where this node keeps its clients' persistent state")],
    data_dir: Annotated[Optional[Path], typer.Option(help="folder holding the task data (FEDPEFT_DATA_DIR)")] = None,
    port: Annotated[int, typer.Option(help="this node's local ClientApp runtime API port")] = 9094,
    root_certificates: Annotated[Optional[Path], _ROOT_CERT] = None,
    auth_key: Annotated[Optional[Path], typer.Option(help="this node's private key (`fedpeft flower node-key`), "
                                                          "for a SuperLink with --enable-supernode-auth")] = None,
    insecure: Annotated[bool, _INSECURE] = False,
    worker: Annotated[bool, typer.Option(help="keep the model in one long-lived worker process per node (one "
                                              "backbone load per run) rather than loading it for every message")] = True,
) -> None:
    """Start a Flower SuperNode owning some fedpeft clients, in the foreground: TLS with --root-certificates, or
    --insecure."""
    from fedpeft.runtime.flower.local import supernode_cmd

    _need_tls_or_insecure(root_certificates is not None, insecure, "supernode")
    missing = [str(f) for f in (root_certificates, auth_key) if f is not None and not f.is_file()]
    if missing:
        _fail(f"supernode: no such file {', '.join(missing)}")
    ids = [int(x) for x in partitions.split(",") if x.strip()]
    _exec(supernode_cmd(superlink, ids, port, "127.0.0.1", state_dir, data_dir, root_certificates, auth_key,
                        worker))


@flower_app.command("certs")
def flower_certs(
    out: Annotated[Path, typer.Option(help="folder for ca.crt, server.pem, server.key")],
    host: Annotated[list[str], typer.Option(help="the SuperLink's address as the nodes reach it (repeatable)")] = [
        "127.0.0.1", "localhost"],
) -> None:
    """Make a CA and a SuperLink TLS certificate signed by it (give ca.crt to every SuperNode)."""
    from fedpeft.runtime.flower.security import make_certificates

    c = make_certificates(out, tuple(host))
    console.print(f"CA {c.ca_cert}\nSuperLink certificate {c.server_cert} (for {', '.join(host)})\nkey {c.server_key}")


@flower_app.command("node-key")
def flower_node_key(
    out: Annotated[Path, typer.Option(help="folder for the key pair")],
    name: Annotated[str, typer.Option(help="file name of the private key (the public one gets .pub)")],
) -> None:
    """Make a SuperNode's authentication key pair (EC P-384, OpenSSH format)."""
    from fedpeft.runtime.flower.security import make_node_key

    k = make_node_key(out, name)
    console.print(f"private {k.private} (keep on the node)\npublic {k.public} (register it)")


@flower_app.command("register")
def flower_register(
    public_key: Annotated[Path, typer.Argument(help="a SuperNode's public key (.pub)")],
    superlink: Annotated[str, typer.Option(help="SuperLink address host:port")] = "127.0.0.1:9093",
    root_certificates: Annotated[Optional[Path], _ROOT_CERT] = None,
    insecure: Annotated[bool, _INSECURE] = False,
) -> None:
    """Register a SuperNode's public key with a SuperLink started with --enable-supernode-auth."""
    import tempfile

    from fedpeft.runtime.flower.local import register_node

    _need_tls_or_insecure(root_certificates is not None, insecure, "register")
    with tempfile.TemporaryDirectory() as home:
        try:
            console.print(register_node(public_key, superlink, Path(home), root_certificates))
        except RuntimeError as e:
            _fail(str(e))


@flower_app.command("run")
def flower_run(
    config: Annotated[Optional[Path], typer.Argument(help="experiment YAML (omit to use the defaults)")] = None,
    superlink: Annotated[str, typer.Option(help="SuperLink address host:port")] = "127.0.0.1:9093",
    set_: Annotated[list[str], typer.Option("--set", help="override a key, e.g. federation.rounds=2")] = [],
    out: Annotated[Optional[Path], typer.Option(help="run directory on the SuperLink machine")] = None,
    resume: Annotated[bool, typer.Option(help="continue from the last checkpoint in --out")] = False,
    round_timeout: Annotated[float, typer.Option(help="seconds to wait for a round's replies (0: "
                                                      "federation.round_timeout, unset there: no limit)")] = 0.0,
    rejoin_wait: Annotated[float, typer.Option(help="seconds a round waits for missing clients' nodes")] = 0.0,
    root_certificates: Annotated[Optional[Path], _ROOT_CERT] = None,
    insecure: Annotated[bool, _INSECURE] = False,
) -> None:
    """Submit an experiment to a SuperLink with `flwr run` and wait for it (runtime.name=flower): TLS with
    --root-certificates, or --insecure."""
    from fedpeft.config import ConfigError
    from fedpeft.outputs import check_output_dir, os_error_line
    from fedpeft.resolve import load_config
    from fedpeft.runtime.flower.deployment import run_flower

    try:
        cfg = load_config(config, list(set_) + ["runtime.name=flower"])
    except ConfigError as e:
        _fail(str(e))
    for note in cfg.notes:
        _warn(note)
    out_dir = out or Path("runs") / (cfg.name or cfg.default_name())
    try:
        check_output_dir(out_dir, "--out")
        summary = run_flower(cfg, out_dir, resume=resume, superlink=superlink, round_timeout=round_timeout or None,
                             rejoin_wait=rejoin_wait, root_cert=root_certificates, insecure=insecure)
    except (FileExistsError, FileNotFoundError, RuntimeError, ValueError) as e:
        _fail(str(e))
    except OSError as e:
        _fail(os_error_line(e))
    _print_table(out_dir, summary)


def main() -> None:  # console-script entry point
    app()


if __name__ == "__main__":
    sys.exit(main())
