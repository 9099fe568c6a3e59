"""Projected prompt of Black-Box Tuning / FedBPT (spec §2.3): p = p_0 + A z with z in R^d, A in R^{D x d}.

``z`` is the only thing optimised and exchanged. ``A`` (D = m * hidden rows) is drawn from a shared
seed on every process, entries N(0, (alpha_A * sigma_emb / (sqrt(d) * sigma_0))^2) with sigma_emb the
std of all word-embedding entries (spec A3), and is never communicated. The prompt is *added* to
the word embeddings of m placeholder tokens inserted after the first special token (spec A4,
recommended form: on ``inputs_embeds``, not after the embedding LayerNorm as the authors' code does).

``z`` may carry a leading population axis ``[P, d]``: the batch of n rows is then tiled P times
(candidate-major) so that all CMA-ES candidates of an iteration run in ONE forward pass.

``placement``: ``prefix`` (the paper's, BBT's: the prompt right after [CLS]/<s>/BOS, so every text token attends
to it) or ``suffix`` (causal LMs with the verbalizer only, not in the paper): the prompt goes between the text
and its final token, ``text[:-1], p_1..p_m, text[-1]``, and the label word is still read at the final template
token. In a causal LM nothing before the prompt depends on z, so the text is a frozen prefix: with ``kv_cache``
it runs once to a key/value cache that all P candidates share (and later forwards on the same rows reuse, e.g.
the I local CMA-ES iterations scoring one local set), and each candidate runs only its m + 1 rows. The numbers
equal the uncached forward of the same suffix-placed sequence up to float rounding. Unlike the prefix, the
suffix prompt reaches the read position only through attention from the final token and the prompt rows' own
(text-dependent) states; the text's states never see it.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.adapters.base import ADAPTERS, AdapterBase, AdapterContext, FrozenText, Params, Prepared, insert_rows
from fedpeft.backbones.loading import Backbone
from fedpeft.lazy import lazy
from fedpeft.rng import SERVER, derive_seed

torch = lazy("torch")


class ProjectedPromptSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_tokens: int = Field(50, ge=1, description="prompt length L_p (placeholder tokens); paper code: 50")
    intrinsic_dim: int = Field(500, ge=1, description="d, the dimension of z (paper: 500)")
    sigma0: float = Field(1.0, gt=0, description="initial CMA-ES step size; also divides A's std (spec A3)")
    alpha_a: float = Field(1.0, gt=0, description="extra scale of A's std (authors' code: 1)")
    placeholder_start: int = Field(1000, ge=0, description="first vocabulary id of the placeholder tokens "
                                                           "(BBT: ids 1000..1000+L_p-1, specials skipped)")
    placeholder: Literal["vocab", "zeros"] = Field("vocab", description="p_0: placeholder word embeddings "
                                                                       "(BBT 'add' mode) or zeros")
    seed: int | None = Field(None, ge=0, description="projection seed; default: derived from the experiment "
                                                     "seed by the method (fedpeft.rng)")
    placement: Literal["prefix", "suffix"] = Field("prefix", description="prompt after the first special token "
                                                                         "(paper), or between the text and its final "
                                                                         "token (causal LMs, verbalizer; the text's "
                                                                         "key/value cache is shared by the candidates)")
    kv_cache: bool = Field(True, description="suffix placement: run the text once to a key/value cache and only the "
                                             "prompt rows + final token per candidate (false: whole sequences)")
    kv_cache_keep: int = Field(8, ge=0, description="suffix placement with kv_cache: text caches the process keeps "
                                                    "for later forwards on the same rows (least recently used out; "
                                                    "0: none kept or reused)")


def projection_std(sigma_emb: float, d: int, sigma0: float, alpha_a: float = 1.0) -> float:
    """std of A's entries: alpha_A * sigma_emb / (sqrt(d) * sigma_0) (spec §2.3, A3)."""
    return alpha_a * sigma_emb / (math.sqrt(d) * sigma0)


def build_projection(rows: int, d: int, std: float, seed: int) -> torch.Tensor:
    """A in R^{rows x d}, i.i.d. N(0, std^2), a pure function of ``seed`` (every client gets the same A)."""
    g = torch.Generator()
    g.manual_seed(int(seed))
    return torch.randn(rows, d, generator=g) * std


def placeholder_ids(backbone: Backbone, m: int, start: int) -> torch.Tensor:
    """m vocabulary ids from ``start`` upward, skipping special tokens (BBT's "randomly selected words")."""
    emb_rows = backbone.input_embeddings().weight.shape[0]
    special = set(backbone.tokenizer.all_special_ids)
    start = start if start + 2 * m < emb_rows else 0
    ids = [i for i in range(start, emb_rows) if i not in special][:m]
    if len(ids) < m:
        raise ValueError(f"method.adapter.num_tokens: {m} placeholders do not fit the vocabulary of {backbone.name}")
    return torch.tensor(ids)


@ADAPTERS.register("projected_prompt", "p = p_0 + A z: z in R^d through a fixed shared random projection "
                                       "(BBT / FedBPT)", ProjectedPromptSettings)
