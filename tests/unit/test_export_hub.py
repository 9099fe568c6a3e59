"""``fedpeft export --format hub`` and ``--to mlflow`` (issue 75, part 2): the hub folder holds the PEFT adapter
byte for byte as ``--format peft`` writes it, a card whose YAML the Hub reads and whose body has the run's numbers
as ``summary.json`` and ``metrics.jsonl`` hold them, a PNG training curve and the config; PEFT reloads it to
``fedpeft predict``'s probabilities; ``--push`` without a token or a network fails in one line and keeps the folder
(the Hub is never called: its client is replaced); the registered MLflow version answers exactly what ``fedpeft
predict`` and ``fedpeft generate`` answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import plain_copy
from typer.testing import CliRunner

from fedpeft.cli import app
from fedpeft.predict import open_model, predict
from fedpeft.resolve import load_config, resolve
from fedpeft.runtime.embedded import run_embedded
from fedpeft.tracking.rundir import RunDir

pytest.importorskip("matplotlib", reason="export --format hub draws its curve with the hub extra's matplotlib")
pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
TEXTS = ["a wonderful , moving film", "dull and far too long", "it was fine"]
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors", "fedpeft_task.json")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, one_thread_module) -> Path:
    """A LoRA run with local DP (so the card has an ε) on a tiny BERT saved as a user's folder, whose own model
    card says its license (``mit``), tracked by the MLflow sink (its local store in the run directory)."""
    from fedpeft.backbones.loading import load_backbone

    root = tmp_path_factory.mktemp("hub")
    bb = load_backbone("tiny-bert")
    base = root / "my-base-model"
    plain_copy(bb).save_pretrained(base)
    bb.tokenizer.save_pretrained(base)
    (base / "README.md").write_text("---\nlicense: mit\n---\n\n# my base model\n")
    cfg = load_config(None, ["method.name=fedavg-lora", f"model.name={base}", "task.name=synthetic-sentiment",
                             "task.num_examples=96", "task.max_length=24", "federation.num_clients=3",
                             "federation.rounds=2", "method.trainer.max_steps=3", "method.trainer.lr=0.05",
                             "method.transforms=[{name: ldp, mechanism: laplace, noise: 0.01}]",
                             "runtime.progress=false", "name=tiny-lora", "tracking=[{name: mlflow}]"])
    run_embedded(cfg, root / "run")
    return root / "run"


@pytest.fixture(scope="module")
def hub_dir(lora_run, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("export") / "hub"
    res = runner.invoke(app, ["export", str(lora_run), str(out), "--format", "hub", "--base-model",
                              "fedpeft-tests/tiny-bert"])
    assert res.exit_code == 0, res.output
    return out, res.output


def _card(folder: Path) -> tuple[dict, str]:
    text = (folder / "README.md").read_text()
    assert text.startswith("---\n")
    front, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(front), body


def test_the_hub_folder_is_the_peft_export_with_a_card_a_curve_and_the_config(lora_run, hub_dir, tmp_path):
    from huggingface_hub import ModelCard
    from PIL import Image

    out, output = hub_dir
    res = runner.invoke(app, ["export", str(lora_run), str(tmp_path / "peft")])
    assert res.exit_code == 0, res.output
    for name in PEFT_FILES:
        assert (out / name).read_bytes() == (tmp_path / "peft" / name).read_bytes(), name
    assert (out / "config.yaml").read_bytes() == (lora_run / "config.yaml").read_bytes()
    assert (out / "training_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(out / "training_curve.png") as png:
        assert png.format == "PNG" and png.size == (900, 360)
    assert "warning" not in output  # the Hub id given, the license read from the base model's own card

    meta, body = _card(out)
    assert meta["base_model"] == "fedpeft-tests/tiny-bert" and meta["library_name"] == "peft"
    assert meta["license"] == "mit" and meta["pipeline_tag"] == "text-classification"
    assert {"fedpeft", "federated-learning", "fedavg-lora", "lora"} <= set(meta["tags"])
    assert ModelCard.load(out / "README.md").data.base_model == "fedpeft-tests/tiny-bert"

    summary = json.loads((lora_run / "summary.json").read_text())
    records = RunDir(lora_run).read_metrics()
    assert summary["rounds"] == 2 and "| rounds | 2 |" in body
    for key in ("bytes_up_total", "bytes_down_total", "bytes_up_per_client_round", "bytes_down_per_client_round"):
        assert f"| {summary[key]:,.0f} (" in body, key
    assert f"ε = {records[-1]['server']['epsilon']:.4g}" in body and "`ldp` (mechanism: laplace" in body
    assert f"| `final_accuracy` | {summary['final_accuracy']:.4f} |" in body
    assert "Venkatesha" in body  # fedavg-lora is head pruning's baseline B1: its paper, from its module
    assert "![loss and accuracy per round](training_curve.png)" in body
    assert "PeftModel.from_pretrained(base, " in body and "AutoModel.from_pretrained('fedpeft-tests/tiny-bert')" in body


def test_peft_loads_the_hub_folder_and_reproduces_fedpeft_predict(lora_run, hub_dir):
    """tests/unit/test_export.py's reuse script on the hub folder: a fresh process with transformers and PEFT alone,
    the similarity readout of fedpeft_task.json, on the base model the adapter config names."""
    import os
    import subprocess
    import sys

    from test_export import REUSE

    out, _ = hub_dir
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HF_HUB_OFFLINE": "1"}
    got = subprocess.run([sys.executable, "-c", REUSE, str(out), json.dumps(TEXTS)], env=env, capture_output=True,
                         text=True, check=True)
    theirs = json.loads(got.stdout.strip().splitlines()[-1])
    ours = torch.tensor([[r[f"p({c})"] for c in theirs["classes"]] for r in predict(lora_run, TEXTS)])
    assert torch.allclose(torch.tensor(theirs["probs"]), ours, atol=1e-5)
    assert any(abs(p[0] - 0.5) > 1e-3 for p in theirs["probs"])  # a real classifier, not a constant


def test_a_card_without_a_hub_id_or_a_license_says_so_and_leaves_them_out(lora_run, tmp_path):
    base = Path(open_model(lora_run).cfg.model.name)
    readme = base / "README.md"
    kept = readme.read_text()
    readme.unlink()  # a base folder without its own card: no license to inherit
    try:
        res = runner.invoke(app, ["export", str(lora_run), str(tmp_path / "hub"), "--format", "hub"])
    finally:
        readme.write_text(kept)
    assert res.exit_code == 0, res.output
    assert "no base_model" in res.output and "--base-model" in res.output and "--license" in res.output
    meta, _ = _card(tmp_path / "hub")
    assert "base_model" not in meta and "license" not in meta
    res = runner.invoke(app, ["export", str(lora_run), str(tmp_path / "hub2"), "--format", "hub", "--license",
                              "apache-2.0"])
    assert res.exit_code == 0 and _card(tmp_path / "hub2")[0]["license"] == "apache-2.0"


def _no_hub(monkeypatch, reachable: bool | None = None) -> list:
    """The Hub client's calls recorded instead of sent; ``reachable``: what the network check answers (None: it
    must not be asked)."""
    import huggingface_hub

    from fedpeft.backbones import loading

    calls = []
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, *a, **k: calls.append(("create", a, k)))
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder",
                        lambda self, **k: calls.append(("upload", (), k)) or "https://hub.test/commit/1")

    def check(timeout: float = 3.0) -> bool:
        assert reachable is not None, "the network was checked"
        return reachable

    monkeypatch.setattr(loading, "hub_reachable", check)
    return calls


def _no_token(monkeypatch, tmp_path: Path) -> None:
    from huggingface_hub import constants

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def test_push_without_a_token_fails_in_one_line_and_the_folder_stays(lora_run, tmp_path, monkeypatch):
    _no_token(monkeypatch, tmp_path)
    calls = _no_hub(monkeypatch)
    out = tmp_path / "hub"
    res = runner.invoke(app, ["export", str(lora_run), str(out), "--format", "hub", "--push", "me/tiny-lora"])
    assert res.exit_code == 2 and calls == []
    [line] = _error_lines(res.output)
    assert "no Hugging Face token: set HF_TOKEN or run `hf auth login`" in line and str(out) in line
    assert {"README.md", "training_curve.png", "config.yaml", *PEFT_FILES} <= {p.name for p in out.iterdir()}
    assert "me/tiny-lora" in (out / "README.md").read_text()  # the card loads the adapter from the repo


def test_push_without_a_network_fails_in_one_line_and_the_folder_stays(lora_run, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    calls = _no_hub(monkeypatch, reachable=False)
    out = tmp_path / "hub"
    res = runner.invoke(app, ["export", str(lora_run), str(out), "--format", "hub", "--push", "me/tiny-lora"])
    assert res.exit_code == 2 and calls == []
    [line] = _error_lines(res.output)
    assert "unreachable" in line and f"the folder is at {out}" in line
    assert (out / "README.md").exists() and (out / "adapter_model.safetensors").exists()


def test_push_creates_the_repository_and_uploads_the_folder(lora_run, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    calls = _no_hub(monkeypatch, reachable=True)
    out = tmp_path / "hub"
    res = runner.invoke(app, ["export", str(lora_run), str(out), "--format", "hub", "--push", "me/tiny-lora"])
    assert res.exit_code == 0, res.output
    (create, args, kw), (upload, _, up) = calls
    assert create == "create" and args == ("me/tiny-lora",) and kw["exist_ok"] and kw["repo_type"] == "model"
    assert upload == "upload" and up["repo_id"] == "me/tiny-lora" and Path(up["folder_path"]) == out
    assert "pushed" in res.output


@pytest.mark.parametrize("args, message", [
    (["--push", "me/x"], "--push: go with --format hub"),
    (["--registered-name", "x"], "--registered-name and --tracking-uri go with --to mlflow"),
    (["--format", "onnx"], "--format: unknown 'onnx'; allowed: peft, hub"),
    (["--to", "mlflow", "--format", "peft"], "drop --format peft"),
    (["--format", "hub", "--push", "not a repo id!"], "--push: 'not a repo id!' is not a Hugging Face Hub"),
])
def test_export_options_that_do_not_go_together_are_refused_before_anything_is_written(tmp_path, args, message):
    res = runner.invoke(app, ["export", str(tmp_path / "run"), str(tmp_path / "out"), *args])
    assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_the_tracking_uri_is_the_sinks_else_the_runs_local_store(tmp_path):
    from fedpeft.publish.mlflow_model import tracking_target
    from fedpeft.tracking.sinks.mlflow import local_store

    plain = load_config(None, ["task.name=synthetic-sentiment"])
    sink = load_config(None, ["task.name=synthetic-sentiment",
                              "tracking=[{name: mlflow, tracking_uri: 'http://mlflow.test:5000', experiment: e}]"])
    default_sink = load_config(None, ["task.name=synthetic-sentiment", "tracking=[{name: mlflow}]"])
    assert tracking_target(plain, tmp_path, None) == (local_store(tmp_path), "fedpeft", False)
    assert tracking_target(sink, tmp_path, None) == ("http://mlflow.test:5000", "e", True)
    assert tracking_target(default_sink, tmp_path, None) == (local_store(tmp_path), "fedpeft", True)
    assert tracking_target(sink, tmp_path, "sqlite:///x.db") == ("sqlite:///x.db", "e", False)


def _registered(run: Path, name: str, tmp_path: Path, version: str = "1"):
    """The registered version ``name``/``version`` loaded back from the run's local store, its logged model, and
    the files of its artifacts (relative paths)."""
    import mlflow

    from fedpeft.tracking.sinks.mlflow import local_store

    mlflow.set_tracking_uri(local_store(run))
    try:
        loaded = mlflow.pyfunc.load_model(f"models:/{name}/{version}")
        client = mlflow.MlflowClient()
        logged = client.get_logged_model(loaded.metadata.model_id)
        files = Path(mlflow.artifacts.download_artifacts(f"models:/{name}/{version}", dst_path=str(tmp_path)))
        return loaded, logged, {str(p.relative_to(files)) for p in files.rglob("*") if p.is_file()}
    finally:
        mlflow.set_tracking_uri(None)


def test_the_registered_mlflow_version_predicts_exactly_as_fedpeft_predict(lora_run, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("mlflow")

    res = runner.invoke(app, ["export", str(lora_run), "--to", "mlflow"])
    assert res.exit_code == 0, res.output
    sink_run = json.loads((lora_run / "tracking.json").read_text())["mlflow"]["id"]
    assert "registered tiny-lora version 1" in res.output
    assert f"MLflow run {sink_run})" in res.output  # in the MLflow run the sink wrote, beside its rounds
    loaded, logged, files = _registered(lora_run, "tiny-lora", tmp_path)
    got = loaded.predict(pd.DataFrame({"text": TEXTS}))
    ours = predict(lora_run, TEXTS)
    names = ["negative", "positive"]
    delta = max(abs(got[f"p({c})"][i] - row[f"p({c})"]) for i, row in enumerate(ours) for c in names)
    assert delta == 0.0
    assert got["prediction"].tolist() == [row["prediction"] for row in ours]
    summary = json.loads((lora_run / "summary.json").read_text())
    assert {m.key: m.value for m in logged.metrics}["final_accuracy"] == summary["final_accuracy"]
    assert {"artifacts/hub/README.md", "artifacts/hub/adapter_model.safetensors", "artifacts/hub/training_curve.png",
            "artifacts/run/config.yaml", "artifacts/run/checkpoint/server.safetensors"} <= files, sorted(files)


def test_the_registered_mlflow_version_of_a_generation_run_writes_what_fedpeft_generate_writes(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("mlflow")

    rows = [{"ask": f"Join {a} and {b}", "answer": f"{a} {b}"} for a in ("apple", "river", "stone", "cloud")
            for b in ("green", "music", "table")]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:10]))
    (tmp_path / "data" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[10:]))
    raw = {"seed": 0, "model": {"name": "tiny-llama"}, "method": {"name": "fedit", "trainer": {"max_steps": 2}},
           "task": {"name": "jsonl", "path": str(tmp_path / "data"), "instruction_column": "ask",
                    "response_column": "answer", "max_length": 48, "max_response_length": 8},
           "federation": {"num_clients": 2, "rounds": 1},
           "evaluation": {"generate_every": 0, "max_new_tokens": 4}, "runtime": {"progress": False, "threads": 1}}
    run = tmp_path / "run"
    run_embedded(resolve(raw), run)
    res = runner.invoke(app, ["export", str(run), str(tmp_path / "hub"), "--to", "mlflow", "--registered-name",
                              "tiny-fedit"])
    assert res.exit_code == 0, res.output
    meta, _ = _card(tmp_path / "hub")
    assert meta["pipeline_tag"] == "text-generation" and "fedit" in meta["tags"]
    loaded, _, _ = _registered(run, "tiny-fedit", tmp_path / "downloaded")
    prompts = ["Join apple and music", "Join stone and green"]
    got = loaded.predict(pd.DataFrame({"instruction": prompts}))["generation"].tolist()
    assert got == open_model(run).generate(prompts)
