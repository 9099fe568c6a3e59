"""LoRA-SB (Ponkshe, Singhal et al. 2024, "Initialization using update approximation is a silver bullet for
extreme efficient low-rank fine-tuning"): fixed factors B [d_out, r] and A [r, d_in] with a trainable r x r matrix R
between them, ΔW = s·B R A (s = alpha / r = 1, as the authors set alpha = r), the adapter of Fed-SB.

The initialisation approximates the first step of full fine-tuning (Sec. 4 of the LoRA-SB paper; the authors'
``utils/gradient_utils.py`` and ``utils/initialization_utils.py``): the loss gradient G of every adapted module's base
weight on ``init_examples`` training examples (their scripts: 2), the update ΔW = −η·sign(G) of a step of size
``init_step`` (theirs: lr / (warmup_ratio · total steps)), and its rank-r truncated SVD ΔW ≈ U_r S_r V_rᵀ, so that
B = U_r, R = S_r, A = V_rᵀ: the initial model is W + B R A, the first step already taken. Differences, each without
effect on the subspace: an exact SVD in float64 where they call the randomised ``torch.svd_lowrank`` (q = r, 10
iterations, after seeding torch's global generator) and round to bfloat16; the examples are a seeded draw from the
training set (theirs: the first batch of a shuffled loader). Without training examples (a saved run scoring new
texts) the tensors keep their seeded draw: only their shapes are read then.

The injected PEFT LoRA layers carry A and B R as their two factors (one matrix product of r x r more per module and
forward); tensors travel as ``<module>.lora_A.weight``, ``<module>.lora_B.weight`` (both fixed: ``fixed``) and
``<module>.lora_R.weight`` (trained); PEFT export writes the equivalent plain LoRA (A, B R).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.base import ADAPTERS, HeadSlices, Params
from fedpeft.adapters.lora import Lora
from fedpeft.backbones.loading import Backbone
from fedpeft.comm.lora_pairs import LATENT, A, B
from fedpeft.lazy import lazy

torch = lazy("torch")


class LoraSBSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    r: int = Field(16, ge=1, description="rank: R is r x r, the only trained (and uploaded) tensor of a module")
    target_modules: list[str] | None = Field(None, description="module name suffixes, or ['all-linear']; default: "
                                                               "the q/k/v projections of every attention block")
    init_examples: int = Field(2, ge=1, description="training examples whose loss gradient initialises B, R, A "
                                                    "(the authors' scripts: 2)")
    init_step: float = Field(1e-4, gt=0, description="step size η of the approximated first update ΔW = −η·sign(G) "
                                                     "(the authors: lr / (warmup_ratio · total training steps))")


@ADAPTERS.register("lora_sb", "LoRA-SB: fixed B, A from the SVD of an approximated first full-fine-tuning step, a "
                   "trainable r x r R between them (Fed-SB's adapter)", LoraSBSettings)
class LoraSB(Lora):
    name = "lora_sb"

    @property
    def alpha(self) -> float:
        return float(self.cfg.r)  # s = alpha / r = 1

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params:
        """The shapes, seeded: A as LoRA's, B = 0, R = 0 (``initialise`` replaces them from the gradient)."""
        params = super().init(backbone, generator)
        for name in self.modules(backbone):
            params[name + LATENT] = torch.zeros(self.cfg.r, self.cfg.r)
        return params

    def initialise(self, objective, params: Params, generator: torch.Generator) -> Params:
        """B, R, A from the rank-r SVD of −η·sign(G), G the loss gradient of each adapted base weight on
        ``init_examples`` training examples drawn with ``generator`` (the readout's initial tensors in place)."""
        examples = list(getattr(objective.task, "train", None) or [])
        if not examples:
            return params
        backbone = objective.backbone
        pick = torch.randperm(len(examples), generator=generator)[: self.cfg.init_examples].tolist()
        batch = objective.batch(objective.encode([examples[i] for i in pick]), list(range(len(pick))))
        weights = {}
        for name in self.modules(backbone):
            w = backbone.model.get_submodule(name).base_layer.weight
            if not w.is_floating_point():
                raise ValueError("model.quantization: LoRA-SB's initialisation needs the gradient of float base "
                                 "weights; quantized ones have none")
            weights[f"{name}.base_layer.weight"] = w.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            objective.loss(objective.outputs(params, batch, weights), batch).backward()
        out = dict(params)
        r = self.cfg.r
        for name in self.modules(backbone):
            grad = weights[f"{name}.base_layer.weight"].grad
            delta = -self.cfg.init_step * torch.sign(grad.detach().double().cpu())
            u, s, vh = torch.linalg.svd(delta, full_matrices=False)
            out[name + B] = u[:, :r].float().contiguous()
            out[name + LATENT] = torch.diag(s[:r]).float()
            out[name + A] = vh[:r].float().contiguous()
        return out

    def fixed(self, params: Params) -> list[str]:
        """B and A: only R is trained."""
        return sorted(k for k in params if k.endswith(A) or k.endswith(B))

    def _as_lora(self, params: Params) -> Params:
        """The plain LoRA factors of the same update: A and B R (R folded into B)."""
        out = {k: v for k, v in params.items() if not k.endswith(LATENT)}
        for k, v in params.items():
            if k.endswith(LATENT):
                b = k[: -len(LATENT)] + B
                out[b] = params[b].to(v) @ v
        return out

    def overrides(self, params: Params) -> Params | None:
        return super().overrides(self._as_lora(params))

    def merged(self, backbone: Backbone, params: Params) -> Params | None:
        return super().merged(backbone, self._as_lora(params))

    def to_peft(self, backbone: Backbone, params: Params, task_type: str):
        """PEFT's plain LoRA with A and B R as its factors (the same update; PEFT has no LoRA-SB type)."""
        return super().to_peft(backbone, self._as_lora(params), task_type)

    def head_slices(self, backbone: Backbone) -> HeadSlices:
        return {}  # B is fixed: no head's slice of it is trained or pruned
