"""The log-likelihood suites: fedpeft's continuation scores equal lm-evaluation-harness's own (``HFLM``) on the same
model, the native ``mmlu`` suite predicts what ``lmeval:mmlu`` predicts on the same items, an adapter is handed to
lm-eval as weights (and a prompt, which is not weights, is refused), and BoolQ runs through the bridge."""

from __future__ import annotations

import json

import pytest
import torch

from fedpeft.suites import build_suite
from fedpeft.suites.loglikelihood import encode_pair, loglikelihoods

pytestmark = pytest.mark.usefixtures("one_thread")
lm_eval = pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def tiny():
    from fedpeft.predict import bare_model

    return bare_model("tiny-llama", "cpu")


def _hflm(model, tok):
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=model, tokenizer=tok, batch_size=3, prefix_token_id=0)


def test_continuation_scores_equal_lm_evals_own(tiny):
    from lm_eval.api.instance import Instance

    tok = tiny.objective.backbone.tokenizer
    long = "word " * 600  # past the tiny model's 512 positions: both keep the last tokens
    pairs = [("The capital of France is", " Paris"), ("The capital of France is", " Lyon"),
             ("Hello  ", "world and more"), ("Q: 2+2\nAnswer:", " A"), ("Q: 2+2\nAnswer:", " B"), (long, " end")]
    assert encode_pair(tok, "Hello  ", "world")[1] == tok("Hello  world")["input_ids"][len(tok("Hello")["input_ids"]):]
    ours, greedy = loglikelihoods(tiny.objective, tiny.params, pairs, batch_size=2)
    theirs = _hflm(tiny.objective.backbone.model, tok).loglikelihood(
        [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)], disable_tqdm=True)
    assert ours == pytest.approx([t[0] for t in theirs], abs=1e-4)
    assert list(greedy) == [t[1] for t in theirs]


def _mmlu(tmp_path, rows=2):
    folder = tmp_path / "MMLU"
    cats = {"stem": ["algebra"], "social_sciences": ["sociology"], "humanities": ["law"]}
    for split, n in (("test", rows), ("dev", 5)):
        (folder / split).mkdir(parents=True)
        for subjects in cats.values():
            for s in subjects:
                lines = [f'"{split} {s}: what is {k} plus {k}",{2 * k},{k},"{k}.50",None,{"ABCD"[k % 4]}'
                         for k in range(n)]
                (folder / split / f"{s}_{split}.csv").write_text("\n".join(lines) + "\n")
    (folder / "flowertune_categories.json").write_text(json.dumps(cats))
    return folder


def test_the_native_mmlu_suite_predicts_what_lm_eval_predicts_on_the_same_items(tiny, tmp_path):
    _mmlu(tmp_path, rows=2)
    ours = build_suite("mmlu", shots=2, data_dir=str(tmp_path / "MMLU")).run(tiny.objective, tiny.params, 4)
    theirs = build_suite("lmeval:mmlu", num_fewshot=2, data_dir=str(tmp_path)).run(tiny.objective, tiny.params, 4)
    assert ours.scores["accuracy"] == pytest.approx(theirs.scores["acc"])
    by_task = {(r["task"], r["doc_id"]): r for r in theirs.items}
    for item in ours.items:
        other = by_task[(f"fedpeft_mmlu_{item['subject']}", item["row"])]
        assert item["loglikelihoods"] == pytest.approx(other["loglikelihoods"], abs=1e-4)
        assert item["correct"] == bool(other["acc"])
    assert {"stem", "social_sciences", "humanities"} <= ours.scores.keys()
    assert len(ours.items) == 6 and ours.protocol["shots"] == 2


