"""Vectorised clients (``runtime.client_batch``): the model calls of several clients in one backbone call.

The embedded runtime runs a group of k clients of a round in k threads that share one ``ForwardGather``; each
client's ``BlackBox`` (forward-only trainers) or gradient step (``trainers.gradient``) hands its request to it
instead of calling the model. Once every client of the group that is still training has one request waiting, the
last to arrive runs them all as one forward (``Classifier.logits_stacked``, requests in client-id order) and wakes the
others. So the j-th backbone call of a group always holds the j-th request of every client that makes at least j:
which requests go together does not depend on thread timing, and a rerun gives the same numbers. Against running
the clients one after another the logits agree up to float rounding (the rows are padded to a common width and
multiplied in one larger batch, or sorted by length and cut into ``runtime.client_batch_passes`` passes); on CPU
the default runs each request on its own forward, bitwise equal to sequential clients (a larger matrix is no
cheaper per row there; ``Classifier.logits_stacked``). Requests that cannot share a forward (LoRA's and
full fine-tuning's replaced weights, deep prompts' key/value inputs, calibration rows) run one forward each.

Gradient requests (``loss_and_backward``) carry each client's loss on its logits; the group's losses are summed
and ONE backward pass fills every client's own leaf tensors with its own gradient (client i's loss does not depend
on client j's tensors, and rows of a batch do not interact). Each client's optimiser step, clipping and search stay
in its thread; only model calls are shared.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from fedpeft.model.classifier import Classifier
from fedpeft.comm.update import Params
from fedpeft.lazy import lazy

torch = lazy("torch")


@dataclass
class _Request:
    client: int
    params: Params
    batch: dict[str, torch.Tensor]
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None  # gradient request: logits -> scalar loss
    static: Params | None = None  # backbone weights replaced for this client (a forward of its own)
    logits: torch.Tensor | None = None
    loss: float | None = None
    error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.logits is not None or self.loss is not None or self.error is not None


class ForwardGather:
    """The meeting point of a group of ``members`` client threads; ``leave`` when a client is done (also on error)."""

    def __init__(self, classifier: Classifier, members: int, passes: int | None = None) -> None:
        self.clf = classifier
        self.members = members
        self.passes = passes  # forwards per group call (``Classifier.logits_stacked``; None: the device's default)
        self.pending: list[_Request] = []
        self.calls = 0  # backbone calls made for the group (one per request where they cannot share one)
        self.requests = 0  # forward requests served (= the calls the clients would have made alone)
        self._cv = threading.Condition()

    def logits(self, client: int, params: Params, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Class logits of ``params`` on ``batch``, computed together with the group's other waiting requests."""
        return self._wait(_Request(client, params, batch)).logits

    def loss_and_backward(self, client: int, params: Params, batch: dict[str, torch.Tensor],
                          loss_fn: Callable[[torch.Tensor], torch.Tensor], static: Params | None = None) -> float:
        """``loss_fn(logits)`` of ``params`` (leaf tensors that require grad) on ``batch``; on return their ``.grad``
        holds this client's gradient, from one forward and one backward shared with the group's other requests."""
        return self._wait(_Request(client, params, batch, loss_fn, static)).loss

    def _wait(self, req: _Request) -> _Request:
        with self._cv:
            self.pending.append(req)
            self._run_if_complete()
            while not req.done:
                self._cv.wait()
        if req.error is not None:
            raise RuntimeError(f"the group's shared forward failed: {req.error}") from req.error
        return req

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
            if any(r.loss_fn is not None for r in reqs):
                self._backward(reqs)
            else:
                with torch.inference_mode():
                    outs = self._forward(reqs)
                for r, out in zip(reqs, outs):
                    r.logits = out
        except Exception as e:  # noqa: BLE001 - every waiting client learns of it and fails its own round
            for r in reqs:
                r.error, r.logits, r.loss = e, None, None
        self.requests += len(reqs)
        self._cv.notify_all()

    def _backward(self, reqs: list[_Request]) -> None:
        """One forward over every request's rows (a forward per request where one replaces backbone weights), the
        sum of the clients' losses, one backward."""
        if any(r.loss_fn is None for r in reqs):
            raise ValueError("a group mixes gradient and forward-only requests")
        with torch.enable_grad():
            outs = self._forward(reqs)
            losses = [r.loss_fn(out) for r, out in zip(reqs, outs)]
            torch.stack(losses).sum().backward()
        for r, loss in zip(reqs, losses):
            r.loss = float(loss.detach())

    def _forward(self, reqs: list[_Request]) -> list[torch.Tensor]:
        """The requests' logits from one stacked backbone call, or from one call each where they cannot share one
        (weights replaced, extra model inputs, the CPU default); ``calls`` counts the backbone calls made."""
        stacked = None if any(r.static for r in reqs) else \
            self.clf.logits_stacked([(r.params, r.batch) for r in reqs], self.passes)
        if stacked is not None:
            self.calls += 1
            return stacked
        self.calls += len(reqs)
        return [self.clf.logits(r.params, r.batch, r.static) for r in reqs]
