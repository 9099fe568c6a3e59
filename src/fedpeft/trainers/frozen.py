"""No local training: zero-shot and in-context baselines keep the global state as it is."""

from __future__ import annotations

from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.formats.base import NoUpdate
from fedpeft.trainers.base import NONE, TRAINERS, TrainerBase


@TRAINERS.register("no-training", "no local training (zero-shot and in-context baselines)")
class NoTraining(TrainerBase):
    forward_only = True
    kind = NONE

    def update_format(self) -> NoUpdate:
        return NoUpdate()  # nothing to train from: a training instruction is the round number only

    def fit(self, params: Params, instruction: Message, client: ClientContext, round: int,
            state: Params, frozen=None, static=None, penalty=None) -> tuple[Update, Params]:
        return Update(client.client_id, {}, client.num_examples), {}
