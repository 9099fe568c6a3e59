"""FullDownload: the aggregated prompt itself in float16 (T x D x 16 bits); the server keeps the float16-rounded
prompt as p', so the rows every client starts from are the server's bit for bit (spec §7.10)."""

from __future__ import annotations

from fedpeft.comm.update import Params
from fedpeft.downlink.base import DOWNLINKS, SEP, DownlinkBase

PROMPT = "prompt"
FULL16 = PROMPT + SEP + "full16"


@DOWNLINKS.register("full16", "FullDownload: the global prompt in float16, stored rounded on the server")
class FullDownload(DownlinkBase):
    adapters = frozenset({"token_prompt", "soft_prompt"})
    keys = (PROMPT,)

    def wire_overrides(self) -> tuple[tuple[str, str], ...]:
        return ((FULL16, "float16"),)

    def encode(self, new: Params, prev: Params) -> tuple[Params, Params]:
        half = new[PROMPT].half()
        return {PROMPT: half.float()}, {FULL16: half}

    def decode(self, message: Params, prev: Params) -> Params:
        return {PROMPT: message[FULL16].float()}
