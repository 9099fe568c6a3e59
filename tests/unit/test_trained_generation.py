"""Using a generation run afterwards, on a tiny random LLaMA: ``fedpeft generate --file`` reads the run's
instruction and input columns and ``--out`` writes the prompts and completions, unwrapped; ``fedpeft evaluate`` on
a generation run gives the metrics the run's own evaluation gives its test set, per example too; a never-trained
global adapter (local-only) is refused by generate, predict, evaluate and export, and a partly trained one
(FedSA-LoRA) is used with a warning; ``--file`` errors name the option, the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_overrides
from typer.testing import CliRunner

from fedpeft.cli import app
from fedpeft.config import TaskConfig
from fedpeft.data.types import Example
from fedpeft.predict import TrainedModel, open_model
from fedpeft.prediction_files import read_inputs
from fedpeft.resolve import load_config, resolve
from fedpeft.runtime.embedded import run_embedded
from fedpeft.tracking.rundir import RunDir

runner = CliRunner()
WORDS = ["apple", "river", "stone", "cloud", "green", "music"]
TASK = {"name": "jsonl", "instruction_column": "ask", "input_column": "context", "response_column": "answer",
        "references_column": "refs", "max_length": 64, "max_response_length": 8}


def _rows() -> list[dict]:
    """Instructions with an input on every other row and two references each (the answer and a variant)."""
    pairs = [(a, b) for a in WORDS for b in WORDS if a != b]
    return [{"ask": f"Join {a} and {b}", "context": "lowercase" if i % 2 else "", "answer": f"{a} {b}",
             "refs": [f"{a} {b}", f"{a} and {b}"], "cat": f"c{i % 2}"} for i, (a, b) in enumerate(pairs)]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _generation_run(folder: Path, method: str, **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = _rows()
    _write(folder / "train.jsonl", rows[:24])
    _write(folder / "test.jsonl", rows[24:30])
    raw = {"seed": 0, "task": TASK | {"path": str(folder)}, "model": {"name": "tiny-llama"},
           "method": {"name": method, **extra},
           "federation": {"num_clients": 2, "rounds": 1, "partition": {"scheme": "by_column", "column": "cat"}},
           "evaluation": {"generate_every": 1, "max_new_tokens": 4, "generate_examples": None, "show_examples": 1},
           "runtime": {"progress": False, "threads": 1}}
    run_embedded(resolve(raw), folder / "run")
    return folder / "run"


@pytest.fixture(scope="module")
def fedit_run(tmp_path_factory, one_thread_module) -> Path:
    return _generation_run(tmp_path_factory.mktemp("fedit"), "fedit", trainer={"lr": 0.01})


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, one_thread_module) -> Path:
    return _generation_run(tmp_path_factory.mktemp("local"), "local-only", adapter={"name": "lora", "r": 2},
                           trainer={"name": "adamw", "lr": 0.01})


@pytest.fixture(scope="module")
def fedsa_run(tmp_path_factory, one_thread_module) -> Path:
    return _generation_run(tmp_path_factory.mktemp("fedsa"), "fedit", sharing={"name": "fedsa"})


# ---------------------------------------------------------------- generate --file / --out


def test_generate_reads_the_runs_columns_and_writes_prompts_and_generations(fedit_run, tmp_path):
    rows = _rows()[24:27] + [{"ask": "Join stone and cloud", "note": "no input column in this row"}]
    infile = _write(tmp_path / "in.jsonl", rows)
    out = tmp_path / "gen.jsonl"
    res = runner.invoke(app, ["generate", str(fedit_run), "--file", str(infile), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "generating with the global adapter after round 1 of 1" in res.stderr and "predicting" not in res.output
    model = open_model(fedit_run)
    examples = [Example(r["ask"], 0, r.get("context") or None) for r in rows]
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [w["generation"] for w in written] == model.generate(examples)
    assert [w["prompt"] for w in written] == model.prompt_texts(examples)
    assert "### Input:\nlowercase" in written[1]["prompt"] and "Input" not in written[0]["prompt"]
    assert all(w["answer"] not in w["prompt"] for w in written[:3])  # the reference is never part of the prompt
    assert [{k: v for k, v in w.items() if k not in ("prompt", "prompt_cut", "generation")} for w in written] == rows
    assert [w["prompt_cut"] for w in written] == [False] * 4
    csv_out = tmp_path / "gen.csv"
    res = runner.invoke(app, ["generate", str(fedit_run), "--prompt", "Join apple and river", "--out", str(csv_out)])
    assert res.exit_code == 0, res.output
    assert csv_out.read_text().splitlines()[0] == "instruction,prompt,prompt_cut,generation"
    # a prompt beyond task.max_length: the model reads it cut, and generate says so (a warning, a note, a column)
    long = "Join " + " ".join(f"word{i}" for i in range(80))
    res = runner.invoke(app, ["generate", str(fedit_run), "--prompt", long])
    assert res.exit_code == 0, res.output
    assert "the model read this prompt cut to task.max_length" in res.output
    assert model.generate_and_cuts([long, "Join apple and river"])[1] == [True, False]


def test_generate_prints_completions_unwrapped(fedit_run, tmp_path, monkeypatch):
    long = " ".join(f"word{i}" for i in range(60))  # far wider than the 120 columns of a non-terminal console
    monkeypatch.setattr(TrainedModel, "generate_and_cuts",
                        lambda self, prompts, *a, **k: ([long] * len(prompts), [False] * len(prompts)))
    (tmp_path / "in.txt").write_text("Join apple and river\n\nJoin stone and cloud\n")
    res = runner.invoke(app, ["generate", str(fedit_run), "--file", str(tmp_path / "in.txt")])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == ["> Join apple and river", long, "> Join stone and cloud", long]


def test_generate_file_errors_name_the_option_the_file_and_the_line(fedit_run, tmp_path):
    cases = {"bad.jsonl": (b'{"ask": "a"}\n{"ask": oops}\n', "bad.jsonl line 2 is not valid JSON"),
             "nocol.jsonl": (b'{"question": "a"}\n', "has no instruction column 'ask' (the run's "
                                                    "task.instruction_column); columns found: question"),
             "noinput.csv": (b"ask\nJoin a and b\n", "has no input column 'context'"),
             "bytes.csv": (b"ask,context\nfine,\nbad \xff byte,\n", "bytes.csv line 3 is not valid utf-8"),
             "bytes.txt": (b"one\n\nthree \xfe\n", "bytes.txt line 3 is not valid utf-8"),
             "empty.jsonl": (b'{"ask": "a", "context": ""}\n{"ask": " ", "context": "x"}\n',
                             "empty.jsonl line 2: empty instruction in column 'ask'")}
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        res = runner.invoke(app, ["generate", str(fedit_run), "--file", str(tmp_path / name)])
        assert res.exit_code == 2, (name, res.output)
        line = res.stderr.strip().splitlines()[-1]
        assert line.startswith("error: --file: ") and message in line, (name, line)
        assert "codec" not in line and "Errno" not in line and "task.path" not in line, line


def test_file_readers_name_the_line_of_an_undecodable_byte(tmp_path):
    from fedpeft.prediction_files import read_prompts

    (tmp_path / "t.txt").write_bytes(b"fine\n\nbad \xff\n")
    with pytest.raises(ValueError, match=r"^--file: .*t\.txt line 3 is not valid utf-8 \(byte 0xff at column 5\)"):
        read_inputs(tmp_path / "t.txt", TaskConfig(name="csv"))
    (tmp_path / "t.jsonl").write_bytes(b'{"text": "a"}\n{"text": "\xff"}\n')
    with pytest.raises(ValueError, match=r"^--file: .*t\.jsonl line 2 is not valid utf-8"):
        read_inputs(tmp_path / "t.jsonl", TaskConfig(name="csv"))
    (tmp_path / "p.txt").write_text("first\n\n\nfourth\n")
    assert read_prompts(tmp_path / "p.txt", TaskConfig(name="webnlg")).where[1].endswith("p.txt line 4")


def test_a_builtin_tasks_run_reads_its_records_column_names(tmp_path):
    """WebNLG's and Dolly's files: instruction, input, output, references; input and references optional."""
    from fedpeft.prediction_files import read_prompts

    rows = [{"instruction": "Describe", "input": "A | b | C", "output": "A b C.", "references": ["A b C.", "C"]},
            {"instruction": "Say hi", "output": "hi"}]
    labelled = read_prompts(_write(tmp_path / "w.jsonl", rows), TaskConfig(name="webnlg"), labelled=True)
    assert labelled.examples == [Example("Describe", 0, "A | b | C", target="A b C.", references=("A b C.", "C")),
                                 Example("Say hi", 0, None, target="hi")]
    plain = read_prompts(_write(tmp_path / "p.jsonl", [{"instruction": "Say hi"}]), TaskConfig(name="dolly"))
    assert plain.examples == [Example("Say hi", 0)]


# ---------------------------------------------------------------- evaluate on a generation run


def test_evaluate_a_generation_run_gives_its_own_test_metrics(fedit_run, tmp_path):
    """The run's test file scored by ``fedpeft evaluate``: the numbers the run recorded for its test set (loss and
    perplexity teacher-forced, BLEU/chrF/ROUGE-L/exact match of greedy completions, two references each)."""
    out = tmp_path / "m.json"
    test_file = fedit_run.parent / "test.jsonl"
    res = runner.invoke(app, ["evaluate", str(fedit_run), "--file", str(test_file), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "evaluating with the global adapter" in res.stderr
    assert "text column" not in res.output and "confusion" not in res.output
    last = RunDir(fedit_run).read_metrics()[-1]
    m = json.loads(out.read_text())
    assert m["num_examples"] == 6 and m["loss"] == pytest.approx(last["loss"], rel=1e-6)
    assert m["perplexity"] == pytest.approx(last["perplexity"], rel=1e-6)
    assert m["token_accuracy"] == pytest.approx(last["accuracy"])
    for key in ("bleu", "chrf", "rouge_l", "exact_match"):
        assert m[key] == pytest.approx(last["generation"][key]), key
    assert "accuracy" not in m and "per_class" not in m and "confusion" not in m
    rows = _rows()[24:30]
    assert [e["references"] for e in m["examples"]] == [r["refs"] for r in rows]
    assert [e["input"] for e in m["examples"]] == [r["context"] or None for r in rows]
    assert m["examples"][0]["source"].endswith("test.jsonl line 1")
    assert [e["generation"] for e in m["examples"]] == open_model(fedit_run).generate(
        [Example(r["ask"], 0, r["context"] or None) for r in rows])
    first = m["examples"][0]
    assert {"loss", "perplexity", "rouge_l", "exact_match"} <= set(first) and first["loss"] > 0
    for name in ("loss per response token", "perplexity", "BLEU", "chrF", "ROUGE-L", "exact match"):
        assert name in res.stdout, name


def test_evaluate_a_generation_run_needs_its_response_column(fedit_run, tmp_path):
    infile = _write(tmp_path / "x.jsonl", [{"ask": "Join a and b", "context": ""}])
    res = runner.invoke(app, ["evaluate", str(fedit_run), "--file", str(infile)])
    assert res.exit_code == 2
    assert "--file:" in res.stderr and "no response column 'answer'" in res.stderr and "text column" not in res.stderr


# ---------------------------------------------------------------- untrained global adapters


def test_local_only_refuses_the_global_adapter_and_asks_for_a_client(local_run, tmp_path):
    test_file = str(local_run.parent / "test.jsonl")
    for args in (["generate", str(local_run), "--prompt", "Join apple and river"],
                 ["evaluate", str(local_run), "--file", test_file],
                 ["export", str(local_run), str(tmp_path / "peft")]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args[0], res.output)
        assert "method.sharing 'local'" in res.stderr and "never trained" in res.stderr, res.stderr
        assert "--client K (ids 0..1, or names c0, c1)" in res.stderr and "after round" not in res.stdout
    assert not (tmp_path / "peft").exists()
    with pytest.raises(ValueError, match="never trained"):
        open_model(local_run)
    assert open_model(local_run, untrained_ok=True).untrained  # the Python API can still look at it
    res = runner.invoke(app, ["generate", str(local_run), "--prompt", "Join apple and river", "--client", "c1"])
    assert res.exit_code == 0, res.output
    assert "generating with client 1 (c1)'s personalised adapter" in res.stderr
    res = runner.invoke(app, ["export", str(local_run), str(tmp_path / "peft"), "--client", "0"])
    assert res.exit_code == 0, res.output


def test_fedsa_lora_global_adapter_is_used_with_a_warning(fedsa_run):
    """FedSA-LoRA shares A, which is trained: the global adapter is used, but B stays 0 on the server, so the
    commands warn that it is the frozen backbone and point to --client."""
    model = open_model(fedsa_run)
    assert model.untrained and all(k.endswith(".lora_B.weight") for k in model.untrained)
    assert "frozen backbone" in model.warning and "frozen backbone" in model.describe()
    res = runner.invoke(app, ["generate", str(fedsa_run), "--prompt", "Join apple and river"])
    assert res.exit_code == 0, res.output
    assert "warning: method.sharing 'fedsa' keeps" in res.stderr and "--client K" in res.stderr
    own = runner.invoke(app, ["generate", str(fedsa_run), "--prompt", "Join apple and river", "--client", "0"])
    assert own.exit_code == 0 and "warning: method.sharing" not in own.stderr, own.output
    assert open_model(fedsa_run, client=0).warning is None


def test_predict_refuses_a_local_only_classifiers_global_adapter(tmp_path, one_thread_module):
    cfg = load_config(None, tiny_overrides(**{"method.sharing.name": "local", "federation.rounds": 1}))
    run_embedded(cfg, tmp_path / "run")
    res = runner.invoke(app, ["predict", str(tmp_path / "run"), "--text", "a fine film"])
    assert res.exit_code == 2 and "never trained" in res.stderr and "--client K (ids 0..2)" in res.stderr
    res = runner.invoke(app, ["predict", str(tmp_path / "run"), "--text", "a fine film", "--client", "2"])
    assert res.exit_code == 0, res.output
    assert "predicting with client 2's personalised adapter" in res.stderr
