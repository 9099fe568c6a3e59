"""Vectorised clients (``runtime.client_batch``): the black-box forwards of several clients in one backbone call.

The embedded runtime runs a group of k clients of a round in k threads that share one ``ForwardGather``; each
client's ``BlackBox`` hands its forward requests to it instead of calling the model. Once every client of the
group that is still training has one request waiting, the last to arrive runs them all as one forward
(``Classifier.logits_many``, requests in client-id order) and wakes the others. So the j-th backbone call of a
group always holds the j-th request of every client that makes at least j: which requests go together does not
depend on thread timing, and a rerun gives the same numbers. Against running the clients one after another the
logits agree up to float rounding (the rows are padded to a common width and multiplied in one larger batch).
Each client's own search (CMA-ES, token search) stays in its thread; only model calls are shared.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from fedpeft.backbones.classifier import Classifier
from fedpeft.comm.update import Params


@dataclass
class _Request:
    client: int
    params: Params
    batch: dict[str, torch.Tensor]
    logits: torch.Tensor | None = None
    error: BaseException | None = None


class ForwardGather:
    """The meeting point of a group of ``members`` client threads; ``leave`` when a client is done (also on error)."""

    def __init__(self, classifier: Classifier, members: int) -> None:
        self.clf = classifier
        self.members = members
        self.pending: list[_Request] = []
        self.calls = 0  # backbone calls made for the group
        self.requests = 0  # forward requests served (= the calls the clients would have made alone)
        self._cv = threading.Condition()

    def logits(self, client: int, params: Params, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Class logits of ``params`` on ``batch``, computed together with the group's other waiting requests."""
        req = _Request(client, params, batch)
        with self._cv:
            self.pending.append(req)
            self._run_if_complete()
            while req.logits is None and req.error is None:
                self._cv.wait()
        if req.error is not None:
            raise RuntimeError(f"the group's shared forward failed: {req.error}") from req.error
        return req.logits

    def leave(self) -> None:
        with self._cv:
            self.members -= 1
            self._run_if_complete()

    def _run_if_complete(self) -> None:
        """Under the lock: run the pending requests once every member still training has one."""
        if not self.pending or len(self.pending) < self.members:
            return
        reqs = sorted(self.pending, key=lambda r: r.client)
        self.pending = []
        try:
            with torch.inference_mode():
                outs = self.clf.logits_many([(r.params, r.batch) for r in reqs])
        except Exception as e:  # noqa: BLE001 - every waiting client learns of it and fails its own round
            for r in reqs:
                r.error = e
        else:
            for r, out in zip(reqs, outs):
                r.logits = out
        self.calls += 1
        self.requests += len(reqs)
        self._cv.notify_all()
