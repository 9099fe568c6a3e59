"""A CMA-ES search distribution as the exchanged update (FedBPT, spec §2.5 S5-S7 and §2.7).

The instruction carries the mean z_t (as ``mean``), the step size sigma_t and C_t as the covariance model sends
it (full d x d, its diagonal, or nothing: C = I); a client starts its local CMA-ES from them. Against the
server-level CMA-ES (an aggregator that needs the step sizes) a reply is z^k, its loss and the I step sizes it
used (S7); against FedAvg it is the whole local distribution (z^k, sigma^k, C^k) with the loss, which the server
averages (FedAvg-BBT). The trainer returns all of it; ``upload`` keeps what this federation sends.
"""

from __future__ import annotations

import numpy as np

from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.formats.base import ReplyFormat, Shapes
from fedpeft.lazy import lazy

torch = lazy("torch")

Z = "z"  # the projected prompt's tensor: the global mean


def cov_tensors(cov: np.ndarray | torch.Tensor, mode: str) -> dict[str, torch.Tensor]:
    """C as it travels: ``cov`` (full), ``cov_diag`` (its diagonal) or nothing."""
    cov = torch.as_tensor(cov)
    if mode == "full":
        return {"cov": cov}
    if mode == "diagonal":
        return {"cov_diag": (cov if cov.dim() == 1 else torch.diagonal(cov)).contiguous()}
    return {}


def cov_from(tensors: dict[str, torch.Tensor], d: int) -> np.ndarray:
    """C_t as a d x d float64 array from the tensors it travels as (I where none travels)."""
    if "cov" in tensors:
        return tensors["cov"].double().cpu().numpy()
    if "cov_diag" in tensors:
        return np.diag(tensors["cov_diag"].double().cpu().numpy())
    return np.eye(d)


class DistributionFormat:
    """(mean, sigma, C) down; z^k with its loss and either (sigma^k, C^k) or the step sizes up."""

    def __init__(self, d: int, sigma0: float, covariance: str, iterations: int,
                 upload_distribution: bool) -> None:
        self.d, self.sigma0, self.covariance = d, sigma0, covariance
        self.iterations, self.upload_distribution = iterations, upload_distribution

    def send(self, shared: Params, broadcast: Message | None) -> Message:
        """S5: (z_t, sigma_t, C_t) from the global tensors or the aggregator's broadcast; sigma_0, I at first."""
        if broadcast is None:
            return Message(tensors={"mean": shared[Z]})
        source = shared | broadcast.tensors
        if "sigma" in broadcast.scalars:
            sigma = float(broadcast.scalars["sigma"])
        elif "sigma" in shared:
            sigma = float(shared["sigma"][0])
        else:
            sigma = self.sigma0
        cov = {k: source[k] for k in ("cov", "cov_diag") if k in source} or {"cov": torch.eye(self.d,
                                                                                           dtype=torch.float64)}
        tensors = {"mean": shared[Z]} | cov_tensors(next(iter(cov.values())), self.covariance)
        return Message(tensors=tensors, scalars={"sigma": sigma})

    def start(self, instruction: Message) -> Params:
        return {Z: instruction.tensors["mean"]}

    def upload(self, update: Update, received: Params) -> Update:
        """C9-C10: z^k and the loss; with (sigma^k, C^k) against FedAvg, with the step sizes against the server
        CMA-ES (which keeps C itself)."""
        t, aux = update.tensors, update.aux_tensors
        if self.upload_distribution:
            tensors = {Z: t[Z], "sigma": t["sigma"], **cov_tensors(t["cov"], self.covariance)}
            return Update(update.client, tensors, update.weight, {"loss": aux["loss"]}, update.scalars)
        return Update(update.client, {Z: t[Z]}, update.weight, {"sigmas": aux["sigmas"], "loss": aux["loss"]},
                      update.scalars)

    def reply(self, shared: Shapes) -> ReplyFormat:
        d = self.d
        if self.upload_distribution:
            cov = {"full": {"cov": (d, d)}, "diagonal": {"cov_diag": (d,)}, "none": {}}[self.covariance]
            return ReplyFormat({Z: (d,), "sigma": (1,), **cov}, {"loss": (1,)})
        return ReplyFormat({Z: (d,)}, {"sigmas": (self.iterations,), "loss": (1,)})

    def check(self, reply: Message) -> None:
        pass

    def decode(self, update: Update, shared: Params) -> Update:
        return update
