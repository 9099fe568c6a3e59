"""End-to-end invariants of the embedded runtime on a tiny random model and synthetic data."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from fedpeft.aggregators import weighted_mean
from fedpeft.comm.codec import decode, encode
from fedpeft.experiment import build_experiment
from fedpeft.runtime.embedded import StopAfterRound, run_embedded
from fedpeft.runtime.server import RoundFailed
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS


def _strip_timing(records):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


def test_run_dir_contract(tiny_cfg, tmp_path):
    summary = run_embedded(tiny_cfg(evaluation__round_zero=True), tmp_path / "run")
    root = tmp_path / "run"
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "checkpoint/meta.json", "run.log"):
        assert (root / name).exists(), name
    records = RunDir(root).read_metrics()
    assert [r["round"] for r in records] == [0, 1, 2]  # round 0: the initial state, before any training
    for key in ("accuracy", "loss", "local_accuracy_mean", "local_accuracy_min", "local_accuracy_max",
                "bytes_up", "bytes_down", "wall_seconds", "clients"):
        assert key in records[1]
    assert len(records[1]["clients"]) == 3
    assert records[0]["clients"] == [] and records[0]["bytes_up"] == 0 and records[0]["accuracy"] is not None
    on_disk = json.loads((root / "summary.json").read_text())
    for key in ("method", "task", "model", "rounds", "final_accuracy", "best_accuracy", "bytes_up_total",
                "bytes_down_total", "bytes_up_per_client_round", "trainable_params", "wall_seconds"):
        assert key in on_disk
    assert on_disk == summary
    assert summary["rounds"] == 2 and summary["final_accuracy"] == records[-1]["accuracy"]
    # the evaluating part of each round is timed inside its wall time (benchmarks read training as the difference)
    assert all(0 < r["eval_seconds"] <= r["wall_seconds"] for r in records)


def test_upload_is_prompt_bytes_plus_small_framing(tiny_cfg, tmp_path):
    cfg = tiny_cfg()
    summary = run_embedded(cfg, tmp_path / "run")
    m, d = cfg.method.adapter.num_tokens, 32  # tiny-bert hidden size
    assert summary["trainable_params"] == m * d
    assert summary["upload_tensor_bytes"] == m * d * 4
    framing = summary["bytes_up_per_client_round"] - m * d * 4
    assert 0 < framing <= 1024
    cfg16 = tiny_cfg(method__codec__dtype="float16")
    s16 = run_embedded(cfg16, tmp_path / "run16")
    assert s16["upload_tensor_bytes"] == m * d * 2
    assert 0 < s16["bytes_up_per_client_round"] - m * d * 2 <= 1024


def test_backbone_is_never_modified(tiny_cfg, tmp_path):
    cfg = tiny_cfg(method__trainer__lr=0.5)
    exp = build_experiment(cfg)
    before = exp.backbone.checksum()
    summary = run_embedded(cfg, tmp_path / "run", experiment=exp)
    assert exp.backbone.checksum() == before
    assert summary["backbone_unchanged"] is True
    assert all(not p.requires_grad for p in exp.backbone.model.parameters())


def test_full_finetuning_leaves_shared_backbone_untouched(tiny_cfg, tmp_path):
    cfg = tiny_cfg(method__name="fedavg-full", method__adapter__num_tokens=None, method__trainer__lr=1e-2,
                   federation__rounds=1)
    exp = build_experiment(cfg)
    before = exp.backbone.checksum()
    summary = run_embedded(cfg, tmp_path / "run", experiment=exp)
    assert exp.backbone.checksum() == before
    n = exp.backbone.num_parameters
    assert summary["trainable_params"] == n
    assert summary["upload_tensor_bytes"] == 4 * n
    assert summary["bytes_up_per_client_round"] - 4 * n < 64 * 1024  # JSON header names ~100 tensors


def test_same_seed_same_metrics_and_different_seed_differs(tiny_cfg, tmp_path):
    run_embedded(tiny_cfg(), tmp_path / "a")
    run_embedded(tiny_cfg(), tmp_path / "b")
    run_embedded(tiny_cfg(seed=1), tmp_path / "c")
    a, b, c = (_strip_timing(RunDir(tmp_path / x).read_metrics()) for x in "abc")
    assert a == b
    assert a != c


def test_kill_and_resume_gives_identical_metrics(tiny_cfg, tmp_path):
    cfg = tiny_cfg(federation__rounds=4)
    full = run_embedded(cfg, tmp_path / "full")
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=2)
    assert [r["round"] for r in RunDir(tmp_path / "cut").read_metrics()] == [1, 2]
    resumed = run_embedded(cfg, tmp_path / "cut", resume=True)
    cut, full_records = (_strip_timing(RunDir(tmp_path / x).read_metrics()) for x in ("cut", "full"))
    assert cut == full_records
    assert resumed["final_accuracy"] == full["final_accuracy"]
    ck_a = RunDir(tmp_path / "full").load_checkpoint()[1].tensors
    ck_b = RunDir(tmp_path / "cut").load_checkpoint()[1].tensors
    assert all(torch.equal(ck_a[k], ck_b[k]) for k in ck_a)


def test_round_zero_is_the_untrained_state_and_is_not_repeated_on_resume(tiny_cfg, tmp_path):
    cfg = tiny_cfg(evaluation__round_zero=True, federation__rounds=3)
    full = run_embedded(cfg, tmp_path / "full")
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=1)
    run_embedded(cfg, tmp_path / "cut", resume=True)
    got = _strip_timing(RunDir(tmp_path / "cut").read_metrics())
    assert [r["round"] for r in got] == [0, 1, 2, 3]
    assert got == _strip_timing(RunDir(tmp_path / "full").read_metrics())
    run_embedded(tiny_cfg(evaluation__round_zero=True, federation__rounds=1), tmp_path / "one")
    shorter = RunDir(tmp_path / "one").read_metrics()
    assert _strip_timing(shorter[:1]) == got[:1]  # the initial state does not depend on what follows
    assert full["rounds"] == 3 and full["initial_accuracy"] == got[0]["accuracy"]
    # and what follows does not depend on it: without round 0, the same rounds 1-3 (a benchmark's finished run
    # counts either way, benchmarks.runner.COUNTS_ANYWAY)
    run_embedded(tiny_cfg(evaluation__round_zero=False, federation__rounds=3), tmp_path / "none")
    assert _strip_timing(RunDir(tmp_path / "none").read_metrics()) == got[1:]


def test_resume_keeps_persistent_optimizer_state(tiny_cfg, tmp_path):
    cfg = tiny_cfg(federation__rounds=3, method__trainer__reset_optimizer=False)
    run_embedded(cfg, tmp_path / "full")
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=1)
    clients = RunDir(tmp_path / "cut").load_checkpoint()[2]
    assert set(clients) == {0, 1, 2} and any("::exp_avg" in k for k in clients[0].tensors)
    run_embedded(cfg, tmp_path / "cut", resume=True)
    cut, full_records = (_strip_timing(RunDir(tmp_path / x).read_metrics()) for x in ("cut", "full"))
    assert cut == full_records


def test_resume_accepts_a_config_saved_before_keys_were_added(tiny_cfg, tmp_path):
    """A run started by an older fedpeft (its config.yaml lacks keys added since, component settings included)
    resumes when the missing keys have their defaults; a changed value is still refused."""
    cfg = tiny_cfg(federation__rounds=2)
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=1)
    saved = yaml.safe_load((tmp_path / "cut" / "config.yaml").read_text())
    del saved["model"]["pooling"], saved["evaluation"]["reuse_global"], saved["method"]["trainer"]["lr"]
    (tmp_path / "cut" / "config.yaml").write_text(yaml.safe_dump(saved))
    run_embedded(cfg, tmp_path / "cut", resume=True)
    assert [r["round"] for r in RunDir(tmp_path / "cut").read_metrics()] == [1, 2]
    with pytest.raises(ValueError, match="differs from the config given to --resume"):
        run_embedded(tiny_cfg(federation__rounds=2, seed=1), tmp_path / "cut", resume=True)


def test_existing_run_needs_resume(tiny_cfg, tmp_path):
    run_embedded(tiny_cfg(federation__rounds=1), tmp_path / "run")
    with pytest.raises(FileExistsError, match="--resume"):
        run_embedded(tiny_cfg(federation__rounds=1), tmp_path / "run")


def test_malformed_reply_is_rejected_and_not_averaged(tiny_cfg, tmp_path):
    cfg = tiny_cfg(federation__rounds=1)
    seen: dict[int, dict] = {}

    def corrupt(rnd, cid, data):
        msg = decode(data)
        seen[cid] = {k: v.clone() for k, v in msg.tensors.items()} | {"n": msg.scalars["num_examples"]}
        if cid == 1:
            msg.tensors["prompt"][0, 0] = float("nan")
        return encode(msg)

    run_embedded(cfg, tmp_path / "run", reply_hook=corrupt)
    rec = RunDir(tmp_path / "run").read_metrics()[0]
    status = {c["client"]: c["status"] for c in rec["clients"]}
    assert status == {0: "ok", 1: "rejected", 2: "ok"}
    assert rec["num_rejected"] == 1
    state = RunDir(tmp_path / "run").load_checkpoint()[1].tensors["prompt"]
    expected = weighted_mean([{"prompt": seen[0]["prompt"]}, {"prompt": seen[2]["prompt"]}],
                             [seen[0]["n"], seen[2]["n"]])
    assert torch.allclose(state, expected["prompt"], atol=1e-7)
    assert "rejected reply of client 1" in (tmp_path / "run" / "run.log").read_text()


def test_wrong_shape_and_crashing_client(tiny_cfg, tmp_path):
    cfg = tiny_cfg(federation__rounds=1, federation__min_clients=1)

    def hook(rnd, cid, data):
        msg = decode(data)
        if cid == 0:
            msg.tensors["prompt"] = msg.tensors["prompt"][:2]
        if cid == 2:
            raise RuntimeError("client 2 lost power")
        return encode(msg)

    run_embedded(cfg, tmp_path / "run", reply_hook=hook)
    rec = RunDir(tmp_path / "run").read_metrics()[0]
    assert {c["client"]: c["status"] for c in rec["clients"]} == {0: "rejected", 1: "ok", 2: "failed"}
    assert "client 2 lost power" in (tmp_path / "run" / "run.log").read_text()


def test_too_few_valid_replies_fail_the_round_and_lose_nothing(tiny_cfg, tmp_path):
    cfg = tiny_cfg(federation__rounds=2, federation__min_clients=3)

    def hook(rnd, cid, data):
        if rnd == 2 and cid == 0:
            raise RuntimeError("offline")
        return data

    with pytest.raises(RoundFailed, match="min_clients"):
        run_embedded(cfg, tmp_path / "run", reply_hook=hook)
    assert RunDir(tmp_path / "run").load_checkpoint()[0] == 1
    run_embedded(cfg, tmp_path / "run", resume=True)
    assert [r["round"] for r in RunDir(tmp_path / "run").read_metrics()] == [1, 2]


def test_partial_participation_selects_k_distinct_clients(tiny_cfg, tmp_path):
    cfg = tiny_cfg(federation__num_clients=5, federation__clients_per_round=2, federation__rounds=3,
                   task__num_examples=300)
    run_embedded(cfg, tmp_path / "run")
    for rec in RunDir(tmp_path / "run").read_metrics():
        ids = [c["client"] for c in rec["clients"]]
        assert len(ids) == 2 and len(set(ids)) == 2