def test_the_mmlu_prompt_is_lm_evals_text():
    from fedpeft.suites.mmlu import context_of
    from fedpeft.suites.mmlu_data import Item

    shot = Item("high_school_physics", 0, "Shot? ", ("a", "b", "c", "d"), "C")
    q = Item("high_school_physics", 3, " Why", ("1", "2", "3", "4"), "A")
    assert context_of(q, [shot]) == (
        "The following are multiple choice questions (with answers) about high school physics.\n\n"
        "Shot?\nA. a\nB. b\nC. c\nD. d\nAnswer: C\n\nWhy\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer:")


def test_too_few_dev_rows_for_the_shots_is_a_clear_error(tiny, tmp_path):
    folder = _mmlu(tmp_path)
    (folder / "dev" / "law_dev.csv").write_text("q,1,2,3,4,A\n")
    with pytest.raises(ValueError, match=r"shots: 5, but .*law_dev.csv has 1 rows"):
        build_suite("mmlu", data_dir=str(folder)).run(tiny.objective, tiny.params)


def _lm(adapter: str, **settings):
    from fedpeft.adapters import ADAPTERS
    from fedpeft.adapters.base import AdapterContext
    from fedpeft.backbones.loading import load_backbone
    from fedpeft.data.types import TaskData
    from fedpeft.model.language_model import LanguageModel

    backbone = load_backbone("tiny-llama")
    task = TaskData(name="t", class_names=[], train=[], test=[], label_words=[], label_descriptions=[],
                    kind="generation")
    entry = ADAPTERS.entry(adapter)
    lm = LanguageModel(backbone, entry.obj(entry.settings(**settings)), task)
    lm.adapter.bind(AdapterContext(0, task, lm.readout, backbone))
    return lm, backbone


def test_a_lora_adapter_reaches_lm_eval_as_weights_and_a_prompt_is_refused(tmp_path):
    from fedpeft.model.decoding import weights_in_place
    from fedpeft.suites.loglikelihood import _encoded

    lm, backbone = _lm("lora", r=4)
    params = lm.adapter.init(backbone, torch.Generator().manual_seed(0))
    params = {k: v + 0.05 * torch.randn_like(v) for k, v in params.items()}  # B != 0: the update matters
    ids = [backbone.tokenizer("a small test of the weights")["input_ids"]]
    ours = lm.next_token_logprobs(params, _encoded([ids[0]], [len(ids[0]) - 1], 0), [list(range(5))])[0][0]
    with weights_in_place(lm, params) as model:
        logits = model(torch.tensor([ids[0][:-1]])).logits[0, -1]
    plain = backbone.model(torch.tensor([ids[0][:-1]])).logits[0, -1]
    assert ours == pytest.approx(torch.log_softmax(logits.double(), -1)[:5].numpy(), abs=1e-4)
    assert not torch.allclose(logits, plain)  # and outside, the backbone is itself again
    plm, _ = _lm("soft_prompt", num_tokens=2)
    with pytest.raises(ValueError, match="not a set of weights"):
        with weights_in_place(plm, plm.adapter.init(backbone, torch.Generator().manual_seed(0))):
            pass


def test_boolq_runs_through_lm_eval_on_local_files(tiny, tmp_path):
    folder = tmp_path / "BoolQ"
    folder.mkdir()
    rows = [{"question": f"is {k} even", "passage": f"The number {k}.", "idx": k, "label": k % 2 == 0}
            for k in range(4)]
    for name in ("train.jsonl", "val.jsonl"):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    _mmlu(tmp_path)
    result = build_suite("lmeval:boolq", limit=3, data_dir=str(tmp_path)).run(tiny.objective, tiny.params, 2)
    assert len(result.items) == 3 and 0 <= result.scores["acc"] <= 100
    assert result.suite == "lmeval:boolq" and "acc_stderr" in result.scores


def test_a_task_after_a_colon_is_for_lmeval_only():
    with pytest.raises(ValueError, match="only lmeval takes a task"):
        build_suite("mmlu:anatomy")
    assert build_suite("lmeval:mmlu", limit=2).settings.task == "mmlu"
    assert build_suite("mmlu", limit=2).settings.per_subject == 2
