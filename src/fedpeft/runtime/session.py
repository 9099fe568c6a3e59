"""The server-side round loop shared by every runtime: resume, rounds, records, checkpoints, summary.

A runtime only supplies a ``Transport`` that delivers encoded instructions to clients and hands
back what came back (reply bytes, or the exception that stood in for a reply). Everything that
decides the numbers (selection, aggregation, global evaluation, byte accounting, checkpointing)
lives here and in ``RoundDriver``, so the embedded and Flower runtimes cannot drift apart.

Long on purpose: resume, scoring, checkpoints and the summary are one loop for every runtime.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedpeft.comm.codec import Message
from fedpeft.build import RunPlan
from fedpeft.config import read_yaml
from fedpeft.data.fingerprint import data_changes
from fedpeft.experiment import Experiment
from fedpeft.methods.base import Method
from fedpeft.methods.state import ServerState
from fedpeft.resolve import resolve
from fedpeft.runtime.server import RoundDriver, RoundFailed
from fedpeft.runtime.suites import check_suites, score_suites
from fedpeft.tracking.rundir import CheckpointError, RunDir
from fedpeft.tracking.summary import build_summary, round_record, validation_score
from fedpeft.tracking.tracker import Tracker, check_sinks

log = logging.getLogger("fedpeft")

Results = dict[int, "bytes | BaseException"]


class StopAfterRound(Exception):
    """Raised by ``stop_after_round`` to simulate a crash right after a checkpoint."""


class Transport(Protocol):
    """How a runtime moves encoded messages between the server and the clients."""

    def train(self, round: int, instructions: dict[int, bytes]) -> dict[int, bytes | BaseException]: ...

    def evaluate(self, round: int, instructions: dict[int, bytes]) -> dict[int, bytes | BaseException]: ...

    def train_secure(self, round: int, instructions: dict[int, bytes]) -> Any:
        """The round under secure aggregation (``runtime.secure.protocol.SecureOutcome``: the survivors' weighted
        mean, their clear scalars, each client's protocol bytes)."""
        ...

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


class NoRunError(FileNotFoundError):
    """``--resume`` names a directory that holds no run."""


@contextlib.contextmanager
def open_run(plan: RunPlan, out_dir: str | Path, resume: bool) -> Iterator[RunDir]:
    """Lock the run directory for this process and check it: a new run must not overwrite one; on resume the
    config must describe the run (``config_changes``), where the one change allowed is a larger
    ``federation.rounds``, which extends the run (finished or not) to that many rounds. Nothing is written here:
    ``run_rounds`` writes config.yaml once the data are checked too (``commit_config``)."""
    run = RunDir(out_dir)
    if resume and run.saved_config() is None:
        raise NoRunError(f"--resume: {out_dir} holds no run (no config.yaml); check the path, or drop --resume to "
                         "start a new run there")
    check_sinks(list(plan.tracking))
    before = set(run.root.iterdir()) if run.root.is_dir() else None
    run.lock()
    started = False
    try:
        saved = run.saved_config()
        if not resume:
            run.check_free()
        elif saved != plan.config_yaml:
            check_resumable(out_dir, config_changes(saved, plan))
        yield run
        started = True
    finally:
        run.unlock()
        if not started and run.saved_config() is None:
            _leave_as_found(run.root, before)


def _leave_as_found(root: Path, before: set[Path] | None) -> None:
    """A run refused before it wrote its config (bad data, a bad setting found while building) leaves the
    directory as it found it: the lock, the log and anything else it made are removed, and the directory itself
    when it made it."""
    import shutil

    for path in set(root.iterdir()) - (before or set()):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    if before is None:
        with contextlib.suppress(OSError):
            root.rmdir()


def commit_config(run: RunDir, plan: RunPlan) -> None:
    """Write config.yaml, with the data paths made absolute so that the run can be resumed from any folder. A run
    extended past its end (``federation.rounds`` grew) is unfinished again: its summary.json goes until the new
    last round writes one."""
    saved = run.saved_config()
    if saved is not None and saved != plan.config_yaml and config_changes(saved, plan):
        run.unfinish()
    run.write_config(plan.config_yaml)


# keys that change no number: a resumed run may differ from its config.yaml in them
NUMBERLESS = ("evaluation.report", "runtime.progress", "tracking")
# keys that do nothing outside a generation task (classification runs saved when their default was another)
GENERATION_ONLY = ("evaluation.generate_every",)


def config_changes(saved: str, plan: RunPlan) -> list[tuple[str, Any, Any]]:
    """``(dotted key, saved value, given value)`` for every key where a run's saved config.yaml and the config of
    ``plan`` differ, the keys of ``NUMBERLESS`` aside. A config.yaml written before keys were added is resolved as a
    new config is, so the added keys take their defaults and do not count as changes."""
    try:
        old = resolve(read_yaml(saved)).with_absolute_paths()
    except Exception as e:  # noqa: BLE001 - unreadable or no longer valid: say so as the one difference
        return [("config.yaml", f"unreadable ({type(e).__name__}: {str(e).splitlines()[0]})", "a valid config")]
    a, b = _flat(old.model_dump(mode="json")), _flat(plan.config)  # what config.yaml holds
    moot = () if plan.generation else GENERATION_ONLY
    return [(k, a.get(k), b.get(k)) for k in dict.fromkeys([*a, *b])
            if k not in NUMBERLESS and k not in moot and a.get(k) != b.get(k)]


def check_resumable(out_dir: str | Path, changes: list[tuple[str, Any, Any]]) -> None:
    """ValueError naming each changed key and its two values, unless the only change is a larger
    ``federation.rounds`` (extending the run)."""
    rounds = [c for c in changes if c[0] == "federation.rounds"]
    others = [c for c in changes if c[0] != "federation.rounds"]
    if others:
        listed = "; ".join(f"{k}: {old!r} in the run, {new!r} given" for k, old, new in others)
        raise ValueError(f"{out_dir}/config.yaml differs from the config given to --resume ({listed}); a resumed "
                         "run keeps its config (only federation.rounds may grow, to extend it): drop the changes "
                         "or start a new run with another --out")
    if rounds and rounds[0][2] < rounds[0][1]:
        raise ValueError(f"federation.rounds: {rounds[0][2]} given to --resume, but the run has {rounds[0][1]}; a "
                         "run can be extended, not shortened")


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        return {k: v for key, val in d.items() for k, v in _flat(val, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): d}


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


def run_rounds(plan: RunPlan, run: RunDir, exp: Experiment, method: Method, transport: Transport,
               resume: bool, stop_after_round: int | None = None, bar: Progress | None = None,
               threads: int | None = None) -> dict[str, Any]:
    """Resume if asked, run the remaining rounds through ``transport``, write metrics/checkpoints/summary, and send
    every record to the tracking sinks (``tracking``). ``threads``: the run's torch thread count
    (``runtime.threads``), recorded in every checkpoint and in summary.json; default: this process's."""
    tracker = Tracker(list(plan.tracking), run.root, plan.name or run.root.name, plan.config)
    try:
        return _run_rounds(plan, run, exp, method, transport, resume, stop_after_round, bar, tracker,
                           threads or torch.get_num_threads())
    finally:
        tracker.close()


def _run_rounds(plan: RunPlan, run: RunDir, exp: Experiment, method: Method, transport: Transport,
                resume: bool, stop_after_round: int | None, bar: Progress | None, tracker: Tracker,
                threads: int) -> dict[str, Any]:
    fed, evaluation = plan.federation, plan.evaluation
    driver = RoundDriver(fed, method, exp.client_label, exp.client_weights())
    check_suites(evaluation.suites, exp.task.kind)
    check_suites(evaluation.round_suites, exp.task.kind, "round_suites")
    checksum = exp.backbone.checksum()
    run_id = keep_record(run, exp, resume, plan)
    commit_config(run, plan)
    start, state = 1, method.server_init()
    ckpt = run.load_checkpoint() if resume else None
    kept_round = 0  # the round of the checkpoint a damaged newer one would fall back to (``checkpoint-prev/``)
    if ckpt is not None:
        last, state, client_state, meta = ckpt
        if meta.get("run_id", run_id) != run_id:
            raise CheckpointError(f"{run.ckpt} belongs to run {meta['run_id']}, not to this directory's run "
                                  f"{run_id} (model.json): it was copied from another run")
        records = run.truncate_metrics(last)
        done = {r["round"] for r in records}
        lost = [r for r in range(1, last + 1) if r not in done]
        if lost:
            raise CheckpointError(f"{run.metrics_path} has no record of rounds {_rounds(lost)} that the checkpoint "
                                  f"(round {last}) follows: the records cannot be rebuilt; restore the file, or start "
                                  "the run anew in another --out")
        start, kept_round = last + 1, last
        transport.restore(client_state, last)
        log.info("resuming after round %d", last)
    else:
        records = run.truncate_metrics(0) if resume else []
        for line in exp.describe_clients():
            log.info("%s", line)
    tracker.rounds(records)  # what a sink missed before a resume (or was added at one)
    trainable = method.trainable_params(state)
    bar = bar or progress(False)
    rounds_task = bar.add_task("rounds", total=fed.rounds, completed=start - 1)

    def evaluate(rnd: int) -> tuple[dict[str, Any], dict[int, dict[str, Any]], int]:
        """Global metrics, each client's local metrics (when asked) and the evaluation bytes sent down.

        Evaluation done once (``evaluation.reuse_global``): where every client would score exactly the global
        tensors, its local metrics come from the global test predictions (``RoundDriver.evaluate_once``) and no
        evaluate message is sent, in every runtime (the server holds the test set and every client's shard of it,
        both derived from the config). The evaluation bytes are still those of the federated evaluation it stands
        for: each client's encoded evaluate instruction down, and up the encoded reply with the metrics it is
        credited with; so the embedded and Flower runtimes count the same."""
        if not evaluation.local:
            return method.evaluate_global(state), {}, 0
        eval_msgs = driver.plan_evaluate(state, rnd)
        eval_down = sum(len(b) for b in eval_msgs.values())
        once = driver.evaluate_once(state, rnd, sorted(eval_msgs)) if evaluation.reuse_global else None
        if once is not None:
            return once[0], once[1], eval_down
        return method.evaluate_global(state), driver.finish_evaluate(rnd, transport.evaluate(rnd, eval_msgs)), eval_down

    def score(rnd: int, clients: list[dict[str, Any]], t0: float, scored: bool = True,
              failed: str | None = None) -> dict[str, Any]:
        """Evaluate ``state`` (globally, and on the clients when asked), append the round's record (with
        ``round_failed``, the reason, for a round that was skipped)."""
        t_eval = time.perf_counter()
        global_metrics, local_eval, eval_down = evaluate(rnd) if scored else ({"accuracy": None, "loss": None}, {}, 0)
        t_end = time.perf_counter()
        rec = round_record(rnd, global_metrics, clients, local_eval, eval_down, t_end - t0, exp.non_participants,
                           eval_seconds=t_end - t_eval)
        if failed is not None:
            rec["round_failed"] = failed
        if scored and evaluation.keep_best:
            keep_if_best(rnd, rec)
        rec.update(transport.round_extra())
        if fed.secure_aggregation is not None:
            rec.update(driver.secure_notes)
        rec["server"] = method.diagnostics(state)
        vectors = method.vectors(state) if hasattr(method, "vectors") else {}
        if vectors:  # only methods that report some (the records of the others are unchanged)
            rec["server_vectors"] = vectors
        records.append(rec)
        run.append_metrics(rec)
        tracker.rounds([rec])
        return rec

    generation = exp.task.is_generation
    best = max((s for r in records if (s := validation_score(r, generation)) is not None), default=-math.inf)

    def keep_if_best(rnd: int, rec: dict[str, Any]) -> None:
        """``evaluation.keep_best``: score ``state`` on the validation split; a new best (strictly: the earliest of
        equal rounds wins) is checkpointed in ``checkpoint-best/``."""
        nonlocal best
        val = method.evaluate_on(state, exp.validation_encoded)
        rec.update({"val_accuracy": val.get("accuracy"), "val_loss": val.get("loss"),
                    "val_macro_f1": val.get("macro_f1")})
        score = validation_score(rec, generation)
        if score is not None and score > best:
            best = score
            run.save_checkpoint(rnd, state, transport.client_states(), {"threads": threads, "run_id": run_id},
                                best=True)
            what = "loss" if generation else "accuracy"
            log.info("round %d: best validation %s so far (%.4f), kept in %s", rnd, what, abs(best), run.best_ckpt)

    if start == 1 and evaluation.round_zero and not any(r["round"] == 0 for r in records):
        rec = score(0, [], time.perf_counter())  # the initial global state, before any training
        log.info("round 0 (initial state): %s", _scores(rec, exp.task.kind))

    for rnd in range(start, fed.rounds + 1):
        t0 = time.perf_counter()
        sent = driver.plan_round(state, rnd)
        try:
            if fed.secure_aggregation is not None:
                state, clients = driver.finish_secure_round(state, sent, transport.train_secure(rnd, sent.instructions))
            else:
                state, clients = driver.finish_round(state, sent, transport.train(rnd, sent.instructions))
            failed = None
        except RoundFailed as e:  # nothing was applied: the server state is that of the round before
            if fed.on_round_failure == "stop":
                raise
            log.warning("%s: round skipped, server state unchanged (federation.on_round_failure=skip)", e)
            clients, failed = e.records, str(e)
        rec = score(rnd, clients, t0, rnd % evaluation.every == 0 or rnd == fed.rounds, failed)
        if rnd % plan.runtime.checkpoint_every == 0 or rnd == fed.rounds:
            run.save_checkpoint(rnd, state, transport.client_states(), {"threads": threads, "run_id": run_id})
            transport.checkpointed(kept_round)  # nodes keep their states back to the previous checkpoint's round
            kept_round = rnd
        log.info("round %d: %s up %d B down %d B (%.1fs)", rnd, _scores(rec, exp.task.kind), rec["bytes_up"],
                 rec["bytes_down"], rec["wall_seconds"])
        bar.advance(rounds_task)
        if stop_after_round is not None and rnd >= stop_after_round and rnd < fed.rounds:
            raise StopAfterRound(f"stopped after round {rnd}")

    suites = (score_suites(evaluation.suites, exp.objective, state, run.root, evaluation.batch_size)
              if evaluation.suites else {})
    unchanged = exp.backbone.checksum() == checksum
    if not unchanged:  # would mean a method wrote into the shared frozen model
        log.error("backbone weights changed during the run")
    summary = build_summary(plan.identity, records, trainable, exp.backbone.num_parameters, {
        "backbone_unchanged": unchanged,
        "threads": threads,  # torch threads of the server and every client (runtime.threads, else resolved)
        "failed_rounds": [r["round"] for r in records if "round_failed" in r],
        "label_histograms": exp.label_histograms(),  # per client, train and test, classes as in class_names
        "class_names": exp.task.class_names,
        **({"client_names": dict(enumerate(names))} if (names := exp.client_names()) else {}),
        **({"client_tiers": {c: p.name for c, p in enumerate(exp.profiles) if p is not None}}
           if any(p is not None for p in exp.profiles) else {}),
        "method_resolved": plan.method_resolved,
        **global_training(method, state),
        "preset_overrides": list(plan.preset_overrides),
        **payload_split(method, state, driver),
        **transport.summary_extra(),
        **({"suites": suites} if suites else {}),  # evaluation.suites: each suite's scores of the final adapter
    })
    run.write_summary(summary)
    if evaluation.report:
        write_report_or_warn(run.root)
    tracker.finish(records[-1]["round"] if records else 0, summary,
                   [run.root / "summary.json", run.root / "report.html"])
    return summary


def _scores(rec: dict[str, Any], kind: str) -> str:
    """A round's log line of scores (``kind``: the task's): accuracy and loss; a generation run's loss, perplexity
    and, where it decoded, BLEU (its accuracy is next-token accuracy, no headline); a preference run's reward
    accuracy, loss and margin."""
    if kind == "preference":
        return (f"reward accuracy {_fmt(rec['accuracy'])} loss {_fmt(rec['loss'])} "
                f"margin {_fmt(rec.get('reward_margin'))}")
    if kind == "classification":
        return f"accuracy {_fmt(rec['accuracy'])} loss {_fmt(rec['loss'])}"
    bleu = (rec.get("generation") or {}).get("bleu")
    return (f"loss {_fmt(rec['loss'])} perplexity {_fmt(rec.get('perplexity'))}"
            + (f" BLEU {bleu:.1f}" if bleu is not None else ""))


def global_training(method: Method, state: Message) -> dict[str, Any]:
    """``untrained_global``: the global tensors the sharing keeps on the clients and the server never trained;
    ``global_adapter``: "untrained" where that is every trained tensor (local-only), "partly untrained" (FedSA-LoRA's
    B and task head), else "trained"."""
    untrained = method.untrained_global(state) if hasattr(method, "untrained_global") else []
    trained = [k for k, v in ServerState.from_message(state).glob.items() if v.is_floating_point()]
    kind = "trained" if not untrained else "untrained" if set(trained) <= set(untrained) else "partly untrained"
    return {"untrained_global": untrained, "global_adapter": kind}


def keep_record(run: RunDir, exp: Experiment, resume: bool, plan: RunPlan) -> str:
    """Write ``model.json`` (what using the run's model needs, the data's fingerprint and the run's id, which every
    checkpoint records); on resume first refuse data that changed since the run started, naming the file, and a
    backbone with other weights. Returns the run id: made when the run starts, from its directory and config, and
    kept with the run when the directory moves."""
    record = exp.record(exp.backbone.fingerprint())
    saved = run.read_record() if resume else None
    if saved is not None:
        changes = data_changes(saved["data"], record["data"])
        if changes:
            raise DataChangedError(f"--resume: the data differ from those the run trained on: {'; '.join(changes)}. "
                                   "Restore them, or start a new run with another --out")
        exp.backbone.check_recorded(saved["backbone"])
    made = hashlib.sha256(f"{run.root.resolve()}\n{plan.config_yaml}".encode()).hexdigest()
    record["run_id"] = (saved or {}).get("run_id") or made[:16]
    run.write_record(record)
    return record["run_id"]


def _rounds(rounds: list[int]) -> str:
    """``1-3`` for a run of rounds, else ``1, 3``."""
    if len(rounds) > 1 and rounds[-1] - rounds[0] == len(rounds) - 1:
        return f"{rounds[0]}-{rounds[-1]}"
    return ", ".join(map(str, rounds))


class DataChangedError(ValueError):
    """``--resume`` found other data than the run started with."""


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
