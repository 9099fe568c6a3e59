"""Payload audit: what a client's encoded reply may carry besides the tensors its schema declares (nothing).

The server already rejects a reply whose tensors are not exactly its schema's (``validation.validate_reply``);
the audit checks what a schema cannot: no frozen backbone weight is sent back (bitwise, after the wire cast), nor
any tensor the client keeps to itself (a personalisation policy's private tensors, e.g. FedSA-LoRA's B), the
reply is far smaller than the backbone, its scalars are numbers, and no text of the client's own data appears
in its bytes. ``audit_reply`` lists what it finds (empty: clean).
"""

from __future__ import annotations

import torch

from fedpeft.comm.codec import decode
from fedpeft.experiment import Experiment

# presets whose adapter is the backbone itself (full fine-tuning, the papers' upper baseline): they exchange
# backbone-sized tensors by design, so only the scalar and text checks apply to them
FULL_MODEL_PRESETS = frozenset({"fedavg-full"})


def audit_reply(data: bytes, exp: Experiment, client: int, full_model: bool = False,
                max_share: float = 0.1, private: dict[str, torch.Tensor] | None = None) -> list[str]:
    """Problems in client ``client``'s reply ``data``: non-numeric scalars, its own text, a tensor equal to one of
    its ``private`` tensors, and (unless ``full_model``) more than ``max_share`` of the backbone's values or a tensor
    equal to a frozen weight."""
    msg = decode(data)
    problems = [f"scalar '{k}' is a {type(v).__name__}" for k, v in msg.scalars.items()
                if not (v is None or isinstance(v, (int, float, bool)))]
    texts = {t for i in exp.train_parts[client] for ex in (exp.task.train[int(i)],) for t in (ex.text_a, ex.text_b)
             if t and len(t) >= 8}
    problems += [f"the client's text {t[:30]!r} is in its reply" for t in sorted(texts) if t.encode() in data]
    for name, t in msg.tensors.items():
        kept = [k for k, p in (private or {}).items() if p.shape == t.shape and torch.equal(p.cpu().to(t.dtype), t)]
        if kept:
            problems.append(f"tensor '{name}' equals the private tensor {kept[0]} the client keeps to itself")
    if full_model:
        return problems
    values = sum(t.numel() for t in msg.tensors.values())
    if values >= max_share * exp.backbone.num_parameters:
        problems.append(f"{values:,} values sent, {values / exp.backbone.num_parameters:.0%} of the backbone")
    weights = dict(exp.backbone.model.named_parameters())
    for name, t in msg.tensors.items():
        same = [w for w, p in weights.items() if p.shape == t.shape and torch.equal(p.detach().cpu().to(t.dtype), t)]
        if same:
            problems.append(f"tensor '{name}' equals the frozen weight {same[0]}")
    return problems
