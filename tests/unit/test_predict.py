"""Using a run afterwards: ``fedpeft predict`` (global and personalised adapters, CSV/JSONL/table output),
``fedpeft run --dry-run`` (bytes per client-round without training), and one-line errors for a model name that
loads nowhere and for a YAML syntax error."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from conftest import tiny_overrides
from typer.testing import CliRunner

from fedpeft.adapters.deep_prompt import layer_of
from fedpeft.backbones.loading import ModelLoadError, load_backbone
from fedpeft.cli import app
from fedpeft.clients import sub_state
from fedpeft.config import ConfigError
from fedpeft.data.types import Example
from fedpeft.dryrun import dry_run
from fedpeft.experiment import build_experiment
from fedpeft.methods.state import PRIVATE, ServerState
from fedpeft.predict import open_model, predict
from fedpeft.prediction_files import read_inputs
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded
from fedpeft.tracking.rundir import RunDir

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
FEDPROMPT = {"federation.rounds": 1}
FEDPEPTAO = {"method.name": "fedpeptao", "task.num_examples": 72, "method.adapter.num_tokens": 2,
             "method.trainer.max_steps": 2, "method.trainer.batch_size": 8, "method.sharing.warmup_rounds": 1,
             "federation.rounds": 2}


def _overrides(extra: dict) -> list[str]:
    return tiny_overrides(**{k.replace(".", "__"): v for k, v in extra.items()})


def _sets(extra: dict) -> list[str]:
    return [a for item in _overrides(extra) for a in ("--set", item)]


def _run(tmp_path_factory, extra: dict):
    cfg = load_config(None, _overrides(extra))
    exp = build_experiment(cfg)
    run_dir = tmp_path_factory.mktemp("run") / "run"
    run_embedded(cfg, run_dir, experiment=exp)
    return cfg, exp, run_dir


@pytest.fixture(scope="module")
def fedprompt_run(tmp_path_factory, one_thread_module):
    return _run(tmp_path_factory, FEDPROMPT)


@pytest.fixture(scope="module")
def fedpeptao_run(tmp_path_factory, one_thread_module):
    return _run(tmp_path_factory, FEDPEPTAO)


def _expected_probs(exp, params, texts):
    clf = exp.objective
    enc = clf.encode([Example(t, 0) for t in texts])
    with torch.no_grad():
        return torch.softmax(clf.logits(params, clf.batch(enc, list(range(len(texts))))), dim=-1)


def _probs(rows, names):
    return torch.tensor([[r[f"p({c})"] for c in names] for r in rows])


def _accuracy(rows, examples, names):
    return sum(r["prediction"] == names[e.label] for r, e in zip(rows, examples)) / len(examples)


def test_predict_uses_the_final_global_adapter(fedprompt_run):
    cfg, exp, run_dir = fedprompt_run
    names = exp.task.class_names
    examples = exp.task.test
    texts = [e.text_a for e in examples]
    rows = predict(run_dir, texts)
    assert [list(r) for r in rows[:1]] == [["text", "prediction", *(f"p({c})" for c in names)]]
    assert [r["text"] for r in rows] == texts
    glob = ServerState.from_message(RunDir(run_dir).load_checkpoint()[1]).glob
    expected = _expected_probs(exp, glob, texts)
    got = _probs(rows, names)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(got.sum(-1), torch.ones(len(rows)), atol=1e-5)
    assert [r["prediction"] for r in rows] == [names[i] for i in expected.argmax(-1).tolist()]
    # the same predictions the run scored: its final global test accuracy
    assert _accuracy(rows, examples, names) == pytest.approx(RunDir(run_dir).read_metrics()[-1]["accuracy"])


def test_client_needs_a_method_with_private_state(fedprompt_run):
    _, _, run_dir = fedprompt_run
    with pytest.raises(ValueError, match="no client's private tensors.*drop --client"):
        predict(run_dir, ["some text"], client=0)


def test_client_uses_its_private_layers(fedpeptao_run):
    cfg, exp, run_dir = fedpeptao_run
    _, server, clients, _ = RunDir(run_dir).load_checkpoint()
    st = ServerState.from_message(server)
    selected = set(st.sharing.scalars["selected"])
    assert 0 < len(selected) < 2  # tiny-bert has 2 layers: one shared, one private
    names = exp.task.class_names
    texts = [e.text_a for e in exp.task.test]
    global_rows = predict(run_dir, texts)
    for k in sorted(clients):
        private = sub_state(clients[k], PRIVATE)
        assert private
        # the client's model: its own copy of the non-selected layers, the server's selected ones
        personal = st.glob | {n: v.float() for n, v in private.items() if layer_of(n) not in selected}
        assert any(not torch.equal(personal[n], st.glob[n]) for n in personal)
        rows = predict(run_dir, texts, client=k)
        got = _probs(rows, names)
        assert torch.allclose(got, _expected_probs(exp, personal, texts), atol=1e-5)
        assert torch.allclose(got.sum(-1), torch.ones(len(rows)), atol=1e-5)
        assert not torch.allclose(got, _probs(global_rows, names), atol=1e-4)
        # the same predictions the run's local evaluation scored on the client's test shard
        shard = [exp.task.test[i] for i in exp.test_parts[k]]
        local = [rows[i] for i in exp.test_parts[k]]
        assert _accuracy(local, shard, names) == pytest.approx(
            RunDir(run_dir).read_metrics()[-1]["local_accuracy"][str(k)])
    with pytest.raises(ValueError, match="not a client of this run"):
        predict(run_dir, texts[:1], client=cfg.federation.num_clients)


def test_read_inputs_formats(tmp_path):
    from fedpeft.config import TaskConfig

    task = TaskConfig(name="csv")
    (tmp_path / "a.txt").write_text("first line\n\nsecond, with comma\n")
    (tmp_path / "a.csv").write_text('id,text\n1,"hello, world"\n2,bye\n')
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n{"text": "y", "other": 1}\n')
    assert read_inputs(tmp_path / "a.txt", task).texts == ["first line", "second, with comma"]
    csv_in = read_inputs(tmp_path / "a.csv", task)
    assert csv_in.texts == ["hello, world", "bye"] and csv_in.columns == ["id", "text"]
    assert read_inputs(tmp_path / "a.jsonl", task).texts == ["x", "y"]
    (tmp_path / "b.csv").write_text("sentence\nfoo\n")
    with pytest.raises(ValueError, match="no text column 'text'"):
        read_inputs(tmp_path / "b.csv", task)


def test_cli_predict_csv_jsonl_and_table(fedprompt_run, tmp_path):
    _, exp, run_dir = fedprompt_run
    names = exp.task.class_names
    probs = [f"p({c})" for c in names]
    (tmp_path / "in.txt").write_text("a wonderful film\na dreadful film\n")
    out = tmp_path / "pred.csv"
    res = runner.invoke(app, ["predict", str(run_dir), "--text", "an average film", "--file",
                              str(tmp_path / "in.txt"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["text", "prediction", *probs]
    assert [r["text"] for r in rows] == ["an average film", "a wonderful film", "a dreadful film"]
    direct = predict(run_dir, [r["text"] for r in rows])
    for r, d in zip(rows, direct):
        assert r["prediction"] == d["prediction"] in names
        assert sum(float(r[c]) for c in probs) == pytest.approx(1.0, abs=1e-6)
        assert [float(r[c]) for c in probs] == pytest.approx([d[c] for c in probs], abs=1e-5)  # other batches
    res = runner.invoke(app, ["predict", str(run_dir), "--text", "x", "--out", str(tmp_path / "p.jsonl")])
    assert res.exit_code == 0, res.output
    assert list(json.loads((tmp_path / "p.jsonl").read_text().splitlines()[0])) == ["text", "prediction", *probs]
    res = runner.invoke(app, ["predict", str(run_dir), "--text", "[bold]x[/bold]"])
    assert res.exit_code == 0, res.output
    assert all(n in res.output for n in names) and "[bold]x[/bold]" in res.output
    res = runner.invoke(app, ["predict", str(run_dir), "--text", "x", "--out", str(tmp_path / "p.parquet")])
    assert res.exit_code == 2 and "--out" in res.output
    res = runner.invoke(app, ["predict", str(tmp_path), "--text", "x"])
    assert res.exit_code == 2 and "not a fedpeft run directory" in res.output


def test_predict_on_a_csv_keeps_its_columns_and_never_overwrites_them(fedprompt_run, tmp_path):
    """A labelled CSV through predict: every input column kept as it was (its own 'label' and even a 'prediction'
    column), the outputs under names that collide with none."""
    _, exp, run_dir = fedprompt_run
    names = exp.task.class_names
    (tmp_path / "in.csv").write_text("id,text,label,prediction\n7,a wonderful film,positive,mine\n8,a bad one,"
                                     "negative,mine\n")
    res = runner.invoke(app, ["predict", str(run_dir), "--file", str(tmp_path / "in.csv"), "--out",
                              str(tmp_path / "out.csv")])
    assert res.exit_code == 0, res.output
    with (tmp_path / "out.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["id", "text", "label", "prediction", "fedpeft_prediction", *(f"p({c})" for c in names)]
    assert [(r["id"], r["label"], r["prediction"]) for r in rows] == [("7", "positive", "mine"),
                                                                       ("8", "negative", "mine")]
    assert all(r["fedpeft_prediction"] in names for r in rows)


def test_dry_run_counts_the_bytes_of_a_real_round(fedprompt_run):
    cfg, _, run_dir = fedprompt_run
    d = dry_run(cfg)
    rec = RunDir(run_dir).read_metrics()[0]
    sent = {c["client"]: c for c in rec["clients"]}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert d.down_bytes == sent[d.client]["bytes_down"]
    assert d.up_tensor_bytes == summary["upload_tensor_bytes"]
    assert d.trainable_params == summary["trainable_params"]
    # a real reply carries a few more scalars (loss, ...) than the zero reply: framing differs by little
    assert 0 <= sent[d.client]["bytes_up"] - d.up_bytes < 256
    assert d.up_framing_bytes == d.up_bytes - d.up_tensor_bytes > 0


def test_cli_dry_run_prints_bytes_and_writes_nothing(tmp_path):
    res = runner.invoke(app, ["run", "--dry-run", "--out", str(tmp_path / "r"), *_sets(FEDPROMPT)])
    assert res.exit_code == 0, res.output
    cfg = load_config(None, _overrides(FEDPROMPT))
    d = dry_run(cfg)
    assert "model:\n  name: tiny-bert" in res.output  # the resolved config as YAML
    assert f"trainable params {d.trainable_params:,}" in res.output
    assert f"receive {d.down_bytes:,} B" in res.output and f"send {d.up_bytes:,} B" in res.output
    assert not (tmp_path / "r").exists()


def test_bad_model_name_is_one_line_naming_the_field(tmp_path):
    with pytest.raises(ModelLoadError, match="model.name: 'no/such/model' is not a built-in model"):
        load_backbone("no/such/model")
    for extra in (["--dry-run"], []):
        res = runner.invoke(app, ["run", *extra, "--out", str(tmp_path / "r"),
                                  *_sets(FEDPROMPT | {"model.name": "no/such/model"})])
        assert res.exit_code == 2, res.output
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: model.name: 'no/such/model'"), res.output
        assert "tiny-bert" in lines[0] and "local path" in lines[0] and "hub is not reachable" in lines[0]
        assert "Traceback" not in res.output


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("federation:\n  rounds: 2\n  num_clients: [3\nseed: 1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+: invalid YAML"):
        load_config(bad)
    res = runner.invoke(app, ["run", str(bad), "--dry-run"])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "bad.yaml:" in lines[0] and "invalid YAML" in lines[0], res.output


@pytest.mark.parametrize("preset,model,extra", [
    ("fedbpt", "tiny-bert", {}),                                   # black-box CMA-ES on a projected prompt
    ("discrete-prompt", "tiny-bert-mlm", {}),                      # token prompt, LASSO download codec
    ("headprune", "tiny-llama", {}),                               # LoRA, per-client reply sizes
    ("icl", "tiny-llama", {}),                                     # demonstrations (token ids, nothing trained)
    ("fedprompt", "tiny-bert", {"model.readout": "linear"}),       # a trained, exchanged head
    ("fedprompt", "tiny-bert-mlm", {"model.calibration": "contextual"}),
])
def test_predict_and_dry_run_agree_with_the_run(preset, model, extra, tmp_path):
    from tests.conformance.test_presets import _cfg

    cfg = _cfg(preset, model, **{"federation.rounds": 1, **extra})
    exp = build_experiment(cfg)
    summary = run_embedded(cfg, tmp_path / "run", experiment=exp)
    rec = RunDir(tmp_path / "run").read_metrics()[0]
    rows = predict(tmp_path / "run", [e.text_a for e in exp.task.test])
    assert _accuracy(rows, exp.task.test, exp.task.class_names) == pytest.approx(rec["accuracy"])
    d = dry_run(cfg)
    sent = {c["client"]: c for c in rec["clients"]}
    assert d.down_bytes == sent[d.client]["bytes_down"]
    assert d.trainable_params == summary["trainable_params"]
    if d.up_upper_bound:
        assert d.up_tensor_bytes >= summary["upload_tensor_bytes"]
    else:
        assert d.up_tensor_bytes == summary["upload_tensor_bytes"]
