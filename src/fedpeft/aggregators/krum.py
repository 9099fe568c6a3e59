"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017, "Machine Learning with Adversaries: Byzantine Tolerant
Gradient Descent", Sec. 4: the Krum score and its m-Krum variant).

With n accepted updates, f of which may be Byzantine (requires n > 2f + 2), Δ_k = x_k − x_t flattened over all
shared tensors (sorted by name), and i → j meaning Δ_j is among the n − f − 2 updates closest to Δ_i (j ≠ i):

    s(i) = Σ_{i → j} ‖Δ_i − Δ_j‖²

Krum returns the update with the smallest score; Multi-Krum averages the m updates with the smallest scores.
Ties are broken by the lowest client id. As in Flower 1.41's ``Krum``/``MultiKrum`` (``select_multikrum`` then
``aggregate_arrayrecords``), the selected updates are averaged with their sample weights n_k
(``weighting: uniform`` gives the paper's plain mean); Flower's defaults are f = 0 and m = 1.
Distances are exact pairwise float64 sums over the deltas (Flower expands ‖a‖² + ‖b‖² − 2a·b in float32).
Stateless.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.aggregators.base import AGGREGATORS, PARAMS, AggregatorBase, AggregatorContext, Params, flatten, uploaded
from fedpeft.aggregators.fedavg import weighted_mean
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update
from fedpeft.lazy import lazy

torch = lazy("torch")


class KrumSettings(BaseModel):
    """``method.aggregator`` keys of ``krum``."""

    model_config = ConfigDict(extra="forbid")
    num_malicious: int = Field(0, ge=0, description="f, the number of Byzantine clients tolerated; needs "
                               "n > 2f + 2 updates per round (Flower: num_malicious_nodes = 0)")


class MultiKrumSettings(KrumSettings):
    """``method.aggregator`` keys of ``multi_krum``."""

    num_selected: int = Field(1, ge=1, description="m, the number of lowest-score updates averaged, m <= n "
                              "(Flower: num_nodes_to_select = 1, i.e. Krum)")
    weighting: Literal["num_examples", "uniform"] = Field(
        "num_examples", description="average the selected updates by sample count (Flower) or uniformly (paper)")


# ---------------------------------------------------------------- pure math (float64)


def check_counts(n: int, f: int, m: int = 1) -> None:
    """Blanchard et al.'s 2f + 2 < n, and 1 <= m <= n; errors name the offending setting."""
    if n < 2 * f + 3:
        raise ValueError(f"method.aggregator.num_malicious: Krum with f = {f} needs at least 2f + 3 = {2 * f + 3} "
                         f"updates per round, got {n}")
    if not 1 <= m <= n:
        raise ValueError(f"method.aggregator.num_selected: Multi-Krum cannot select m = {m} of {n} updates")


def pairwise_sq_distances(vecs: torch.Tensor) -> torch.Tensor:
    """D[i, j] = ‖v_i − v_j‖² for the rows of ``vecs`` (float64, exactly symmetric, zero diagonal)."""
    vecs = vecs.double()
    return torch.stack([((vecs - v) ** 2).sum(dim=1) for v in vecs]) if len(vecs) else torch.zeros(0, 0)


def krum_scores(vecs: torch.Tensor, f: int) -> torch.Tensor:
    """s(i) = sum of the n − f − 2 smallest ‖v_i − v_j‖², j ≠ i (Blanchard et al. Sec. 4)."""
    n = vecs.shape[0]
    check_counts(n, f)
    d = pairwise_sq_distances(vecs)
    k = n - f - 2
    scores = []
    for i in range(n):
        others = torch.cat([d[i, :i], d[i, i + 1:]])
        scores.append(torch.sort(others).values[:k].sum())
    return torch.stack(scores)


def multi_krum_select(vecs: torch.Tensor, f: int, m: int, ids: Sequence[int] | None = None) -> list[int]:
    """Row indices of the m lowest scores, ties broken by the lowest ``ids`` (default: the row index)."""
    n = vecs.shape[0]
    check_counts(n, f, m)
    scores = krum_scores(vecs, f).tolist()
    ids = list(range(n)) if ids is None else list(ids)
    return sorted(range(n), key=lambda i: (scores[i], ids[i]))[:m]


# ---------------------------------------------------------------- the registered aggregators


@AGGREGATORS.register("multi_krum", "Multi-Krum: average of the m updates with the lowest Krum scores "
                      "(Blanchard et al. 2017; Flower's MultiKrum)", MultiKrumSettings)
class MultiKrum(AggregatorBase):
    accepts = frozenset({PARAMS})
    needs = frozenset()

    def __init__(self, settings, ctx: AggregatorContext) -> None:
        super().__init__(settings, ctx)
        self.check_federation(settings, ctx.num_clients)

    @classmethod
    def check_federation(cls, settings, num_clients: int) -> None:
        f, m = settings.num_malicious, getattr(settings, "num_selected", 1)
        if num_clients < 2 * f + 3:
            raise ValueError(f"method.aggregator.num_malicious: f = {f} needs at least {2 * f + 3} "
                             f"clients, the federation has {num_clients}")
        if m > num_clients:
            raise ValueError(f"method.aggregator.num_selected: m = {m} exceeds the {num_clients} clients")

    @property
    def _f(self) -> int:
        return self.settings.num_malicious

    @property
    def _m(self) -> int:
        return getattr(self.settings, "num_selected", 1)

    def select(self, glob: Params, updates: Sequence[Update]) -> list[Update]:
        """The selected updates, in client-id order."""
        ups = sorted(updates, key=lambda u: u.client)
        keys = uploaded(glob, ups)
        base = flatten(glob, keys)
        vecs = torch.stack([flatten(u.tensors, keys) - base for u in ups]) if ups else torch.zeros(0, 0)
        chosen = multi_krum_select(vecs, self._f, self._m, [u.client for u in ups])
        return [ups[i] for i in sorted(chosen)]

    def aggregate(self, glob: Params, updates: Sequence[Update], state: Message, round: int):
        chosen = self.select(glob, updates)
        if len(chosen) == 1:
            return {k: chosen[0].tensors[k].float() for k in glob}, state
        uniform = getattr(self.settings, "weighting", "num_examples") == "uniform"
        weights = [1.0 if uniform else float(u.weight) for u in chosen]
        return weighted_mean([{k: u.tensors[k] for k in glob} for u in chosen], weights), state


@AGGREGATORS.register("krum", "Krum: the update with the lowest Krum score (Blanchard et al. 2017; Flower's "
                      "Krum)", KrumSettings)
class Krum(MultiKrum):
    """Multi-Krum with m = 1: the selected update itself."""