class ProjectedPrompt(AdapterBase):
    """Holds the (cached, never trained) projection; ``z`` comes in ``params``."""

    name = "projected_prompt"

    def __init__(self, cfg: ProjectedPromptSettings | None = None) -> None:
        super().__init__(cfg or ProjectedPromptSettings())
        self._seed: int | None = self.cfg.seed
        self._cache: dict[str, torch.Tensor] = {}

    # ---------------------------------------------------------------- shared projection

    def bind(self, ctx: AdapterContext) -> None:
        """Derive the shared projection seed from the run seed (unless ``method.adapter.seed`` pins one); the suffix
        placement needs a causal LM read by the verbalizer."""
        family = ctx.backbone.family if ctx.backbone is not None else None
        if self.cfg.placement == "suffix" and (family != "causal" or ctx.readout != "verbalizer"):
            got = f"{'an' if str(family)[:1] in 'aeiou' else 'a'} {family} model"
            raise ValueError(f"method.adapter.placement: 'suffix' needs a causal LM with the verbalizer readout "
                             f"(got {got}, readout {ctx.readout}); use prefix")
        self.bind_seed(derive_seed(ctx.seed, 0, SERVER, "projection"))

    def bind_seed(self, seed: int) -> None:
        """Set the shared projection seed (unless ``method.adapter.seed`` pins one); drops a cached A."""
        if self.cfg.seed is None and seed != self._seed:
            self._seed = int(seed)
            self._cache.clear()

    def projection(self, backbone: Backbone) -> torch.Tensor:
        """A [m*hidden, d] (float32), built once per process from the shared seed."""
        if "A" not in self._cache:
            if self._seed is None:
                raise ValueError("method.adapter.seed: the projection seed is unset (the method binds it "
                                 "from the experiment seed; set it when using projected_prompt directly)")
            table = backbone.input_embeddings().weight.detach()
            std = projection_std(float(table.float().std()), self.cfg.intrinsic_dim, self.cfg.sigma0,
                                 self.cfg.alpha_a)
            rows = self.cfg.num_tokens * table.shape[1]
            a = build_projection(rows, self.cfg.intrinsic_dim, std, self._seed)  # seeded on the CPU
            self._cache["A"] = a.to(table.device)
            ids = placeholder_ids(backbone, self.cfg.num_tokens, self.cfg.placeholder_start)
            p0 = table[ids.to(table.device)].float().clone()
            self._cache["p0"] = p0 if self.cfg.placeholder == "vocab" else torch.zeros_like(p0)
        return self._cache["A"]

    def prompt(self, backbone: Backbone, z: torch.Tensor) -> torch.Tensor:
        """p_0 + A z reshaped to [P, m, hidden] for z of shape [d] or [P, d]."""
        a = self.projection(backbone)
        zz = z.reshape(-1, self.cfg.intrinsic_dim).to(a.device, a.dtype)
        return self._cache["p0"].unsqueeze(0) + (zz @ a.T).view(zz.shape[0], self.cfg.num_tokens, -1)

    # ---------------------------------------------------------------- adapter contract

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params:
        """z_0 = 0 (authors' code; spec S2)."""
        return {"z": torch.zeros(self.cfg.intrinsic_dim)}

    def prepare(self, backbone, params, input_ids, attention_mask, lead) -> Prepared:
        prompt = self.prompt(backbone, params["z"]).to(backbone.input_embeddings().weight.dtype)  # [P, m, h]
        if self.cfg.placement == "suffix" and self.cfg.kv_cache:
            return self._cached_suffix(backbone, prompt, input_ids, attention_mask)
        pop, m, n = prompt.shape[0], prompt.shape[1], input_ids.shape[0]
        at = (attention_mask.sum(1) - 1).repeat(pop) if self.cfg.placement == "suffix" else lead  # suffix: per row
        embeds = backbone.input_embeddings()(input_ids).repeat(pop, 1, 1)  # candidate-major: [c*n:(c+1)*n] is c's
        embeds, attention_mask = insert_rows(embeds, attention_mask.repeat(pop, 1), prompt.repeat_interleave(n, dim=0),
                                             at)
        return Prepared(embeds, attention_mask, at, m)

    def _cached_suffix(self, backbone, prompt, input_ids, attention_mask) -> Prepared:
        """Suffix placement over a frozen text: the text without its final token runs once to a key/value cache
        (``Prepared.text``); per candidate only ``p_1..p_m, text[-1]`` run.

        Padding stays on the right: the cached text keeps the positions 0..L_i-2 it has in the whole sequence, and
        its pads (with the slot of the moved final token) are masked by the 2-D mask. The m + 1 rows get explicit
        position ids L_i-1, ..., L_i-1+m (rotary positions as in the whole sequence), while transformers places
        their queries after the whole cache (causal offset = cache length, ``DynamicLayer.get_mask_sizes``), so
        they attend to every real text token and causally to each other. Left padding would instead shift the
        text's own positions."""
        pop, m, n = prompt.shape[0], prompt.shape[1], input_ids.shape[0]
        rows = torch.arange(n, device=input_ids.device)
        last = attention_mask.sum(1) - 1
        width = int(last.max())
        text = attention_mask.clone()
        text[rows, last] = 0  # the final token moves behind the prompt
        text = text[:, :width]
        final = backbone.input_embeddings()(input_ids[rows, last]).unsqueeze(1).repeat(pop, 1, 1)  # [P*n, 1, h]
        embeds = torch.cat([prompt.repeat_interleave(n, dim=0), final], dim=1)
        ones = torch.ones(pop * n, m + 1, dtype=attention_mask.dtype, device=attention_mask.device)
        positions = (last.unsqueeze(1) + torch.arange(m + 1, device=last.device)).repeat(pop, 1)
        extra = {"attention_mask": torch.cat([text.repeat(pop, 1), ones], dim=1), "position_ids": positions,
                 "use_cache": False}
        frozen = FrozenText(input_ids[:, :width], text, pop, self.cfg.kv_cache_keep)
        # the readout sees the m + 1 rows only: the final token is the last attended one
        return Prepared(embeds, ones, 0, m, extra, frozen)
