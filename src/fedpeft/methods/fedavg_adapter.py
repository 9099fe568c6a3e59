"""FedAvg over an adapter's tensors with local gradient training.

This is FedPrompt's "split aggregation" (Zhao et al., Alg. 1 and Eq. 5): the frozen PLM F is never
sent; the server sends the global trainable part P_t, each selected client runs ClientUpdate from
it and returns P_{t+1}^k, and the server sets P_{t+1} = sum_k (n_k / N_t) P_{t+1}^k. With the
``full`` adapter the same code is the full fine-tuning FedAvg baseline.
"""

from __future__ import annotations

import numpy as np
import torch

from fedpeft.aggregators import AGGREGATORS
from fedpeft.backbones.classifier import evaluate
from fedpeft.comm.codec import WIRE_DTYPES, Message, WireSpec
from fedpeft.components import settings_of
from fedpeft.config import ExperimentConfig
from fedpeft.methods.base import ClientContext, ReplySchema
from fedpeft.rng import SERVER, torch_rng
from fedpeft.trainers import TRAINERS, train_local


def _float(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in tensors.items()}


class FedAvgAdapter:
    """Global adapter tensors P; clients train a copy with gradients; the server averages (Eq. 5)."""

    def __init__(self, name: str, cfg: ExperimentConfig, experiment) -> None:
        self.name = name
        self.cfg = cfg
        self.exp = experiment
        self.clf = experiment.classifier
        self.optimizer = cfg.method.trainer.name
        self.trainer = settings_of(cfg.method.trainer, TRAINERS)
        self.combine = AGGREGATORS.get(cfg.method.aggregator.name)
        self.wire = WireSpec(cfg.method.codec.dtype)
        self.eval_batch = cfg.evaluation.batch_size

    # ------------------------------------------------------------------ server

    def server_init(self) -> Message:
        params = self.clf.init_params(torch_rng(self.cfg.seed, 0, SERVER, "adapter-init"))
        return Message(tensors=params, scalars={"round": 0})

    def configure_round(self, state: Message, round: int, clients: list[int],
                        rng: np.random.Generator) -> dict[int, Message]:
        msg = Message(tensors=dict(state.tensors), scalars={"round": round})
        return {c: msg for c in clients}

    def reply_schema(self, state: Message) -> ReplySchema:
        shapes = {k: tuple(v.shape) for k, v in state.tensors.items()}
        return ReplySchema(shapes, WIRE_DTYPES[self.wire.default], ("num_examples", "train_loss", "steps"))

    def aggregate(self, state: Message, round: int, replies: dict[int, Message]) -> Message:
        order = sorted(replies)
        new = self.combine([_float(replies[c].tensors) for c in order],
                           [int(replies[c].scalars["num_examples"]) for c in order])
        return Message(tensors=new, scalars={"round": round})

    def evaluate_global(self, state: Message) -> dict[str, float]:
        return evaluate(self.clf, _float(state.tensors), self.exp.test_encoded, self.eval_batch)

    def trainable_params(self, state: Message) -> int:
        return sum(v.numel() for v in state.tensors.values())

    # ------------------------------------------------------------------ client

    def client_update(self, instruction: Message, client: ClientContext) -> Message:
        round = int(instruction.scalars["round"])
        gen = torch_rng(client.seed, round, client.client_id, "local-train")
        result = train_local(self.clf, _float(instruction.tensors), client.train, self.optimizer, self.trainer, gen,
                             optimizer_state=client.state.tensors or None)
        if result.optimizer_state is not None:
            client.state = Message(tensors=result.optimizer_state)
        return Message(tensors=result.params, scalars={
            "num_examples": len(client.train), "train_loss": result.mean_loss, "steps": result.steps})

    # ------------------------------------------------------------------ federated evaluation

    def configure_evaluate(self, state: Message, round: int, clients: list[int]) -> dict[int, Message]:
        msg = Message(tensors=dict(state.tensors), scalars={"round": round})
        return {c: msg for c in clients}

    def client_evaluate(self, instruction: Message, client: ClientContext) -> Message:
        metrics = evaluate(self.clf, _float(instruction.tensors), client.test, self.eval_batch)
        return Message(scalars=metrics)
