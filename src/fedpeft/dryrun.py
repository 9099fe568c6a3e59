"""``fedpeft run --dry-run``: what a config will train on and what one client-round costs on the wire, without
training anything.

What you check first on your own data: the classes found with their train and test counts, each client's sizes and
training labels, and the first training example as the model will see it (template applied, the adapter's rows
marked where they go); on a generation task, how many prompts and responses the length limits cut, and where.

The experiment and the method are built as a run builds them; the server state is initialised and round 1 is
configured for the selected clients, so the instruction size is the real encoded length of the first selected
client's round-1 instruction (``comm.codec.encode`` with the method's wire spec). The reply size is the
reply schema's tensor bytes (shapes x wire dtype size; a size that varies per client, as under head pruning,
counts at its upper bound, the full global shape) plus the framing measured by encoding a zero-filled reply
of those shapes carrying the schema's required scalars. Real replies may carry a few more scalars (training
loss, query counts), so their framing is a little larger. Methods whose exchange changes over the rounds
(FedPepTAO after its selection round, codecs that send residuals after the first round) send less later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedpeft.comm.codec import Message, encode, payload_bytes
from fedpeft.config import ExperimentConfig
from fedpeft.methods.state import ServerState


@dataclass(frozen=True)
class DryRun:
    trainable_params: int
    client: int                 # the first selected client of round 1
    clients_per_round: int      # how many round 1 selects
    down_bytes: int             # its encoded round-1 instruction
    down_tensor_bytes: int
    up_bytes: int               # reply tensor bytes + framing of a zero-filled reply
    up_tensor_bytes: int
    up_framing_bytes: int
    up_upper_bound: bool        # some reply dimension varies per client (counted at its maximum)
    classes: list[tuple[str, int, int]] = field(default_factory=list)  # (class name, train count, test count)
    clients: list[str] = field(default_factory=list)   # per client: sizes and training labels by class name
    readout: str = ""
    example: str = ""           # the first training example as the model sees it
    example_label: str = ""
    validation: int = 0         # examples held out of training (evaluation.keep_best)
    cuts: dict[str, str] = field(default_factory=dict)  # generation: what the length limits cut, per split
    generation: bool = False


def dry_run(cfg: ExperimentConfig) -> DryRun:
    from fedpeft.build import build

    built = build(cfg)
    method = built.method
    state = method.server_init()
    instructions = method.configure_round(state, 1, list(range(built.exp.num_clients)))
    if not instructions:
        raise ValueError("federation: round 1 selects no client (are all clients non-participants?)")
    client = min(instructions)
    msg = instructions[client]
    schema = method.reply_schema(state)
    glob = ServerState.from_message(state).glob
    variable = False
    shapes: dict[str, tuple[int, ...]] = {}
    for k, shape in schema.tensors.items():
        if any(d is None for d in shape):
            variable = True
            full = tuple(glob[k].shape) if k in glob and len(glob[k].shape) == len(shape) else (0,) * len(shape)
            shape = tuple(f if d is None else d for d, f in zip(shape, full))
        shapes[k] = tuple(shape)
    zero = Message({k: torch.zeros(sh, dtype=schema.dtype_of(k)) for k, sh in shapes.items()},
                   {s: 0 for s in schema.scalars})
    up = len(encode(zero, method.wire))
    up_tensors = sum(math.prod(sh) * schema.dtype_of(k).itemsize for k, sh in shapes.items())
    exp = built.exp
    task = exp.task
    counts = [(name, sum(e.label == k for e in task.train), sum(e.label == k for e in task.test))
              for k, name in enumerate(task.class_names)]
    first = task.train[0] if task.train else None
    return DryRun(method.trainable_params(state), client, len(instructions), len(encode(msg, method.wire)),
                  payload_bytes(msg, method.wire), up, up_tensors, up - up_tensors, variable, counts,
                  exp.describe_clients(), exp.objective.readout,
                  exp.objective.show(first, method.initial_params()) if first else "",
                  (task.class_names[first.label] if task.class_names else "(the response)") if first else "",
                  len(exp.validation), exp.cuts(), task.is_generation)
