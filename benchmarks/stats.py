"""The statistics every results file uses, in one place: mean ± std cells, paired 95 % t-intervals over seeds (with
the pairs that mix devices counted), normal intervals of per-item differences (two runs on the same items), Welch
intervals for unpaired runs (fedpeft against an authors' code), the standard error of an accuracy, and the bootstrap
interval of a mean.

A contrast between two arms is read from paired seeds (the same partition, initial adapter and client sample within
a seed): the differences d_s, their mean and a Student-t interval with n - 1 degrees of freedom. A pair whose two runs
ran on different devices (a CPU run against a GPU run of float16-rounded weights) is counted in the cell, so that a
reader sees how many of the n pairs mix devices.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np


def mean_std(xs: Sequence, scale: float = 100.0, digits: int = 1) -> str:
    """'m ± s' of the non-missing values (scaled), 'm' for one value, '–' for none."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    m = statistics.fmean(xs) * scale
    return f"{m:.{digits}f} ± {statistics.stdev(xs) * scale:.{digits}f}" if len(xs) > 1 else f"{m:.{digits}f}"


def t95(n: int) -> float:
    """Two-sided 95 % Student-t quantile with n - 1 degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def paired_ci(d: Sequence[float]) -> tuple[float, float, float] | None:
    """(mean, low, high) of paired differences with a 95 % t-interval (None below 2 pairs)."""
    if len(d) < 2:
        return None
    m = statistics.fmean(d)
    half = t95(len(d)) * statistics.stdev(d) / math.sqrt(len(d))
    return m, m - half, m + half


def paired_cell(d: Sequence[float], mixed: int = 0) -> str:
    """'+m [+lo, +hi] (n=k)' of paired differences already in points; '+x (n=1)' for one pair, '–' for none;
    ``mixed``: how many of the pairs put runs of two devices against each other (said in the cell)."""
    ci = paired_ci(d)
    note = f"; {mixed} CPU–GPU" if mixed else ""
    if ci is None:
        return "–" if not d else f"{d[0]:+.1f} (n=1{note})"
    return f"{ci[0]:+.1f} [{ci[1]:+.1f}, {ci[2]:+.1f}] (n={len(d)}{note})"


def items_cell(d: Sequence[float]) -> str:
    """'+m [+lo, +hi] (n=k)' of per-item paired differences already in points (two runs scored on the same items:
    hundreds of them, so the normal quantile, as lm-eval's standard errors), '–' below 2 items."""
    if len(d) < 2:
        return "–"
    m, se = statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d))
    return f"{m:+.1f} [{m - 1.96 * se:+.1f}, {m + 1.96 * se:+.1f}] (n={len(d)})"


def welch_ci(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float] | None:
    """(mean(a) - mean(b), low, high): a 95 % Welch t-interval for two unpaired samples (runs whose seeds mean
    nothing to each other, as fedpeft's and an authors' code's), None below 2 values on either side."""
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy.stats import t

    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    m = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        return m, m, m
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = float(t.ppf(0.975, df)) * math.sqrt(va + vb)
    return m, m - half, m + half


def welch_cell(a: Sequence[float], b: Sequence[float]) -> str:
    """'+m [+lo, +hi] (n=ka vs kb, unpaired)' in points (values already in points); the bare difference of the
    means below 2 values a side, '–' when a side has none."""
    if not a or not b:
        return "–"
    ci = welch_ci(a, b)
    if ci is None:
        return f"{statistics.fmean(a) - statistics.fmean(b):+.1f} (n={len(a)} vs {len(b)}, no interval)"
    return f"{ci[0]:+.1f} [{ci[1]:+.1f}, {ci[2]:+.1f}] (n={len(a)} vs {len(b)}, unpaired)"


def resolved(d: Sequence[float]) -> str:
    """How a paired interval reads: 'above 0', 'below 0' or 'not resolved' (fewer than 2 pairs: 'one pair')."""
    ci = paired_ci(d)
    if ci is None:
        return "one pair" if d else "no pairs"
    return "above 0" if ci[1] > 0 else "below 0" if ci[2] < 0 else "not resolved"


def accuracy_se(n: int, p: float = 0.5) -> float:
    """Standard error of one accuracy on n test examples, in points (p = 0.5: the largest it can be)."""
    return math.sqrt(p * (1 - p) / n) * 100


def bootstrap_ci(xs: Sequence[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float, float] | None:
    """(mean, low, high): the mean of ``xs`` with a 95 % percentile bootstrap interval (per-example scores of a
    corpus metric, per-client scores); None for no values."""
    x = np.asarray([v for v in xs if v is not None], dtype=np.float64)
    if not len(x):
        return None
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    means = x[idx].mean(1)
    return float(x.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))
