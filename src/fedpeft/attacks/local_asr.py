"""The attack success rate of a malicious client's own trained model, measured on the client before any transform
(the backdoor's strength where it is made, beside the global ASR the server measures)."""

from __future__ import annotations

from typing import Any

from fedpeft.comm.update import Params


def local_asr(trainer: Any, start: Params, trained: Params, client: Any) -> dict[str, float]:
    """``{"local_asr": ASR}`` of ``start`` with the trained tensors (the trainer's result, before its update format
    cuts the reply) in place, on the client's triggered test inputs (empty when the client has none, or the trainer
    cannot score them)."""
    if client.asr_test is None:
        return {}
    local = start | trained
    asr = trainer.evaluate(local, client.asr_test).get("accuracy")
    return {"local_asr": asr} if asr is not None else {}
