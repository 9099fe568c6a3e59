"""Quant-b download (Eqs. 17-18): each prompt value rounded to 2k+1 levels of its row's scale beta = max|p_t|,
codes bit-packed (b bits each) plus one float16 beta per row: (D x b + 16) x T bits."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.comm.prompt_compression import dequantize, quantize
from fedpeft.comm.update import Params
from fedpeft.downlink.base import DOWNLINKS, SEP, DownlinkBase

PROMPT = "prompt"
CODES, BETA = PROMPT + SEP + "codes", PROMPT + SEP + "beta"


class QuantSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bits: int = Field(3, ge=2, le=8, description="b, bits per value (paper: 3)")


@DOWNLINKS.register("quant", "Quant-b: per-row scaled b-bit quantisation of the prompt", QuantSettings)
class QuantDownload(DownlinkBase):
    adapters = frozenset({"token_prompt", "soft_prompt"})
    keys = (PROMPT,)

    def wire_overrides(self) -> tuple[tuple[str, str], ...]:
        return ((BETA, "float16"),)

    def encode(self, new: Params, prev: Params) -> tuple[Params, Params]:
        packed, beta = quantize(new[PROMPT], self.settings.bits)
        message = {CODES: packed, BETA: beta}
        return self.decode(message, prev), message

    def decode(self, message: Params, prev: Params) -> Params:
        beta = message[BETA]
        shape = (beta.shape[0], self.ctx.table().shape[1])
        return {PROMPT: dequantize(message[CODES], beta, shape, self.settings.bits)}
