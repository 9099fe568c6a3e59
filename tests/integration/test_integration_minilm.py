"""Integration on the packaged MiniLM and real data (BBC News; SST-2 when ../shared/data is present)."""

from __future__ import annotations

import pytest

from fedpeft.model.classifier import evaluate
from fedpeft.resolve import load_config
from fedpeft.data import shared_data_dir
from fedpeft.experiment import build_experiment
from fedpeft.build import build_method
from fedpeft.runtime.embedded import run_embedded

pytestmark = pytest.mark.slow

SMALL = ["model.name=minilm", "task.max_length=48", "runtime.progress=false", "evaluation.local=false"]


def test_fedprompt_learns_on_bbc_above_its_starting_point(tmp_path):
    cfg = load_config(None, SMALL + [
        "task.name=bbc", "task.max_train=400", "task.max_test=200", "federation.num_clients=4",
        "federation.rounds=2", "federation.partition.scheme=dirichlet", "federation.partition.alpha=0.5",
        "method.trainer.lr=0.05"])
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    start = evaluate(exp.objective, method.server_init().tensors, exp.test_encoded)["accuracy"]
    checksum = exp.backbone.checksum()
    summary = run_embedded(cfg, tmp_path / "run", experiment=exp)
    assert summary["final_accuracy"] >= 0.85  # 5 classes: chance is 0.2
    assert summary["final_accuracy"] > start + 0.03
    assert exp.backbone.checksum() == checksum
    # upload = 20 x 384 float32 prompt + framing
    assert summary["upload_tensor_bytes"] == 20 * 384 * 4
    assert 0 < summary["upload_framing_bytes"] <= 1024


def test_fedavg_full_uploads_every_minilm_weight(tmp_path):
    cfg = load_config(None, SMALL + [
        "method.name=fedavg-full", "task.name=bbc", "task.max_train=40", "task.max_test=20",
        "federation.num_clients=1", "federation.rounds=1", "method.trainer.max_steps=1"])
    summary = run_embedded(cfg, tmp_path / "run")
    params = summary["backbone_params"]
    assert 22_500_000 < params < 22_900_000
    assert summary["upload_tensor_bytes"] == 4 * params
    assert abs(summary["bytes_up_per_client_round"] / (4 * 22.7e6) - 1) < 0.01
    prompt_bytes = 20 * 384 * 4
    assert summary["bytes_up_per_client_round"] / prompt_bytes > 2900


def test_fedprompt_on_sst2_from_shared_data(tmp_path):
    if shared_data_dir() is None or not (shared_data_dir() / "SST-2").is_dir():
        pytest.skip("../shared/data/SST-2 not found (set FEDPEFT_DATA_DIR to run this test)")
    cfg = load_config(None, SMALL + [
        "task.name=sst2", "task.max_train=480", "task.max_test=300", "federation.num_clients=3",
        "federation.rounds=1", "federation.partition.scheme=dirichlet_quantity", "federation.partition.min_size=16"])
    summary = run_embedded(cfg, tmp_path / "run")
    assert summary["final_accuracy"] > 0.62  # binary: chance is 0.5
