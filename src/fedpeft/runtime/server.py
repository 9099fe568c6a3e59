"""Server-side round logic shared by all runtimes: configure, encode, validate, aggregate, account.

A runtime only has to move bytes: ``plan_round`` gives the encoded instruction for each client the
method selected, the runtime delivers them and hands back whatever came back (bytes, or the exception that
stood in for a reply), and ``finish_round`` decodes, validates, aggregates and returns the new
state plus per-client records. Byte counts are the lengths of the real encoded messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fedpeft.comm.codec import Message, decode, encode
from fedpeft.config import FederationConfig
from fedpeft.methods.base import Method
from fedpeft.runtime.validation import InvalidReply, validate_metrics, validate_reply

log = logging.getLogger(__name__)

# the securely aggregated clipped share (a mean of 0s and 1s) lies in [0, 1] up to the quantization's error (at
# most 2c/Q · max_weight / n_k, about 4e-4 at the defaults and 10 examples); beyond it the masked sum wrapped around
WRAP_TOLERANCE = 0.01


class RoundFailed(RuntimeError):
    """Fewer than ``federation.min_clients`` valid replies: the round is not applied (``records``: its clients)."""

    def __init__(self, message: str, records: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.records = records


@dataclass
class RoundPlan:
    round: int
    instructions: dict[int, bytes]
    bytes_down: dict[int, int] = field(default_factory=dict)


class RoundDriver:
    def __init__(self, federation: FederationConfig, method: Method, name: Callable[[int], str] | None = None,
                 weights: dict[int, int] | None = None) -> None:
        self.federation, self.method = federation, method  # its own section: clients, quorum, message cap
        self.name = name or (lambda cid: f"client {cid}")  # how logs name a client (natural clients by their value)
        # each client's weight (its examples), which the server knows from the partition: a reply claiming another
        # is refused (its weight would decide how much of the aggregate it takes)
        self.weights = weights
        self.last_tensor_bytes: float | None = None  # mean tensor bytes of the last round's accepted replies
        self.secure_notes: dict[str, float] = {}  # the last secure round's protocol facts for its record

    def plan_round(self, state: Message, round: int) -> RoundPlan:
        """Each selected client's encoded instruction; equal instructions share one bytes object (most methods
        send every client the same global tensors), so a round's plan holds one copy, not one per client."""
        msgs = self.method.configure_round(state, round, list(range(self.federation.num_clients)))
        shared: dict[bytes, bytes] = {}
        encoded = {}
        for cid, m in msgs.items():
            data = encode(m, self.method.wire)
            encoded[cid] = shared.setdefault(data, data)
        return RoundPlan(round, encoded, {cid: len(b) for cid, b in encoded.items()})

    def finish_round(self, state: Message, plan: RoundPlan,
                     results: dict[int, bytes | BaseException]) -> tuple[Message, list[dict[str, Any]]]:
        """Decode, validate and aggregate the replies (``results`` is emptied as they are read), or RoundFailed."""
        schema = self.method.reply_schema(state)
        accepted: dict[int, Message] = {}
        records = []
        for cid in sorted(plan.instructions):
            rec: dict[str, Any] = {"client": cid, "bytes_down": plan.bytes_down[cid], "bytes_up": 0}
            res = results.pop(cid, RuntimeError("no reply"))  # taken out: its bytes are freed once decoded
            if isinstance(res, BaseException):
                rec["status"] = "failed"
                rec["error"] = f"{type(res).__name__}: {res}"
                log.warning("round %d: %s failed: %s", plan.round, self.name(cid), rec["error"])
            else:
                rec["bytes_up"] = len(res) if isinstance(res, (bytes, bytearray)) else 0
                try:
                    reply = decode(res, self.federation.max_message_bytes)
                    validate_reply(reply, schema, cid)
                    self._check_weight(cid, reply.scalars.get("num_examples"))
                except Exception as e:  # noqa: BLE001 - untrusted bytes: whatever fails, the reply is not used
                    rec["status"] = "rejected"
                    rec["error"] = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
                    log.warning("round %d: rejected reply of %s: %s", plan.round, self.name(cid), rec["error"])
                else:
                    rec["status"] = "ok"
                    rec.update({k: v for k, v in reply.scalars.items() if isinstance(v, (int, float))})
                    rec.update(self.method.reply_record(reply))
                    accepted[cid] = reply
            records.append(rec)
        if accepted:
            self.last_tensor_bytes = sum(sum(t.numel() * t.element_size() for t in r.tensors.values())
                                         for r in accepted.values()) / len(accepted)
        need = self.federation.min_clients
        if len(accepted) < need:
            raise RoundFailed(f"round {plan.round}: {len(accepted)} valid replies, "
                              f"federation.min_clients is {need}", records)
        return self.method.aggregate(state, plan.round, accepted), records

    def _check_weight(self, cid: int, claimed: Any) -> None:
        if self.weights is not None and claimed != self.weights[cid]:
            raise InvalidReply(f"num_examples {claimed!r}, but {self.name(cid)} holds {self.weights[cid]} examples")

    def finish_secure_round(self, state: Message, plan: RoundPlan,
                            outcome: Any) -> tuple[Message, list[dict[str, Any]]]:
        """Apply a round run under secure aggregation (``runtime.secure``): the server has the survivors' weighted
        mean and clear scalars only. A halted protocol, fewer survivors than ``federation.min_clients`` or a
        non-finite or misshapen mean fail the round with nothing applied."""
        import torch

        schema = self.method.reply_schema(state)
        self.secure_notes = {"secure_clipped_share": outcome.clipped} if outcome.mean is not None else {}
        if 1e-6 < outcome.clipped <= 1 + WRAP_TOLERANCE:
            log.warning("round %d: uploads of %.0f %% of the weight exceeded secure_aggregation.clipping_range (%g) "
                        "and were clipped before the sum", plan.round, 100 * outcome.clipped,
                        self.federation.secure_aggregation.clipping_range)
        records = []
        for cid, scalars in list(outcome.scalars.items()):
            try:
                self._check_weight(cid, scalars.get("num_examples"))
            except InvalidReply as e:
                outcome.errors[cid], bad = str(e), outcome.scalars.pop(cid)
                outcome.mean = None  # its weight is inside the masked sum: the sum cannot be used
                outcome.halted = outcome.halted or f"{self.name(cid)} claimed num_examples {bad.get('num_examples')}"
        for cid in sorted(plan.instructions):
            rec: dict[str, Any] = {"client": cid, "bytes_down": outcome.bytes_down.get(cid, 0),
                                   "bytes_up": outcome.bytes_up.get(cid, 0)}
            if cid in outcome.scalars:
                rec["status"] = "ok"
                rec.update({k: v for k, v in outcome.scalars[cid].items() if isinstance(v, (int, float))})
            else:
                rec["status"] = "failed"
                rec["error"] = outcome.errors.get(cid, "no reply")
                log.warning("round %d: %s dropped out of secure aggregation: %s", plan.round, self.name(cid),
                            rec["error"])
            records.append(rec)
        if outcome.mean is None:
            raise RoundFailed(f"round {plan.round}: secure aggregation halted ({outcome.halted})", records)
        if not -WRAP_TOLERANCE <= outcome.clipped <= 1 + WRAP_TOLERANCE:
            raise RoundFailed(f"round {plan.round}: the securely aggregated clipped share is {outcome.clipped:.4g}, "
                              "outside [0, 1]: the masked sum wrapped around the field (check secure_aggregation's "
                              "max_weight, quantization_range and modulus_range); nothing applied", records)
        need = self.federation.min_clients
        if len(outcome.scalars) < need:
            raise RoundFailed(f"round {plan.round}: {len(outcome.scalars)} clients survived secure aggregation, "
                              f"federation.min_clients is {need}", records)
        mean = {k: torch.from_numpy(v.astype("float64")) for k, v in outcome.mean.items()}
        want = schema.tensors  # the update and what the sharing policy reports (e.g. FedPepTAO's layer scores)
        if sorted(mean) != sorted(want) or any(tuple(mean[k].shape) != tuple(want[k]) for k in want):
            raise RoundFailed(f"round {plan.round}: the securely aggregated tensors "
                              f"{ {k: tuple(v.shape) for k, v in mean.items()} } are not the reply's {want}", records)
        if not all(bool(torch.isfinite(v).all()) for v in mean.values()):
            raise RoundFailed(f"round {plan.round}: the securely aggregated mean is not finite", records)
        self.last_tensor_bytes = None
        return self.method.aggregate_mean(state, plan.round, mean, round(outcome.weight), outcome.scalars,
                                          schema), records

    def plan_evaluate(self, state: Message, round: int) -> dict[int, bytes]:
        ids = list(range(self.federation.num_clients))
        msgs = self.method.configure_evaluate(state, round, ids)
        return {cid: encode(m, self.method.wire) for cid, m in msgs.items()}

    def evaluate_once(self, state: Message, round: int,
                      clients: list[int]) -> tuple[dict[str, float], dict[int, dict[str, Any]]] | None:
        """The global metrics and each client's local metrics from the method's one pass over the test set (None
        where the clients must evaluate themselves), with ``bytes_up`` the length of the reply each client would
        have sent: its metrics encoded as ``client_evaluate``'s reply is."""
        once = self.method.evaluate_once(state, round, clients)
        if once is None:
            return None
        glob, local = once
        return glob, {c: m | {"bytes_up": len(encode(Message(scalars=m), self.method.wire))}
                      for c, m in sorted(local.items())}

    def finish_evaluate(self, round: int, results: dict[int, bytes | BaseException]) -> dict[int, dict[str, Any]]:
        """Each client's local metrics; a failed client or an undecodable reply is logged and left out."""
        out = {}
        for cid, res in sorted(results.items()):
            try:
                if isinstance(res, BaseException):
                    raise res
                out[cid] = validate_metrics(decode(res, self.federation.max_message_bytes)) | {"bytes_up": len(res)}
            except Exception as e:  # noqa: BLE001 - a client's evaluation never stops the run
                log.warning("round %d: evaluation on %s failed: %s", round, self.name(cid), e)
        return out
