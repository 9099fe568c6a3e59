"""Embedded runtime: the server and every simulated client in one process, sharing one backbone.

Messages still go through the codec (encode -> bytes -> decode) so values, validation and byte
counts are exactly those of a distributed run. Each round ends with a checkpoint; ``resume``
continues after the last one and, because all randomness is derived from (seed, round, client,
purpose), finishes with the same metrics as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fedpeft.comm.codec import Message
from fedpeft.config import ExperimentConfig, dump_config
from fedpeft.experiment import Experiment, build_experiment
from fedpeft.methods import PRESETS
from fedpeft.runtime.client import handle_evaluate, handle_train
from fedpeft.runtime.server import RoundDriver
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import build_summary, round_record

log = logging.getLogger("fedpeft")

# (round, client id, reply bytes) -> reply bytes; lets tests corrupt a reply on the wire
ReplyHook = Callable[[int, int, bytes], bytes]


class StopAfterRound(Exception):
    """Raised by ``stop_after_round`` to simulate a crash right after a checkpoint."""


@contextlib.contextmanager
def _log_to(path: Path) -> Iterator[None]:
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


def _progress(enabled: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), disable=not enabled, transient=False)


def run_embedded(cfg: ExperimentConfig, out_dir: str | Path, resume: bool = False,
                 stop_after_round: int | None = None, reply_hook: ReplyHook | None = None,
                 experiment: Experiment | None = None) -> dict[str, Any]:
    """Run (or resume) the experiment in this process; returns the summary written to summary.json."""
    if cfg.runtime.threads:
        torch.set_num_threads(cfg.runtime.threads)
    run = RunDir(out_dir)
    config_yaml = dump_config(cfg)
    if resume and run.saved_config() not in (None, config_yaml):
        raise ValueError(f"{out_dir}/config.yaml differs from the config given to --resume")
    run.prepare(config_yaml, resume)
    with _log_to(run.root / "run.log"):
        return _run(cfg, run, resume, stop_after_round, reply_hook, experiment)


def _run(cfg, run: RunDir, resume, stop_after_round, reply_hook, experiment) -> dict[str, Any]:
    exp = experiment or build_experiment(cfg)
    method = PRESETS.get(cfg.method.name).build(cfg, exp)
    driver = RoundDriver(cfg, method)
    checksum = exp.backbone.checksum()
    client_state: dict[int, Message] = {}
    start, state = 1, method.server_init()
    ckpt = run.load_checkpoint() if resume else None
    if ckpt is not None:
        last, state, client_state, _ = ckpt
        records = run.truncate_metrics(last)
        start = last + 1
        log.info("resuming after round %d", last)
    else:
        records = run.truncate_metrics(0) if resume else []
        log.info("label histogram per client (train): %s", exp.label_histograms()["train"])
    trainable = method.trainable_params(state)

    with _progress(cfg.runtime.progress) as bar:
        rounds_task = bar.add_task("rounds", total=cfg.federation.rounds, completed=start - 1)
        clients_task = bar.add_task("clients", total=0)
        for rnd in range(start, cfg.federation.rounds + 1):
            t0 = time.perf_counter()
            plan = driver.plan_round(state, rnd)
            bar.reset(clients_task, total=len(plan.instructions), description=f"round {rnd} clients")
            results: dict[int, bytes | BaseException] = {}
            for cid, payload in plan.instructions.items():
                ctx = exp.client(cid)
                ctx.state = client_state.get(cid, Message())
                try:
                    reply = handle_train(method, payload, ctx)
                    results[cid] = reply_hook(rnd, cid, reply) if reply_hook else reply
                    client_state[cid] = ctx.state
                except Exception as e:  # one failing client must not kill the round
                    log.exception("round %d: client %d raised", rnd, cid)
                    results[cid] = e
                bar.advance(clients_task)
            state, clients = driver.finish_round(state, plan, results)
            global_metrics = method.evaluate_global(state)
            local_eval: dict[int, dict[str, Any]] = {}
            eval_down = 0
            if cfg.evaluation.local:
                eval_msgs = driver.plan_evaluate(state, rnd)
                eval_down = sum(len(b) for b in eval_msgs.values())
                eval_results: dict[int, bytes | BaseException] = {}
                for cid, payload in eval_msgs.items():
                    ctx = exp.client(cid)
                    ctx.state = client_state.get(cid, Message())
                    try:
                        eval_results[cid] = handle_evaluate(method, payload, ctx)
                    except Exception as e:
                        eval_results[cid] = e
                local_eval = driver.finish_evaluate(rnd, eval_results)
            rec = round_record(rnd, global_metrics, clients, local_eval, eval_down, time.perf_counter() - t0)
            records.append(rec)
            run.append_metrics(rec)
            if rnd % cfg.runtime.checkpoint_every == 0 or rnd == cfg.federation.rounds:
                run.save_checkpoint(rnd, state, client_state)
            log.info("round %d: accuracy %.4f loss %.4f up %d B down %d B (%.1fs)", rnd, rec["accuracy"],
                     rec["loss"], rec["bytes_up"], rec["bytes_down"], rec["wall_seconds"])
            bar.advance(rounds_task)
            if stop_after_round is not None and rnd >= stop_after_round and rnd < cfg.federation.rounds:
                raise StopAfterRound(f"stopped after round {rnd}")

    unchanged = exp.backbone.checksum() == checksum
    if not unchanged:  # would mean a method wrote into the shared frozen model
        log.error("backbone weights changed during the run")
    summary = build_summary(cfg, records, trainable, exp.backbone.num_parameters, {
        "backbone_unchanged": unchanged,
        **_payload_split(method, state),
    })
    run.write_summary(summary)
    return summary


def _payload_split(method, state: Message) -> dict[str, int]:
    """Tensor bytes of one upload in the wire dtype (what the paper counts); the rest is framing."""
    schema = method.reply_schema(state)
    numel = sum(math.prod(shape) for shape in schema.tensors.values())
    return {"upload_tensor_bytes": numel * schema.dtype.itemsize}
