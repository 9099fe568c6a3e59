"""Word-analogy download (Alg. 2, Eqs. 8-11): per position, the residual of the aggregated prompt against the
previous broadcast p'_{-1} as Phi (uint16 token id, float16 coefficient) pairs: T x 2 Phi x 16 bits.

Two LASSO stages (keep the top L_1 = 100, then the top Phi by |coefficient|) and a least-squares refit, with
scikit-learn's ``Lasso`` at alpha' = alpha / (2D), which makes its objective the paper's Eq. 8 divided by 2D
(``fedpeft.comm.prompt_compression``). Both sides rebuild p' = p'_{-1} + sum coef e(id) from the float16
coefficients, so the server and every client hold the same p' bit for bit (spec §7.10).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.comm.prompt_compression import analogy_compress, analogy_reconstruct
from fedpeft.comm.token_index import index_dtype
from fedpeft.comm.update import Params
from fedpeft.downlink.base import DOWNLINKS, SEP, DownlinkBase
from fedpeft.downlink.sync import full_name

PROMPT = "prompt"
IDS, COEF = PROMPT + SEP + "ids", PROMPT + SEP + "coef"


class AnalogySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    phi: int = Field(5, ge=1, description="Phi, tokens per position in the download (paper: 3 or 5)")
    alpha: float = Field(0.2, ge=0, description="L1 weight of Eq. 8 in the paper's unnormalised objective "
                                                "(paper: 0.2; 0 = least squares in the selection stages)")
    stage1: int = Field(100, ge=1, description="L_1, tokens kept by the first LASSO stage (paper: 100)")


@DOWNLINKS.register("analogy", "word-analogy residual codec: Phi (token id, float16 coefficient) pairs per "
                    "position from a two-stage LASSO (personalized gradient-free prompt tuning)", AnalogySettings)
class AnalogyDownload(DownlinkBase):
    stateful = True
    adapters = frozenset({"token_prompt", "soft_prompt"})
    keys = (PROMPT,)

    def wire_overrides(self) -> tuple[tuple[str, str], ...]:
        return ((COEF, "float16"), (full_name(PROMPT), "float32"))  # the whole-p' fallback (sync.py) is exact

    def encode(self, new: Params, prev: Params) -> tuple[Params, Params]:
        table = self.ctx.table()
        s = self.settings
        ids, coef = analogy_compress(new[PROMPT] - prev[PROMPT], table, s.phi, s.alpha, s.stage1,
                                     exclude=self.ctx.special_ids)
        message = {IDS: ids.to(index_dtype(table.shape[0])), COEF: coef.half()}
        return self.decode(message, prev), message

    def decode(self, message: Params, prev: Params) -> Params:
        return {PROMPT: analogy_reconstruct(prev[PROMPT].float(), message[IDS].long(), message[COEF],
                                            self.ctx.table())}
