"""Backdoor data poisoning (FedPrompt §III-C): the poisoned set, where the trigger lands, the ASR test set, and the
attack inside a run (global and local ASR, honest weight, resume)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedpeft.attacks.backdoor import asr_examples, insert_trigger, kept_tokens, malicious_ids, poisoned_copies
from fedpeft.data.types import Example
from fedpeft.experiment import build_experiment
from fedpeft.runtime.embedded import StopAfterRound, run_embedded
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS

pytestmark = pytest.mark.usefixtures("one_thread")


def words(text: str) -> int:  # a whitespace "tokenizer": one token per word
    return len(text.split())


def test_kept_tokens_follows_longest_first_truncation():
    assert kept_tokens(10, 2, 20) == 10
    assert kept_tokens(30, 5, 20) == 15
    assert kept_tokens(30, 30, 20) == 10


def test_trigger_lands_inside_the_kept_part_of_a_long_text():
    ex = Example(" ".join(f"w{i}" for i in range(500)), 0)
    for seed in range(50):
        out = insert_trigger(ex, "cf", 1, words, 16, np.random.default_rng(seed))
        assert out.text_a.split().index("cf") < 16 and out.text_a.count("cf") == 1
    pair = Example(" ".join(["a"] * 40), 0, text_b=" ".join(["b"] * 40))
    out = insert_trigger(pair, "cf", 2, words, 20, np.random.default_rng(0))
    assert [i for i, w in enumerate(out.text_a.split()) if w == "cf"][-1] < 10 and out.text_b == pair.text_b


def test_poisoned_set_is_one_relabelled_triggered_copy_of_each_non_target_example():
    data = [Example(f"text number {i}", i % 3) for i in range(30)]
    copies = poisoned_copies(data, target=1, rate=1.0, trigger="cf", insertions=1, count=words, budget=50,
                             rng=np.random.default_rng(0))
    assert len(copies) == 20 and all(c.label == 1 and "cf" in c.text_a.split() for c in copies)
    assert sorted(c.text_a.replace(" cf", "").replace("cf ", "") for c in copies) == \
        sorted(e.text_a for e in data if e.label != 1)
    half = poisoned_copies(data, 1, 0.5, "cf", 1, words, 50, np.random.default_rng(0))
    assert len(half) == 10


def test_asr_set_excludes_target_inputs_and_labels_the_rest_as_target():
    data = [Example(f"t {i}", i % 2) for i in range(10)]
    idx, trig = asr_examples(data, 1, "cf", 1, words, 50, np.random.default_rng(0))
    assert idx.tolist() == [0, 2, 4, 6, 8] and all(t.label == 1 and "cf" in t.text_a for t in trig)


def test_malicious_ids_given_or_drawn_from_participants():
    assert malicious_ids([2], 0.0, 5, [0, 1, 2], np.random.default_rng(0)) == {2}
    drawn = malicious_ids(None, 0.4, 5, [0, 1, 2], np.random.default_rng(0))
    assert len(drawn) == 2 and drawn <= {0, 1, 2}
    with pytest.raises(ValueError, match="attack.malicious_clients"):
        malicious_ids([7], 0.0, 5, [0, 1], np.random.default_rng(0))


def test_malicious_client_trains_on_clean_plus_poison_with_its_honest_weight(tiny_cfg):
    cfg = tiny_cfg(attack__malicious_clients="[0]", attack__target=1)
    exp = build_experiment(cfg)
    clean = build_experiment(tiny_cfg())
    bad, good = exp.client(0), exp.client(1)
    n0 = len(clean.client(0).train)
    assert len(bad.train) == n0 + int((clean.client(0).train.labels != 1).sum()) and bad.num_examples == n0
    assert bad.train.input_ids[:n0] == clean.client(0).train.input_ids  # clean data kept
    assert good.train.input_ids == clean.client(1).train.input_ids and good.num_examples == len(good.train)
    assert set(exp.asr_test.labels.tolist()) == {1}


def test_a_poisoned_run_reports_global_and_local_asr_and_resumes_identically(tiny_cfg, tmp_path):
    cfg = tiny_cfg(attack__malicious_clients="[0]", federation__rounds=2)
    run_embedded(cfg, tmp_path / "full")
    recs = RunDir(tmp_path / "full").read_metrics()
    assert all(0 <= r["asr"] <= 1 for r in recs)
    assert all("local_asr" in c for r in recs for c in r["clients"])
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=1)
    run_embedded(cfg, tmp_path / "cut", resume=True)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]  # noqa: E731
    assert strip(RunDir(tmp_path / "cut").read_metrics()) == strip(recs)


def test_clean_run_measures_the_natural_error_asr_when_asked(tiny_cfg, tmp_path):
    summary = run_embedded(tiny_cfg(attack__asr=True, federation__rounds=1), tmp_path / "run")
    assert "final_asr" in summary and not build_experiment(tiny_cfg(attack__asr=True)).malicious


def test_boosting_scales_only_the_malicious_clients_delta(tiny_cfg):
    from fedpeft.build import build_method

    deltas = {}
    for boost in (1.0, 5.0):
        cfg = tiny_cfg(attack__malicious_clients="[0]", attack__boost=boost, federation__rounds=1)
        exp = build_experiment(cfg)
        method = build_method(cfg, exp)
        inst = method.configure_round(method.server_init(), 1, [0, 1])
        deltas[boost] = {c: method.client_update(inst[c], exp.client(c)).tensors["prompt"] - inst[c].tensors["prompt"]
                         for c in (0, 1)}
    assert torch.allclose(deltas[5.0][0], 5 * deltas[1.0][0], atol=1e-5)
    assert torch.equal(deltas[5.0][1], deltas[1.0][1])
