"""A run directory is a thing you can keep, move and hand on (issue 35): it holds what using its model needs
(``model.json``), predict/export never read the training data, ``--resume`` refuses other data, other backbone
weights, other configs and directories that hold no run, a finished run can be extended, and
``evaluation.keep_best`` keeps the best validation round."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedpeft.cli import app
from fedpeft.data.types import Example
from fedpeft.predict import open_model, predict
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import StopAfterRound, run_embedded
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
USERS = ["ann", "bob", "cy"]


def write_csv(path: Path, rename: dict[str, str] | None = None) -> Path:
    rows = ["text,label,user"]
    for i in range(72):
        label = "good" if i % 2 else "bad"
        rows.append(f"{'great fun' if i % 2 else 'dull and slow'} number {i},{(rename or {}).get(label, label)},"
                    f"{USERS[i % 3]}")
    path.write_text("\n".join(rows) + "\n")
    return path


def sets(data: Path, **extra: object) -> list[str]:
    base = {"task.name": "csv", "task.path": str(data), "task.max_length": 24, "model.name": "tiny-bert",
            "method.adapter.num_tokens": 4, "method.trainer.max_steps": 3, "method.trainer.batch_size": 8,
            "federation.num_clients": 3, "federation.rounds": 2, "federation.partition.scheme": "by_column",
            "federation.partition.column": "user", "runtime.progress": False} | extra
    return [f"{k}={v}" for k, v in base.items()]


def cli_sets(data: Path, **extra: object) -> list[str]:
    return [a for item in sets(data, **extra) for a in ("--set", item)]


@pytest.fixture
def csv_run(tmp_path):
    (tmp_path / "data").mkdir()
    data = write_csv(tmp_path / "data" / "train.csv")
    run_dir = tmp_path / "run"
    run_embedded(load_config(None, sets(data)), run_dir)
    return data, run_dir


def strip(records):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


# ---------------------------------------------------------------- defect 1: self-contained


def test_model_json_holds_what_using_the_model_needs(csv_run):
    data, run_dir = csv_run
    record = json.loads((run_dir / "model.json").read_text())
    assert record["task"]["class_names"] == ["bad", "good"]
    assert record["task"]["label_descriptions"] and record["task"]["label_words"] == ["bad", "good"]
    assert {"template", "causal_template", "is_pair"} <= set(record["task"])
    assert record["readout"] == "similarity"
    assert record["backbone"]["name"] == "tiny-bert" and len(record["backbone"]["sha256"]) == 64
    (f,) = record["data"]["files"]
    assert f["path"] == str(data.absolute()) and f["size"] == data.stat().st_size and len(f["sha256"]) == 64
    assert record["clients"]["names"] == USERS
    assert load_config(run_dir / "config.yaml").task.path == str(data.absolute())  # resumable from anywhere


def test_predict_never_reads_the_training_data(csv_run, tmp_path, monkeypatch):
    data, run_dir = csv_run
    texts = ["great fun number 1", "dull and slow number 2"]
    before = predict(run_dir, texts)
    write_csv(data, rename={"good": "excellent"})  # a renamed class in the training file
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    after = predict(run_dir, texts)
    assert after == before  # the run's own classes and tensors, whatever became of the file
    data.unlink()
    assert predict(run_dir, texts) == before
    res = runner.invoke(app, ["predict", str(run_dir), "--text", texts[0]])
    assert res.exit_code == 0 and "p(good)" in res.output and "excellent" not in res.output


def test_resume_refuses_changed_data_naming_the_file(csv_run):
    data, run_dir = csv_run
    write_csv(data, rename={"good": "excellent"})
    res = runner.invoke(app, ["run", "--resume", str(run_dir), "--set", "federation.rounds=3"])
    assert res.exit_code == 2
    assert f"{data.absolute()}: changed since the run started" in res.output
    # nothing was touched: still a finished 2-round run
    assert load_config(run_dir / "config.yaml").federation.rounds == 2
    assert (run_dir / "summary.json").exists() and len(RunDir(run_dir).read_metrics()) == 3


def test_a_backbone_with_other_weights_is_refused(csv_run):
    _, run_dir = csv_run
    record = json.loads((run_dir / "model.json").read_text())
    record["backbone"]["sha256"] = "0" * 64
    (run_dir / "model.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="model.name: the backbone 'tiny-bert' loaded now .* is not the one the run"):
        open_model(run_dir)


def test_resume_refuses_a_backbone_with_other_weights(csv_run):
    _, run_dir = csv_run
    record = json.loads((run_dir / "model.json").read_text())
    record["backbone"]["sha256"] = "0" * 64
    (run_dir / "model.json").write_text(json.dumps(record))
    res = runner.invoke(app, ["run", "--resume", str(run_dir), "--set", "federation.rounds=3"])
    assert res.exit_code == 2
    assert "model.name: the backbone 'tiny-bert' loaded now" in res.output and "000000000000…" in res.output
    # nothing was touched: still a finished 2-round run, its record as it was
    assert load_config(run_dir / "config.yaml").federation.rounds == 2
    assert (run_dir / "summary.json").exists() and len(RunDir(run_dir).read_metrics()) == 3
    assert json.loads((run_dir / "model.json").read_text()) == record


# ---------------------------------------------------------------- defects 7 and 8; resume and extend


def test_predict_on_an_unfinished_run_says_which_round(tmp_path):
    data = write_csv(tmp_path / "train.csv")
    with pytest.raises(StopAfterRound):
        run_embedded(load_config(None, sets(data)), tmp_path / "run", stop_after_round=1)
    res = runner.invoke(app, ["predict", str(tmp_path / "run"), "--text", "great fun"])
    assert res.exit_code == 0, res.output
    assert "the global adapter after round 1 of 2 (the run is unfinished" in " ".join(res.output.split())


def test_resume_of_a_directory_without_a_run_is_an_error(tmp_path):
    data = write_csv(tmp_path / "train.csv")
    typo = tmp_path / "runz"
    for args in (["run", "--resume", "--out", str(typo), *cli_sets(data)], ["run", "--resume", str(typo)],
                 ["run", "--resume", "--out", str(typo)]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output
        assert "holds no run" in res.output
    assert not typo.exists()  # and nothing was created there


def test_resume_from_the_run_alone_and_extend_a_finished_run(csv_run, tmp_path):
    data, run_dir = csv_run
    res = runner.invoke(app, ["run", "--resume", str(run_dir), "--quiet"])  # no config file: the run's own
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["run", "--resume", str(run_dir), "--quiet", "--set", "federation.rounds=3"])
    assert res.exit_code == 0, res.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 3
    run_embedded(load_config(None, sets(data, **{"federation.rounds": 3})), tmp_path / "straight")
    assert strip(RunDir(run_dir).read_metrics()) == strip(RunDir(tmp_path / "straight").read_metrics())
    res = runner.invoke(app, ["run", "--resume", str(run_dir), "--set", "federation.rounds=2"])
    assert res.exit_code == 2 and "can be extended, not shortened" in res.output


def test_config_differs_names_each_key_and_both_values(csv_run):
    _, run_dir = csv_run
    res = runner.invoke(app, ["run", "--resume", str(run_dir), "--set", "seed=4", "--set",
                              "method.trainer.lr=0.5"])
    assert res.exit_code == 2
    out = " ".join(res.output.split())
    assert "seed: 0 in the run, 4 given" in out and "method.trainer.lr: 0.03 in the run, 0.5 given" in out


# ---------------------------------------------------------------- evaluation.keep_best


def test_keep_best_keeps_the_best_validation_round(tmp_path):
    data = write_csv(tmp_path / "train.csv")
    cfg = load_config(None, sets(data, **{"evaluation.keep_best": True, "federation.rounds": 3,
                                          "method.trainer.lr": 1.0}))
    from fedpeft.experiment import build_experiment

    exp = build_experiment(cfg)
    val, train, test = ({(e.text_a, e.label) for e in xs} for xs in (exp.validation, exp.task.train, exp.task.test))
    assert len(val) == 6 and not val & train and not val & test  # 10 % of the 57 training rows, held out
    summary = run_embedded(cfg, tmp_path / "run", experiment=exp)
    records = RunDir(tmp_path / "run").read_metrics()
    assert all(r["val_accuracy"] is not None for r in records)
    best = max(records, key=lambda r: r["val_accuracy"])  # the earliest of equal rounds
    assert summary["best_round"] == best["round"] and summary["accuracy_at_best_round"] == best["accuracy"]
    round_kept = RunDir(tmp_path / "run").load_checkpoint(best=True)[0]
    assert round_kept == best["round"]
    model = open_model(tmp_path / "run", best=True)
    assert model.round == best["round"] and "the best round on the validation split" in model.describe()
    probs = model.probabilities([Example(e.text_a, 0) for e in exp.validation]).argmax(-1)
    assert (probs.numpy() == exp.validation_encoded.labels).mean() == pytest.approx(best["val_accuracy"])


def test_without_keep_best_there_is_no_best_checkpoint(csv_run):
    _, run_dir = csv_run
    with pytest.raises(FileNotFoundError, match="keep_best"):
        open_model(run_dir, best=True)


# ---------------------------------------------------------------- names


def test_default_names_differ_between_configs_and_share_a_stem_across_seeds(tmp_path):
    data = write_csv(tmp_path / "train.csv")
    a, b = load_config(None, sets(data)), load_config(None, sets(data, **{"method.trainer.lr": 0.1}))
    a1 = load_config(None, sets(data, seed=1))
    assert a.default_name() != b.default_name()
    assert a.default_name().rsplit("-s", 1)[0] == a1.default_name().rsplit("-s", 1)[0]
    assert a.default_name().startswith("fedprompt-csv-tiny-bert-") and a.default_name().endswith("-s0")


def test_natural_clients_by_name_in_the_log_the_summary_and_client(csv_run):
    _, run_dir = csv_run
    log = (run_dir / "run.log").read_text()
    assert "client 1 (bob): " in log and "train (bad " in log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["client_names"] == {"0": "ann", "1": "bob", "2": "cy"}
    from fedpeft.predict import client_id

    assert client_id("bob", USERS, 3) == 1 and client_id("2", USERS, 3) == 2
    with pytest.raises(ValueError, match="names: ann, bob, cy"):
        client_id("dan", USERS, 3)
    assert os.path.exists(run_dir / "report.html")


def test_a_generation_only_key_saved_with_its_old_default_is_no_change_for_a_classifier():
    """Classification runs saved while evaluation.generate_every defaulted to 0 resume, and their benchmarks
    extend, under today's default (None): the key does nothing outside a generation task."""
    from fedpeft.build import run_plan
    from fedpeft.config import dump_config
    from fedpeft.resolve import load_config
    from fedpeft.runtime.session import config_changes

    cfg = load_config(None, ["task.name=sst2"])
    saved = dump_config(cfg.model_copy(update={"evaluation": cfg.evaluation.model_copy(
        update={"generate_every": 0})}).with_absolute_paths())
    assert config_changes(saved, run_plan(cfg)) == []
    gen = load_config(None, ["task.name=webnlg", "model.name=smollm2", "method.name=fedit"])
    saved = dump_config(gen.model_copy(update={"evaluation": gen.evaluation.model_copy(
        update={"generate_every": 0})}).with_absolute_paths())
    assert [k for k, *_ in config_changes(saved, run_plan(gen))] == ["evaluation.generate_every"]
