"""Embedded runtime: the server and every simulated client in one process, sharing one backbone.

Messages still go through the codec (encode -> bytes -> decode) so values, validation and byte
counts are exactly those of a distributed run. Each round ends with a checkpoint; ``resume``
continues after the last one and, because all randomness is derived from (seed, round, client,
purpose), finishes with the same metrics as an uninterrupted run. The round loop itself is
``runtime.session.run_rounds``, shared with the Flower runtimes; this module is only the transport.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.progress import Progress

from fedpeft.model.gather import ForwardGather
from fedpeft.build import RunPlan, build, run_plan
from fedpeft.comm.codec import Message, decode
from fedpeft.config import ExperimentConfig
from fedpeft.experiment import Experiment
from fedpeft.methods.base import Method
from fedpeft.runtime.client import handle_evaluate, handle_train
from fedpeft.runtime.faults import fails, inject
from fedpeft.runtime.heap import HeapTrimmer
from fedpeft.runtime.secure.inprocess import grid_class, task_identity
from fedpeft.runtime.secure.protocol import SecureOutcome, node_handler, node_id, secure_round
from fedpeft.runtime.session import StopAfterRound, log_to, open_run, progress, run_rounds
from fedpeft.runtime.threads import for_run
from fedpeft.runtime.workers import ClientWorkers, encode_state

__all__ = ["ReplyHook", "StopAfterRound", "run_embedded"]

log = logging.getLogger("fedpeft")

# (round, client id, reply bytes) -> reply bytes; lets tests corrupt a reply on the wire
ReplyHook = Callable[[int, int, bytes], bytes]


class LateReply(TimeoutError):
    """A reply that came after ``federation.round_timeout``: ignored, and the client's new state not kept."""


def _copy(state: Message) -> Message:
    """A client's state as a new message, so that a failed or late client leaves its kept state untouched."""
    return Message({k: v.clone() for k, v in state.tensors.items()}, dict(state.scalars))


