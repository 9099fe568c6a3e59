"""Tracking sinks: what TensorBoard's event files and MLflow's local store hold is what metrics.jsonl says, a resumed
run appends to the same runs without sending a round twice, a missing extra or a failing sink is handled."""

from __future__ import annotations

import json
import math

import pytest

from fedpeft.config import ConfigError
from fedpeft.runtime.embedded import StopAfterRound, run_embedded
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.sinks import SINKS, round_scalars, summary_scalars
from fedpeft.tracking.sinks import base as sink_base
from fedpeft.tracking.sinks.mlflow import local_store
from fedpeft.tracking.tracker import STATE


def _tb_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _expected(records) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for rec in records:
        for key, value in round_scalars(rec).items():
            out.setdefault(key, []).append((rec["round"], value))
    return out


def test_round_scalars_flatten_numbers_and_leave_out_per_client_fields():
    rec = {"round": 3, "accuracy": 0.5, "loss": None, "bytes_up": 10, "clients": [{"client": 0}],
           "local_accuracy": {"0": 0.4}, "confusion": [[1, 0], [0, 1]], "server": {"lr": 0.1, "note": "x"},
           "generation": {"bleu": 20.0, "by_group": {"a": {"bleu": 10.0}}}, "server_vectors": {"s": [1.0]}}
    assert round_scalars(rec) == {"accuracy": 0.5, "bytes_up": 10.0, "server/lr": 0.1, "generation/bleu": 20.0,
                                  "generation/by_group/a/bleu": 10.0}
    assert summary_scalars({"rounds": 2, "per_class": {"a": 1}, "method": "fedprompt", "ok": True}) == \
        {"rounds": 2.0, "ok": 1.0}


def test_tensorboard_and_mlflow_hold_what_metrics_jsonl_says(tiny_cfg, tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    cfg = tiny_cfg(tracking="[{name: tensorboard}, {name: mlflow}]", evaluation__local=True)
    summary = run_embedded(cfg, tmp_path / "run")
    records = RunDir(tmp_path / "run").read_metrics()
    want = _expected(records)
    assert "local_accuracy_mean" in want and "bytes_up" in want and "accuracy" in want

    tb = _tb_scalars(tmp_path / "run" / "tensorboard")
    for key, series in want.items():
        assert [s for s, _ in tb[key]] == [s for s, _ in series], key
        assert all(math.isclose(a, b, rel_tol=1e-6) for (_, a), (_, b) in zip(tb[key], series)), key
    assert tb["summary/final_accuracy"] == [(2, pytest.approx(summary["final_accuracy"]))]

    state = json.loads((tmp_path / "run" / STATE).read_text())
    client = MlflowClient(local_store(tmp_path / "run"))
    run = client.get_run(state["mlflow"]["id"])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.params["method.name"] == cfg.method.name and run.data.params["seed"] == "0"
    for key, series in want.items():
        got = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        assert sorted(got) == series, key
    assert run.data.metrics["summary/bytes_up_total"] == summary["bytes_up_total"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "report.html"} <= artifacts


def test_a_resumed_run_appends_to_the_same_runs_and_sends_no_round_twice(tiny_cfg, tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    cfg = tiny_cfg(federation__rounds=3, tracking="[{name: tensorboard}, {name: mlflow}]")
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "run", stop_after_round=1)
    first = json.loads((tmp_path / "run" / STATE).read_text())
    assert first["mlflow"]["last_round"] == 1
    run_embedded(cfg, tmp_path / "run", resume=True)
    state = json.loads((tmp_path / "run" / STATE).read_text())
    assert state["mlflow"]["id"] == first["mlflow"]["id"] and state["mlflow"]["last_round"] == 3
    records = RunDir(tmp_path / "run").read_metrics()
    client = MlflowClient(local_store(tmp_path / "run"))
    history = client.get_metric_history(state["mlflow"]["id"], "accuracy")
    assert sorted((m.step, m.value) for m in history) == [(r["round"], r["accuracy"]) for r in records]
    assert [s for s, _ in _tb_scalars(tmp_path / "run" / "tensorboard")["accuracy"]] == [1, 2, 3]


def test_a_sink_added_at_resume_is_sent_the_earlier_rounds(tiny_cfg, tmp_path):
    pytest.importorskip("tensorboard")
    with pytest.raises(StopAfterRound):
        run_embedded(tiny_cfg(), tmp_path / "run", stop_after_round=1)
    assert not (tmp_path / "run" / STATE).exists()  # no sink, no tracking.json
    run_embedded(tiny_cfg(tracking="[{name: tensorboard}]"), tmp_path / "run", resume=True)  # numberless: allowed
    assert [s for s, _ in _tb_scalars(tmp_path / "run" / "tensorboard")["accuracy"]] == [1, 2]


def test_wandb_writes_an_offline_run_in_the_run_directory(tiny_cfg, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    summary = run_embedded(tiny_cfg(tracking="[{name: wandb}]"), tmp_path / "run")
    # `run.finish()` only tells the wandb-core service that the run ended; the service closes (flushes) the run's log
    # afterwards, on its own time. Wait for it to shut down, as the atexit hook does before a `wandb sync`.
    wandb.teardown()
    state = json.loads((tmp_path / "run" / STATE).read_text())
    runs = list((tmp_path / "run" / "wandb").glob(f"offline-run-*-{state['wandb']['id']}"))
    assert len(runs) == 1 and {"summary.json", "report.html"} <= {p.name for p in (runs[0] / "files").iterdir()}
    # the offline log (for `wandb sync`) has no reader in wandb 0.31's Python package: its protobuf records keep keys
    # and JSON values as plain bytes, so look for them
    log = next(runs[0].glob("*.wandb")).read_bytes()
    for key in (b"accuracy", b"bytes_up", b"summary/bytes_up_total", b"method.name"):
        assert key in log, key
    assert json.dumps(summary["final_accuracy"]).encode() in log


def test_config_errors_name_the_sink_field(tiny_cfg):
    with pytest.raises(ConfigError, match=r"tracking\.0\.name: unknown tracking sink 'neptune'"):
        tiny_cfg(tracking="[{name: neptune}]")
    with pytest.raises(ConfigError, match=r"tracking\.0\.experimnt: unknown field"):
        tiny_cfg(tracking="[{name: mlflow, experimnt: x}]")
    with pytest.raises(ConfigError, match="each sink at most once"):
        tiny_cfg(tracking="[{name: tensorboard}, {name: tensorboard}]")


def test_a_missing_extra_is_named_before_anything_runs(tiny_cfg, tmp_path, monkeypatch):
    real = sink_base.importlib.util.find_spec
    monkeypatch.setattr(sink_base.importlib.util, "find_spec", lambda m: None if m == "mlflow" else real(m))
    with pytest.raises(ImportError, match=r"'mlflow' needs the 'mlflow' package.*fedpeft\[tracking\]"):
        run_embedded(tiny_cfg(tracking="[{name: mlflow}]"), tmp_path / "run")
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_failing_sink_is_dropped_and_the_run_finishes(tiny_cfg, tmp_path, monkeypatch, caplog):
    pytest.importorskip("tensorboard")
    monkeypatch.setattr(SINKS.get("tensorboard"), "log_round", lambda *a: (_ for _ in ()).throw(OSError("disk")))
    summary = run_embedded(tiny_cfg(tracking="[{name: tensorboard}]"), tmp_path / "run")
    assert summary["rounds"] == 2
    assert "tracking sink 'tensorboard' failed to log a round (OSError: disk)" in caplog.text
    assert json.loads((tmp_path / "run" / STATE).read_text())["tensorboard"]["last_round"] == -1
