"""The server-side round loop shared by every runtime: resume, rounds, records, checkpoints, summary.

A runtime only supplies a ``Transport`` that delivers encoded instructions to clients and hands
back what came back (reply bytes, or the exception that stood in for a reply). Everything that
decides the numbers (selection, aggregation, global evaluation, byte accounting, checkpointing)
lives here and in ``RoundDriver``, so the embedded and Flower runtimes cannot drift apart.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
import yaml

from fedpeft.comm.codec import Message
from fedpeft.config import ExperimentConfig, dump_config
from fedpeft.experiment import Experiment
from fedpeft.methods.base import Method
from fedpeft.resolve import resolve
from fedpeft.runtime.server import RoundDriver, RoundFailed
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import build_summary, round_record

log = logging.getLogger("fedpeft")

Results = dict[int, "bytes | BaseException"]


class StopAfterRound(Exception):
    """Raised by ``stop_after_round`` to simulate a crash right after a checkpoint."""


class Transport(Protocol):
    """How a runtime moves encoded messages between the server and the clients."""

    def train(self, round: int, instructions: dict[int, bytes]) -> dict[int, bytes | BaseException]: ...

    def evaluate(self, round: int, instructions: dict[int, bytes]) -> dict[int, bytes | BaseException]: ...

    def client_states(self) -> dict[int, Message]:
        """Client states the server checkpoints (empty when they live on the clients)."""
        ...

    def restore(self, client_states: dict[int, Message], last_round: int) -> None:
        """Called on resume with the checkpointed client states and round."""
        ...

    def checkpointed(self, round: int) -> None:
        """Called after the checkpoint of ``round`` is on disk."""
        ...

    def round_extra(self) -> dict[str, Any]:
        """Runtime-specific fields appended to this round's metrics record."""
        ...

    def summary_extra(self) -> dict[str, Any]:
        """Runtime-specific fields added to summary.json."""
        ...


@contextlib.contextmanager
def open_run(cfg: ExperimentConfig, out_dir: str | Path, resume: bool) -> Iterator[RunDir]:
    """Lock the run directory for this process, create it (or check it, on resume) and write config.yaml."""
    run = RunDir(out_dir)
    run.lock()
    try:
        config_yaml = dump_config(cfg)
        if resume and run.saved_config() not in (None, config_yaml) and not same_config(run.saved_config(), cfg):
            raise ValueError(f"{out_dir}/config.yaml differs from the config given to --resume")
        run.prepare(config_yaml, resume)
        yield run
    finally:
        run.unlock()


def same_config(saved: str, cfg: ExperimentConfig) -> bool:
    """Whether a run's saved config.yaml describes ``cfg``. One written before keys were added (with their
    defaults; component settings too, so it is resolved as a new config is) still matches; so does one that differs
    only in ``evaluation.report``, which changes no number."""
    try:
        old = resolve(yaml.safe_load(saved))
    except Exception:  # noqa: BLE001 - unreadable or no longer valid: it differs
        return False
    old = old.model_copy(update={"evaluation": old.evaluation.model_copy(update={"report": cfg.evaluation.report})})
    return dump_config(old) == dump_config(cfg)


