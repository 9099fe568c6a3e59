"""Client workers (``runtime.client_workers``): a round's clients on forked processes sharing the backbone give
the records and the final state of the sequential run (same torch threads), persistent client states included."""

from __future__ import annotations

import pytest
import torch

from fedpeft.runtime.embedded import StopAfterRound, run_embedded
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS

pytestmark = pytest.mark.usefixtures("one_thread")


def _records(root):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in RunDir(root).read_metrics()]


def _same_runs(tmp_path, cfg_of) -> None:
    for n in (1, 2):
        run_embedded(cfg_of(n), tmp_path / f"w{n}")
    assert _records(tmp_path / "w2") == _records(tmp_path / "w1")
    (_, a, ca, _), (_, b, cb, _) = (RunDir(tmp_path / f"w{n}").load_checkpoint() for n in (1, 2))
    assert a.tensors.keys() == b.tensors.keys() and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
    assert ca.keys() == cb.keys() and all(torch.equal(ca[c].tensors[k], cb[c].tensors[k])
                                          for c in ca for k in ca[c].tensors)


@pytest.mark.parametrize("extra", [
    {"method__trainer__reset_optimizer": False},  # Adam moments kept in each client's state
    {"method__name": "fedpeptao", "method__adapter__num_tokens": 3, "method__sharing__warmup_rounds": 1,
     "federation__rounds": 3},  # private layers after the selection
    {"method__name": "fedbpt", "method__adapter__num_tokens": 3, "method__adapter__intrinsic_dim": 8,
     "method__trainer__iterations": 2, "method__trainer__max_steps": None, "method__trainer__batch_size": None},
    {"method__name": "discrete-prompt", "model__name": "tiny-llama", "method__adapter__num_tokens": 3,
     "method__trainer__steps": 2, "method__trainer__max_steps": None, "method__trainer__batch_size": None,
     "method__post_tuning__iterations": 3},
], ids=["fedprompt-adam-state", "fedpeptao", "fedbpt", "discrete-prompt"])
def test_workers_equal_the_sequential_run(tiny_cfg, tmp_path, extra):
    _same_runs(tmp_path, lambda n: tiny_cfg(runtime__client_workers=n, runtime__threads=1, **extra))


def test_workers_report_failures_and_resume_identically(tiny_cfg, tmp_path):
    cfg = tiny_cfg(runtime__client_workers=2, runtime__threads=1, federation__rounds=3, faults__fail_clients=[1],
                   method__trainer__reset_optimizer=False)
    run_embedded(cfg, tmp_path / "full")
    recs = RunDir(tmp_path / "full").read_metrics()
    assert all({c["client"]: c["status"] for c in r["clients"]} == {0: "ok", 1: "failed", 2: "ok"} for r in recs)
    assert "injected failure of client 1" in recs[0]["clients"][1]["error"]
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=1)
    run_embedded(cfg, tmp_path / "cut", resume=True)
    assert _records(tmp_path / "cut") == _records(tmp_path / "full")


def test_workers_need_the_cpu(tiny_cfg):
    from fedpeft.config import ConfigError

    with pytest.raises(ConfigError, match="client_workers"):
        tiny_cfg(runtime__client_workers=2, runtime__device="cuda")
