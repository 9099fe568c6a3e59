"""Per-client persistent state on the client side: one safetensors file per (client, round).

Lives in the node's state dir (``--node-config "state-dir=..."``; in simulation the run directory's
``client_state/``), under a per-run key. Keeping the state of each round, not just the latest,
makes ``--resume`` exact: a resumed round ``r`` reads the newest state from a round ``< r`` (for
training) or ``<= r`` (for evaluation), so a state written by a crashed attempt after the server's
last checkpoint is never read before it is overwritten. Files older than the newest one at or
before the server's last checkpoint are pruned.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedpeft.comm.codec import Message, decode, encode, own_dtypes


class ClientStateStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _dir(self, client_id: int) -> Path:
        return self.root / f"client_{client_id}"

    def _rounds(self, client_id: int) -> dict[int, Path]:
        d = self._dir(client_id)
        if not d.is_dir():
            return {}
        return {int(p.stem.removeprefix("round_")): p for p in d.glob("round_*.safetensors")}

    def load(self, client_id: int, at_most_round: int) -> Message:
        """The newest state saved at a round ``<= at_most_round`` (empty Message if none)."""
        rounds = [r for r in self._rounds(client_id) if r <= at_most_round]
        if not rounds:
            return Message()
        return decode(self._rounds(client_id)[max(rounds)].read_bytes())

    def save(self, client_id: int, round: int, state: Message) -> None:
        """Write atomically (temp file + rename), so a killed node never leaves half a state."""
        d = self._dir(client_id)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".round_{round}.tmp"
        tmp.write_bytes(encode(state, own_dtypes(state)))
        os.replace(tmp, d / f"round_{round}.safetensors")

    def prune(self, client_id: int, checkpointed_round: int) -> None:
        """Drop states older than the newest one at or before the server's last checkpoint."""
        rounds = self._rounds(client_id)
        base = [r for r in rounds if r <= checkpointed_round]
        if not base:
            return
        for r, p in rounds.items():
            if r < max(base):
                p.unlink(missing_ok=True)