@contextlib.contextmanager
def log_to(path: Path) -> Iterator[None]:
    """Copy the ``fedpeft`` logger (INFO and up) into ``path`` for the duration of the run."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("fedpeft")
    root.addHandler(handler)
    old = root.level
    root.setLevel(min(old, logging.INFO) if old else logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
        handler.close()


def progress(enabled: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), disable=not enabled, transient=False)


def run_rounds(cfg: ExperimentConfig, run: RunDir, exp: Experiment, method: Method, transport: Transport,
               resume: bool, stop_after_round: int | None = None, bar: Progress | None = None) -> dict[str, Any]:
    """Resume if asked, run the remaining rounds through ``transport``, write metrics/checkpoints/summary."""
    driver = RoundDriver(cfg, method)
    checksum = exp.backbone.checksum()
    start, state = 1, method.server_init()
    ckpt = run.load_checkpoint() if resume else None
    if ckpt is not None:
        last, state, client_state, _ = ckpt
        records = run.truncate_metrics(last)
        start = last + 1
        transport.restore(client_state, last)
        log.info("resuming after round %d", last)
    else:
        records = run.truncate_metrics(0) if resume else []
        log.info("label histogram per client (train): %s", exp.label_histograms()["train"])
    trainable = method.trainable_params(state)
    bar = bar or progress(False)
    rounds_task = bar.add_task("rounds", total=cfg.federation.rounds, completed=start - 1)

    def evaluate(rnd: int) -> tuple[dict[str, Any], dict[int, dict[str, Any]], int]:
        """Global metrics, each client's local metrics (when asked) and the evaluation bytes sent down.

        Evaluation done once (``evaluation.reuse_global``): where every client would score exactly the global
        tensors, its local metrics come from the global test predictions (``RoundDriver.evaluate_once``) and no
        evaluate message is sent, in every runtime (the server holds the test set and every client's shard of it,
        both derived from the config). The evaluation bytes are still those of the federated evaluation it stands
        for: each client's encoded evaluate instruction down, and up the encoded reply with the metrics it is
        credited with; so the embedded and Flower runtimes count the same."""
        if not cfg.evaluation.local:
            return method.evaluate_global(state), {}, 0
        eval_msgs = driver.plan_evaluate(state, rnd)
        eval_down = sum(len(b) for b in eval_msgs.values())
        once = driver.evaluate_once(state, rnd, sorted(eval_msgs)) if cfg.evaluation.reuse_global else None
        if once is not None:
            return once[0], once[1], eval_down
        return method.evaluate_global(state), driver.finish_evaluate(rnd, transport.evaluate(rnd, eval_msgs)), eval_down

    def score(rnd: int, clients: list[dict[str, Any]], t0: float, scored: bool = True,
              failed: str | None = None) -> dict[str, Any]:
        """Evaluate ``state`` (globally, and on the clients when asked), append the round's record (with
        ``round_failed``, the reason, for a round that was skipped)."""
        global_metrics, local_eval, eval_down = evaluate(rnd) if scored else ({"accuracy": None, "loss": None}, {}, 0)
        rec = round_record(rnd, global_metrics, clients, local_eval, eval_down, time.perf_counter() - t0,
                           exp.non_participants)
        if failed is not None:
            rec["round_failed"] = failed
        rec.update(transport.round_extra())
        rec["server"] = method.diagnostics(state)
        vectors = method.vectors(state) if hasattr(method, "vectors") else {}
        if vectors:  # only methods that report some (the records of the others are unchanged)
            rec["server_vectors"] = vectors
        records.append(rec)
        run.append_metrics(rec)
        return rec

    if start == 1 and cfg.evaluation.round_zero and not any(r["round"] == 0 for r in records):
        rec = score(0, [], time.perf_counter())  # the initial global state, before any training
        log.info("round 0 (initial state): accuracy %s loss %s", _fmt(rec["accuracy"]), _fmt(rec["loss"]))

    for rnd in range(start, cfg.federation.rounds + 1):
        t0 = time.perf_counter()
        plan = driver.plan_round(state, rnd)
        results = transport.train(rnd, plan.instructions)
        try:
            state, clients = driver.finish_round(state, plan, results)
            failed = None
        except RoundFailed as e:  # nothing was applied: the server state is that of the round before
            if cfg.federation.on_round_failure == "stop":
                raise
            log.warning("%s: round skipped, server state unchanged (federation.on_round_failure=skip)", e)
            clients, failed = e.records, str(e)
        rec = score(rnd, clients, t0, rnd % cfg.evaluation.every == 0 or rnd == cfg.federation.rounds, failed)
        if rnd % cfg.runtime.checkpoint_every == 0 or rnd == cfg.federation.rounds:
            run.save_checkpoint(rnd, state, transport.client_states())
            transport.checkpointed(rnd)
        log.info("round %d: accuracy %s loss %s up %d B down %d B (%.1fs)", rnd, _fmt(rec["accuracy"]),
                 _fmt(rec["loss"]), rec["bytes_up"], rec["bytes_down"], rec["wall_seconds"])
        bar.advance(rounds_task)
        if stop_after_round is not None and rnd >= stop_after_round and rnd < cfg.federation.rounds:
            raise StopAfterRound(f"stopped after round {rnd}")

    unchanged = exp.backbone.checksum() == checksum
    if not unchanged:  # would mean a method wrote into the shared frozen model
        log.error("backbone weights changed during the run")
    summary = build_summary(cfg, records, trainable, exp.backbone.num_parameters, {
        "backbone_unchanged": unchanged,
        "failed_rounds": [r["round"] for r in records if "round_failed" in r],
        "label_histograms": exp.label_histograms(),  # per client, train and test (majority baselines)
        **payload_split(method, state, driver),
        **transport.summary_extra(),
    })
    run.write_summary(summary)
    if cfg.evaluation.report:
        write_report_or_warn(run.root)
    return summary


def write_report_or_warn(root: Path) -> None:
    """report.html next to the summary; a report that fails to render never fails the run."""
    try:
        from fedpeft.report import write_report

        write_report([root], root / "report.html")
    except Exception as e:  # noqa: BLE001 - any rendering problem only costs the report
        log.warning("could not write %s: %s: %s", root / "report.html", type(e).__name__, e)


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def payload_split(method: Method, state: Message, driver: RoundDriver) -> dict[str, int]:
    """Tensor bytes of one upload in the wire dtype (what the papers count); the rest is framing. Replies whose
    size varies per client (head pruning) count the mean over the last round's accepted replies."""
    schema = method.reply_schema(state)
    if any(d is None for shape in schema.tensors.values() for d in shape) and driver.last_tensor_bytes is not None:
        return {"upload_tensor_bytes": round(driver.last_tensor_bytes)}
    sizes = {k: tuple(d or 0 for d in shape) for k, shape in schema.tensors.items()}
    return {"upload_tensor_bytes": sum(math.prod(sh) * schema.dtype_of(k).itemsize for k, sh in sizes.items())}
