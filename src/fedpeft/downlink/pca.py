"""PCA-n download (Eqs. 13-16): the prompt projected on the top-n principal directions of e(V), float16 [T, n]
(T x n x 16 bits); applied to the prompt itself, not to a residual."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.comm.prompt_compression import pca_basis, pca_compress, pca_reconstruct
from fedpeft.comm.update import Params
from fedpeft.downlink.base import DOWNLINKS, SEP, DownlinkBase, DownlinkContext
from fedpeft.lazy import lazy

torch = lazy("torch")

PROMPT = "prompt"
CODED = PROMPT + SEP + "pca"


class PCASettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    components: int = Field(10, ge=1, description="n principal directions (paper: PCA10, PCA300)")


@DOWNLINKS.register("pca", "PCA-n: the prompt on the top-n principal directions of e(V), float16", PCASettings)
class PCADownload(DownlinkBase):
    adapters = frozenset({"token_prompt", "soft_prompt"})
    keys = (PROMPT,)

    def __init__(self, settings: PCASettings, ctx: DownlinkContext) -> None:
        super().__init__(settings, ctx)
        self._basis: torch.Tensor | None = None

    def basis(self) -> torch.Tensor:
        if self._basis is None:
            table = self.ctx.table()
            if self.settings.components > table.shape[1]:
                raise ValueError(f"method.downlink.components: {self.settings.components} exceeds the embedding "
                                 f"dimension {table.shape[1]}")
            self._basis = pca_basis(table, self.settings.components)
        return self._basis

    def wire_overrides(self) -> tuple[tuple[str, str], ...]:
        return ((CODED, "float16"),)

    def encode(self, new: Params, prev: Params) -> tuple[Params, Params]:
        coded = pca_compress(new[PROMPT], self.basis())
        return {PROMPT: pca_reconstruct(coded, self.basis())}, {CODED: coded}

    def decode(self, message: Params, prev: Params) -> Params:
        return {PROMPT: pca_reconstruct(message[CODED], self.basis())}
