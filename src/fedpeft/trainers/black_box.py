"""BBT / FedBPT clients as a local trainer: CMA-ES over the projected prompt z, forward passes only.

The exchange is a search distribution (``formats.distribution``): the instruction carries the mean z_t,
the step size sigma_t and C_t; the client runs I local iterations (FedBPT Alg. 1 C1-C10,
``trainers.cmaes.local_cmaes``) through the forward-only ``BlackBox`` and returns its final (z^k, sigma^k, C^k),
its loss and the I step sizes it used; the format uploads z^k with the loss and, against the server-level CMA-ES
(an aggregator that ``needs`` the step sizes), the step sizes (spec §2.5 S7), against FedAvg the distribution,
which the server averages (FedAvg-BBT, spec §2.7).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field

from fedpeft.model.blackbox import BlackBox
from fedpeft.backbones.encoding import Encoded
from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Params, Update
from fedpeft.formats.distribution import Z, DistributionFormat, cov_from
from fedpeft.lazy import lazy
from fedpeft.perturbation import prompt_span, replacement_vocab, text_span
from fedpeft.rng import SHARED, numpy_rng
from fedpeft.trainers.base import DISTRIBUTION, TRAINERS, TrainerBase, TrainerContext
from fedpeft.trainers.cmaes import CMAESSettings, CMAState, Covariance, LocalResult, local_cmaes

torch = lazy("torch")

Noise = Literal["independent", "shared", "shared_round"]


class CMAESTrainerSettings(CMAESSettings):
    covariance: Covariance = Field("full", description="model of C on clients and server and on the wire: full "
                                                       "d x d, diagonal (C kept diagonal everywhere), or none "
                                                       "(C = I everywhere, spec A23)")
    server_fitness: Literal["clean", "ratio"] = Field("clean", description="uploaded loss: clean F^k of the final "
                                                                           "mean (paper, Alg. 1) or its perturbation "
                                                                           "ratio (authors' fedbpt_train.py)")
    noise: Noise = Field("independent", description="CMA-ES sampling noise: own stream per (round, client); shared "
                                                    "by all clients and rounds (authors' code: pycma reseeded "
                                                    "every round); or shared by the clients of a round")
    evaluate_start: bool = Field(False, description="also report the clean loss of the incoming mean")


def uploaded_loss(res: LocalResult, server_fitness: str) -> float:
    """The loss the server ranks clients by (spec A12, C9).

    ``clean``: F^k(z_{t+1}^k), the mean CE over the local training set at the final local mean (Alg. 1, C9).
    ``ratio``: what the authors' client uploads (``research/fed-bpt/src/fedbpt_train.py``, "Generate solutions
    uploaded to the server", lines 329-348, sent as ``fitnesses``, line 366): ``fitnesses_orig / fitnesses_pert`` at
    ``local_es.mean``, i.e. the mean CE on the clean local set over the mean CE on its perturbed copy
    (``LMForwardAPI.eval`` / ``eval_perturb``, ``CrossEntropyLoss(reduction="mean")``), the same copy the round's
    local iterations used (drawn once per round, line 291), and the clean loss when ``--perturb 0``. Here:
    ``LocalResult.ratio_loss`` (``ratio_form``, with the last iteration's perturbation; ``perturb_resample:
    round`` and ``perturb_scope: all`` give the code's quantity, up to the ``eps`` floor and the replacement
    vocabulary, which excludes special tokens here); the clean loss without perturbation.
    """
    if server_fitness == "ratio" and not np.isnan(res.ratio_loss):
        return res.ratio_loss
    return res.clean_loss


def cmaes_streams(seed: int, round: int, client: int, noise: str) -> tuple[np.random.Generator,
                                                                          np.random.Generator]:
    """(perturbation stream, sampling-noise stream) of one client's round.

    Two streams, so that the perturbation draws do not shift the sampling noise: FedBPT, its r_p = 0 variant and
    FedAvg-BBT draw the same candidates' noise at the same (seed, round, client), common random numbers for their
    paired comparison. ``independent``: noise from (seed, round, client). ``shared`` reproduces the authors'
    common random numbers: their client re-creates pycma every round with the fixed ``seed`` option
    (``fedbpt_train.py`` line 232, ``global_es._copy_light(inopts={"seed": seed, ...})``) and pycma's
    constructor calls ``np.random.seed(opts['seed'])`` (``cma/evolution_strategy.py``,
    ``CMAEvolutionStrategy.__init__``), whose global RNG draws all samples: every client draws the same noise in
    every round. Here the noise stream derives from the seed alone (neither client nor round);
    ``shared_round`` keeps the common noise across clients only. Perturbations stay per client.
    """
    perturbations = numpy_rng(seed, round, client, "cmaes-perturb")
    if noise == "independent":
        return perturbations, numpy_rng(seed, round, client, "cmaes")
    return perturbations, numpy_rng(seed, round if noise == "shared_round" else 0, SHARED, "cmaes-noise")


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.double().cpu().numpy()


@TRAINERS.register("cmaes", "local CMA-ES on a projected prompt, forward passes only (BBT / FedBPT)",
                   CMAESTrainerSettings)
class CMAESTrainer(TrainerBase):
    forward_only = True
    kind = DISTRIBUTION
    vectorised = True
    adapters = frozenset({"projected_prompt"})
    scalars = ("train_loss",)
    provides = frozenset({"train_loss", "loss", "sigmas"})

    def __init__(self, settings: CMAESTrainerSettings, ctx: TrainerContext) -> None:
        super().__init__(settings, ctx)
        self.d = ctx.adapter_settings.intrinsic_dim
        self.sigma0 = ctx.adapter_settings.sigma0
        self.upload_distribution = "sigmas" not in ctx.needs  # the server CMA-ES keeps C itself
        self._perturb_data: tuple[np.ndarray, object] | None = None

    def update_format(self) -> DistributionFormat:
        """The search distribution down, z^k with its loss and (sigma^k, C^k) or its step sizes up."""
        return DistributionFormat(self.d, self.sigma0, self.settings.covariance, self.settings.iterations,
                                  self.upload_distribution)

    # ---------------------------------------------------------------- local training

    def _perturbation_inputs(self):
        if self._perturb_data is None:
            clf = self.clf
            span = (prompt_span(clf) if clf.kind == "generation"
                    else text_span(clf.backbone, clf.task, clf.readout, self.ctx.max_length))
            self._perturb_data = (replacement_vocab(clf.backbone), span)
        return self._perturb_data

    def fit(self, params: Params, instruction: Message, client: ClientContext, round: int,
            state: Params, frozen=None, static=None, penalty=None) -> tuple[Update, Params]:
        """C1-C10: local CMA-ES from the global (m, sigma, C); upload z^k, the loss and sigmas or (sigma, C)."""
        if frozen or static or penalty:
            raise ValueError("method.trainer.name: 'cmaes' searches the whole of z; it cannot freeze parts of it")
        s = self.settings
        start = CMAState(_f64(params[Z]), float(instruction.scalars["sigma"]), cov_from(instruction.tensors, self.d))
        vocab, span = self._perturbation_inputs() if s.perturb_rate > 0 else (None, None)
        box = BlackBox(self.clf, batched=s.batched, max_rows=s.max_rows, gather=client.forward,
                       client=client.client_id)
        rng, noise_rng = cmaes_streams(client.seed, round, client.client_id, s.noise)
        res = local_cmaes(box, client.train, start, s, rng, vocab, span, evaluate_start=s.evaluate_start,
                          covariance=s.covariance, noise_rng=noise_rng)
        upload = uploaded_loss(res, s.server_fitness)
        scalars = {"train_loss": res.clean_loss, **res.usage, "final_sigma": float(res.state.sigma)}
        if s.perturb_rate > 0:
            scalars |= {"ratio_loss": res.ratio_loss, "replaced_share": res.replaced_share}
        if s.evaluate_start:
            scalars["start_loss"] = res.first_loss
        tensors = {Z: torch.from_numpy(res.state.mean), "sigma": torch.tensor([res.state.sigma], dtype=torch.float64),
                   "cov": torch.as_tensor(res.state.cov)}
        aux = {"loss": torch.tensor([upload], dtype=torch.float64), "sigmas": torch.from_numpy(res.sigmas)}
        return Update(client.client_id, tensors, client.num_examples, aux, scalars), {}

    # ---------------------------------------------------------------- evaluation through the black box

    def evaluate(self, params: Params, data: Encoded, predictions: bool = False) -> dict[str, Any]:
        return BlackBox(self.clf, max_rows=self.ctx.eval_batch).metrics(params[Z].float(), data, predictions)

    def diagnostics(self, glob: Params) -> dict[str, float]:
        return {"sigma": float(glob["sigma"][0])} if "sigma" in glob else {}
