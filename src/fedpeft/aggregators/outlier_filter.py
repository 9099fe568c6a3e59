"""Reject clients whose uploaded prompt has an outlying mean or std before aggregating (FedPrompt §V, the
proposed defence; spec 003 §2.5).

Per update, the mean and std of all its float values (over the shared tensors, or of its delta w_k − w_t with
``statistic: delta``). Robust rule, as a single outlier among few clients cannot reach a plain z-score of 3
(max z = (n−1)/√n): a client is flagged when |s − median(s)| > z · 1.4826 · MAD(s) for either statistic
(1.4826·MAD estimates the std under normality; z = 3.5 is Iglewicz & Hoaglin's modified z-score threshold;
the scale never falls below 0.1% of the median std, so near-identical updates are not split by rounding).
Fewer than ``min_clients`` (5) updates are never filtered; if every client is flagged all are kept.
Dropped ids are logged at WARNING; ``diagnostics`` reports ``filtered`` (the count).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.aggregators.base import WRAPPERS, AggregatorWrapper, Params
from fedpeft.comm.update import Update
from fedpeft.lazy import lazy

torch = lazy("torch")

log = logging.getLogger(__name__)
FILTERED = "filtered"
MAD_TO_STD = 1.4826
RELATIVE_FLOOR = 1e-3  # scale floor, relative to the median std: deviations below 0.1% of it are noise


class OutlierFilterSettings(BaseModel):
    """``method.wrappers`` entry keys of ``outlier_filter``."""

    model_config = ConfigDict(extra="forbid")
    z: float = Field(3.5, gt=0, description="robust z: flag |s - median| > z * 1.4826 * MAD (3.5: Iglewicz & "
                                            "Hoaglin's modified z-score threshold)")
    min_clients: int = Field(5, ge=3, description="fewer updates than this are never filtered (the MAD of "
                                                  "fewer points is too noisy)")
    statistic: Literal["params", "delta"] = Field("params", description="statistics of the uploaded values "
                                                                        "(the paper) or of the client's delta")


def update_stats(glob: Params, u: Update, statistic: str = "params") -> tuple[float, float]:
    """(mean, std) of the update's float values over the shared tensors."""
    keys = sorted(k for k in glob if k in u.tensors and u.tensors[k].is_floating_point())
    if not keys:
        return 0.0, 0.0
    vals = [u.tensors[k].double().reshape(-1) - (glob[k].double().reshape(-1) if statistic == "delta" else 0)
            for k in keys]
    flat = torch.cat(vals)
    return float(flat.mean()), float(flat.std(correction=0))


def robust_outliers(values: Sequence[float], z: float, floor: float = 0.0) -> list[bool]:
    """|v − median| > z · max(1.4826 · MAD, floor)."""
    x = torch.tensor(list(values), dtype=torch.float64)
    med = x.median()  # lower median for even n; fine for a threshold rule
    dev = (x - med).abs()
    scale = max(MAD_TO_STD * float(dev.median()), floor, 1e-12)
    return [bool(d > z * scale) for d in dev]


def flag_outliers(glob: Params, updates: Sequence[Update], z: float, statistic: str = "params",
                  min_clients: int = 5) -> list[bool]:
    """One flag per update: its mean or its std is a robust outlier (no flag below ``min_clients`` updates)."""
    if len(updates) < max(min_clients, 3):
        return [False] * len(updates)
    stats = [update_stats(glob, u, statistic) for u in updates]
    stds = [s[1] for s in stats]
    floor = RELATIVE_FLOOR * float(torch.tensor(stds, dtype=torch.float64).median())  # MAD 0: near-equal updates
    by_mean = robust_outliers([s[0] for s in stats], z, floor)
    by_std = robust_outliers(stds, z, floor)
    return [a or b for a, b in zip(by_mean, by_std)]


@WRAPPERS.register("outlier_filter", "drop clients whose update mean or std is a robust outlier (median ± "
                   "z·MAD) before aggregating (FedPrompt §V)", OutlierFilterSettings)
class OutlierFilter(AggregatorWrapper):
    own_scalars = (FILTERED,)

    def transform(self, glob: Params, updates: Sequence[Update], round: int) -> list[Update]:
        s = self.settings if self.settings is not None else OutlierFilterSettings()
        flags = flag_outliers(glob, updates, s.z, s.statistic, s.min_clients)
        dropped = [u.client for u, f in zip(updates, flags) if f]
        if dropped and len(dropped) == len(updates):
            log.warning("round %d: outlier_filter flagged every client %s; keeping all", round, dropped)
            dropped = []
        elif dropped:
            log.warning("round %d: outlier_filter dropped clients %s", round, dropped)
        self._filtered = len(dropped)
        return [u for u in updates if u.client not in dropped]

    def round_scalars(self) -> dict[str, int]:
        return {FILTERED: int(self._filtered)}
