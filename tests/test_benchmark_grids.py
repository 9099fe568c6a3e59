"""The benchmark scripts' shared statistics and the FedBPT grid: paired intervals by hand, and every planned job's
overrides resolve to a valid config (a renamed config key would otherwise surface hours into a benchmark)."""

import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    yield
    for name in ("runner", "fedbpt", "fedbpt_arms", "fedbpt_report"):
        sys.modules.pop(name, None)


def test_paired_interval_by_hand(bench):
    from runner import paired_cell, paired_ci

    mean, lo, hi = paired_ci([1.0, 2.0, 3.0])  # mean 2, sample sd 1, t(0.975, 2 df) = 4.302653
    half = 4.302653 / math.sqrt(3)
    assert mean == pytest.approx(2.0)
    assert (lo, hi) == (pytest.approx(2.0 - half, abs=1e-5), pytest.approx(2.0 + half, abs=1e-5))
    assert paired_cell([1.0, 2.0, 3.0]) == "+2.0 [-0.5, +4.5] (n=3)"
    assert paired_cell([-1.25]) == "-1.2 (n=1)" and paired_cell([]) == "–" and paired_ci([0.5]) is None


@pytest.mark.parametrize("argv", [
    [],
    ["--paper-scale"],
    ["--models", "smollm2", "--placement", "suffix", "--tasks", "sst2", "--alphas", "1.0"],
])
def test_every_fedbpt_job_resolves_to_a_valid_config(bench, argv):
    from fedbpt import parse
    from fedbpt_arms import overrides, plan

    from fedpeft.resolve import load_config

    args = parse(argv)
    jobs = plan(args)
    assert len(jobs) == len(set(jobs)) > 0
    for job in jobs:
        cfg = load_config(None, overrides(args, *job))
        model, task, part, arm, seed = job
        assert (cfg.model.name, cfg.task.name, cfg.seed) == (model, task, seed)
        assert cfg.federation.partition.scheme == ("iid" if part == "shared" else "dirichlet")
