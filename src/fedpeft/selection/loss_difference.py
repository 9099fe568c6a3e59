"""Loss-difference client selection (head-pruning paper Eq. 9): S = argmax_K (L_c^(r') − L_g^(r−1)).

L_c is the training loss client c reported the last time it took part (the server's history); clients never
seen count as +inf, so every client is visited once before any is picked again (spec A8). L_g is one scalar
per round, so it does not change the ranking (spec §2.2 note): the rule is top-K by last reported loss. Ties
(the never-seen clients) are broken by a seeded random order.
"""

from __future__ import annotations

import math

import numpy as np

from fedpeft.selection.base import SELECTORS, History, SelectorBase


def loss_difference(clients: list[int], k: int, history: History, rng: np.random.Generator) -> list[int]:
    """The k clients with the highest last loss (never seen: +inf), ties in a seeded random order; sorted."""
    tie = rng.permutation(len(clients))
    last = [history.get(c, {}).get("loss", math.inf) for c in clients]
    ranked = sorted(range(len(clients)), key=lambda i: (-last[i], int(tie[i])))
    return sorted(clients[i] for i in ranked[:k])


@SELECTORS.register("loss_difference", "the federation.clients_per_round clients with the highest last training "
                    "loss; never-seen clients first (head-pruning paper Eq. 9)")
class LossDifference(SelectorBase):
    reads_clients = True
    def select(self, clients: list[int], round: int, history: History, rng: np.random.Generator) -> list[int]:
        return loss_difference(clients, self.k, history, rng)