class InProcessTransport:
    """Delivers each instruction by calling the client handlers directly; keeps client states in memory.

    Clients run one after another, or side by side on forked workers sharing the backbone
    (``runtime.client_workers``), or in groups whose model calls (black-box forwards, gradient steps) share backbone
    calls (``runtime.client_batch``, ``backbones.gather``); with ``federation.round_timeout`` each is held to the
    deadline by its own elapsed time, as if they ran side by side: a later reply is ignored and logged, its state not
    kept."""

    def __init__(self, plan: RunPlan, method: Method, exp: Experiment, bar: Progress,
                 reply_hook: ReplyHook | None, workers: ClientWorkers | None = None) -> None:
        self.plan, self.method, self.exp, self.bar, self.reply_hook = plan, method, exp, bar, reply_hook
        self.workers = workers
        self.states: dict[int, Message] = {}
        self.shared = {"backbone_calls": 0, "forward_requests": 0}  # this round's, with client groups
        self.heap = HeapTrimmer()  # freed training temporaries back to the OS between clients (many-client runs)
        self.clients_task = bar.add_task("clients", total=0)
        # client groups only where their calls are stacked: on CPU a group's calls would each run their own
        # forward anyway, and the threads cost time (benchmarks/results/perf.md, figure 2)
        runtime = plan.runtime
        self.together = runtime.client_batch > 1 and exp.objective.stacks_calls(runtime.client_batch_passes)
        if runtime.client_batch > 1 and not self.together:
            log.warning("runtime.client_batch on CPU: clients run one after another (the same results; stacking their "
                        "model calls is no faster on CPU); runtime.client_batch_passes stacks them anyway, "
                        "runtime.client_workers uses the cores")

    def train(self, round: int, instructions: dict[int, bytes]) -> dict[int, bytes | BaseException]:
        self.bar.reset(self.clients_task, total=len(instructions), description=f"round {round} clients")
        self.shared = dict.fromkeys(self.shared, 0)
        if self.workers is not None:
            done = self._on_workers(round, instructions)
        elif self.together:
            done = self._together(round, instructions)
        else:
            done = (self._here(round, cid, payload) for cid, payload in instructions.items())
        results: dict[int, bytes | BaseException] = {}
        timeout = self.plan.federation.round_timeout
        for cid, outcome, state, took in done:
            if not isinstance(outcome, BaseException) and self.reply_hook is not None:
                try:
                    outcome = self.reply_hook(round, cid, outcome)
                except Exception as e:  # the hook stands for the wire and the client: its failure is theirs
                    log.exception("round %d: client %d raised", round, cid)
                    outcome = e
            if not isinstance(outcome, BaseException) and timeout is not None and took > timeout:
                log.warning("round %d: client %d replied after %.1f s, past federation.round_timeout (%.1f s); "
                            "reply ignored", round, cid, took, timeout)
                outcome = LateReply(f"reply after {took:.1f} s, past the {timeout:g} s deadline; ignored")
            results[cid] = outcome
            if not isinstance(outcome, BaseException):
                self.states[cid] = state
            self.heap.maybe()
            self.bar.advance(self.clients_task)
        return results

    def _here(self, round: int, cid: int, payload: bytes,
              group: ForwardGather | None = None) -> tuple[int, bytes | BaseException, Message, float]:
        """One client in this process: (client, reply or error, its new state, seconds)."""
        ctx = self.exp.client(cid)
        ctx.state = _copy(self.states.get(cid, Message()))
        ctx.forward = group
        t0 = time.monotonic()
        try:
            inject(self.plan.faults, self.plan.seed, round, cid)
            reply: bytes | BaseException = handle_train(self.method, payload, ctx)
        except Exception as e:  # one failing client must not kill the round
            log.exception("round %d: client %d raised", round, cid)
            reply = e
        finally:
            if group is not None:
                group.leave()
        return cid, reply, ctx.state, time.monotonic() - t0

    def _together(self, round: int,
                  instructions: dict[int, bytes]) -> Iterator[tuple[int, bytes | BaseException, Message, float]]:
        """The round's clients in groups of ``runtime.client_batch``, each client in a thread, a group's model
        calls run together (``ForwardGather``); results in client order."""
        ids, k = list(instructions), self.plan.runtime.client_batch
        for start in range(0, len(ids), k):
            group = ids[start:start + k]
            for cid in group:
                self.exp.client(cid)  # data encoded (and cached) here, not by racing threads
            gather = ForwardGather(self.exp.objective, len(group), self.plan.runtime.client_batch_passes)
            with ThreadPoolExecutor(len(group), thread_name_prefix="client") as pool:
                futures = [pool.submit(self._here, round, cid, instructions[cid], gather) for cid in group]
                yield from (f.result() for f in futures)
            self.shared["backbone_calls"] += gather.calls
            self.shared["forward_requests"] += gather.requests

    def _on_workers(self, round: int,
                    instructions: dict[int, bytes]) -> Iterator[tuple[int, bytes | BaseException, Message, float]]:
        """The round's clients on the forked workers, in the same order and with the same results."""
        jobs = [(cid, payload, encode_state(self.states.get(cid, Message()))) for cid, payload in instructions.items()]
        for d in self.workers.train(round, jobs):
            if d.error is not None:
                yield d.client, RuntimeError(d.error), Message(), d.seconds
            else:
                yield d.client, d.reply, decode(d.state), d.seconds

    def train_secure(self, round: int, instructions: dict[int, bytes]) -> SecureOutcome:
        """The round under SecAgg+: Flower's workflow over an in-process grid whose nodes are these clients, each
        behind Flower's mod (``runtime.secure``); a client that raises (or a fault) drops out where it failed. A
        client's new state is kept when it survives the round."""
        self.bar.reset(self.clients_task, total=len(instructions), description=f"round {round} clients (secure)")
        new_states: dict[int, Message] = {}

        def run_node(settings: dict, payloads: dict[int, bytes]) -> tuple[dict[int, bytes], dict[int, str]]:
            replies, errors = {}, {}
            for cid, payload in payloads.items():
                ctx = self.exp.client(cid)
                ctx.state = _copy(self.states.get(cid, Message()))
                try:
                    inject(self.plan.faults, self.plan.seed, round, cid)
                    replies[cid] = handle_train(self.method, payload, ctx)
                    new_states[cid] = ctx.state
                except Exception as e:  # noqa: BLE001 - the client drops out of the protocol
                    log.exception("round %d: client %d raised", round, cid)
                    errors[cid] = f"{type(e).__name__}: {e}"
                self.bar.advance(self.clients_task)
            return replies, errors

        handlers = {node_id(c): node_handler(run_node, node_id(c)) for c in instructions}
        faults, client_of = self.plan.faults, {node_id(c): c for c in instructions}

        def drop(node: int, stage: str) -> bool:  # ``faults.secure_stage``: a failing client drops at that stage
            return stage == faults.secure_stage and fails(faults, self.plan.seed, round, client_of[node])

        grid = grid_class()(handlers, drop if faults.secure_stage is not None else None)
        with task_identity():
            outcome = secure_round(self.plan.federation.secure_aggregation, self.plan.seed, round,
                                   {node_id(c): {c: p} for c, p in instructions.items()}, grid,
                                   uniform=self.method.aggregator.uniform_weights)
        outcome.bytes_down = {client_of[n]: b for n, b in grid.bytes_down.items()}
        outcome.bytes_up = {client_of[n]: b for n, b in grid.bytes_up.items()}
        outcome.errors |= {client_of[n]: e for n, e in grid.errors.items()} | {
            client_of[n]: f"no reply at the {stage} stage" for n, stage in grid.dropped_at.items()}
        for cid in outcome.scalars:
            self.states[cid] = new_states[cid]
        return outcome

    def evaluate(self, round: int, instructions: dict[int, bytes]) -> dict[int, bytes | BaseException]:
        results: dict[int, bytes | BaseException] = {}
        for cid, payload in instructions.items():
            ctx = self.exp.client(cid)
            ctx.state = _copy(self.states.get(cid, Message()))
            try:
                results[cid] = handle_evaluate(self.method, payload, ctx)
            except Exception as e:
                results[cid] = e
        return results

    def client_states(self) -> dict[int, Message]:
        return self.states

    def restore(self, client_states: dict[int, Message], last_round: int) -> None:
        self.states = dict(client_states)

    def checkpointed(self, round: int) -> None:
        pass

    def round_extra(self) -> dict[str, Any]:
        """With ``runtime.client_batch`` > 1: the backbone calls the round's clients' model calls took together."""
        return {"client_batch": dict(self.shared)} if self.together else {}

    def summary_extra(self) -> dict[str, Any]:
        return {}


def run_embedded(cfg: ExperimentConfig, out_dir: str | Path, resume: bool = False,
                 stop_after_round: int | None = None, reply_hook: ReplyHook | None = None,
                 experiment: Experiment | None = None) -> dict[str, Any]:
    """Run (or resume) the experiment in this process; returns the summary written to summary.json. The server,
    the clients and the client workers compute with the run's torch threads (``runtime.threads``)."""
    plan = run_plan(cfg)
    with open_run(plan, out_dir, resume) as run, log_to(run.root / "run.log"), progress(plan.runtime.progress) as bar, \
            for_run(plan.runtime, run, resume) as threads:
        b = build(cfg, experiment)
        with contextlib.ExitStack() as stack:
            workers = None
            if plan.runtime.client_workers > 1:
                b.exp.client(0)  # encode the data once, before the fork, so the workers share it too
                workers = stack.enter_context(ClientWorkers(plan.runtime.client_workers, plan.faults, plan.seed,
                                                            b.method, b.exp, threads))
            transport = InProcessTransport(plan, b.method, b.exp, bar, reply_hook, workers)
            return run_rounds(plan, run, b.exp, b.method, transport, resume, stop_after_round, bar, threads)
