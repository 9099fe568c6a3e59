"""Contextual calibration (Zhao et al. 2021): log p(y|x) - log mean_cf p(y|content-free), per population candidate."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedpeft.adapters.projected_prompt import ProjectedPrompt, ProjectedPromptSettings
from fedpeft.adapters.soft_prompt import SoftPrompt, SoftPromptSettings
from fedpeft.model.blackbox import BlackBox
from fedpeft.model.classifier import Classifier, evaluate
from fedpeft.backbones.loading import load_backbone
from fedpeft.data.types import Example, TaskData
from fedpeft.experiment import build_experiment

pytestmark = pytest.mark.usefixtures("one_thread")

TASK = TaskData(
    name="toy", class_names=["neg", "pos"], train=[], test=[],
    label_words=["bad", "great"], label_descriptions=["it is bad", "it is great"],
    template="{text_a} It was {mask}.", causal_template="Review: {text_a}\nIt was",
)
EXAMPLES = [Example("the film was a total waste of time and money", 0), Example("lovely", 1),
            Example("a dull and tired plot", 0), Example("great acting", 1), Example("fine", 1)]
CASES = [("tiny-llama", "verbalizer"), ("tiny-bert-mlm", "verbalizer"), ("tiny-bert", "similarity")]


def _clf(model: str, readout: str = "auto", calibration: str = "none", adapter=None, **kw) -> Classifier:
    adapter = adapter or SoftPrompt(SoftPromptSettings(num_tokens=2))
    return Classifier(load_backbone(model), adapter, TASK, readout, max_length=16, calibration=calibration, **kw)


def _params(clf: Classifier) -> dict[str, torch.Tensor]:
    return clf.init_params(torch.Generator().manual_seed(0))


@pytest.mark.parametrize("model, readout", CASES)
def test_calibrated_logits_equal_the_equation_from_separate_forwards(model, readout):
    raw_clf = _clf(model, readout)
    cal_clf = _clf(model, readout, "contextual", adapter=raw_clf.adapter)
    params = _params(raw_clf)
    enc = raw_clf.encode(EXAMPLES)
    cf = cal_clf.content_free_encoded()
    assert len(cf) == 3  # "N/A", "" and the tokenizer's mask token
    raw = raw_clf.logits(params, raw_clf.batch(enc, range(len(enc))))
    raw_cf = raw_clf.logits(params, raw_clf.batch(cf, range(len(cf))))
    want = F.log_softmax(raw, -1) - torch.log(F.softmax(raw_cf, -1).mean(0))
    got = cal_clf.logits(params, cal_clf.batch(enc, range(len(enc))))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # evaluate() goes through the calibrated logits
    ev = evaluate(cal_clf, params, enc, batch_size=2)
    labels = torch.as_tensor(enc.labels)
    assert ev["loss"] == pytest.approx(float(F.cross_entropy(want, labels)), abs=1e-5)
    assert ev["accuracy"] == pytest.approx(float((want.argmax(-1) == labels).float().mean()))


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-bert-mlm"])
def test_population_candidates_are_calibrated_with_their_own_content_free_probabilities(model):
    pp = ProjectedPromptSettings(num_tokens=3, intrinsic_dim=8, seed=5)
    cal = _clf(model, calibration="contextual", adapter=ProjectedPrompt(pp))
    raw = _clf(model, adapter=ProjectedPrompt(pp))
    data = cal.encode(EXAMPLES)
    z = torch.randn(3, 8, generator=torch.Generator().manual_seed(1)) * 3
    box = BlackBox(cal)
    batched = box.logits(z, data)  # [P, n, C], one forward per chunk for all 3 candidates
    assert box.usage.queries == 1
    torch.testing.assert_close(batched, BlackBox(cal, batched=False).logits(z, data), atol=1e-5, rtol=1e-5)
    raw_logits = BlackBox(raw).logits(z, data)
    raw_cf = BlackBox(raw).logits(z, cal.content_free_encoded())  # [P, k, C]
    shifts = []
    for c in range(3):
        alone = BlackBox(cal).logits(z[c], data)[0]
        torch.testing.assert_close(batched[c], alone, atol=1e-5, rtol=1e-5)
        log_pcf = torch.log(F.softmax(raw_cf[c], -1).mean(0))
        torch.testing.assert_close(batched[c], F.log_softmax(raw_logits[c], -1) - log_pcf, atol=1e-5, rtol=1e-5)
        shifts.append(log_pcf)
    assert not torch.allclose(shifts[0], shifts[1], atol=1e-4)  # p_cf really depends on the candidate


def test_content_free_input_gets_uniform_calibrated_prediction_despite_a_strong_bias():
    raw = _clf("tiny-llama")
    cal = _clf("tiny-llama", calibration="contextual", adapter=raw.adapter, content_free=("N/A",))
    bias = torch.tensor([8.0, 0.0])
    for clf in (raw, cal):  # a made-up strong preference for class 0 in the raw readout
        orig = clf.readout_logits
        clf.readout_logits = lambda *a, orig=orig: orig(*a) + bias  # type: ignore[method-assign]
    params = _params(raw)
    enc = raw.encode(EXAMPLES)
    b = raw.batch(enc, range(len(enc)))
    assert (raw.logits(params, b).argmax(-1) == 0).all()  # uncalibrated: one class for every input
    cf_input = cal.encode([Example("N/A", 0)])
    cf_probs = F.softmax(cal.logits(params, cal.batch(cf_input, [0])), -1)
    torch.testing.assert_close(cf_probs, torch.full_like(cf_probs, 0.5), atol=1e-5, rtol=0)
    # with one content-free input a constant logit bias cancels exactly (up to a per-row shift of the logits)
    unbiased = _clf("tiny-llama", calibration="contextual", adapter=raw.adapter, content_free=("N/A",))
    torch.testing.assert_close(F.softmax(cal.logits(params, b), -1), F.softmax(unbiased.logits(params, b), -1),
                               atol=1e-5, rtol=1e-5)


def test_linear_readout_rejects_calibration():
    with pytest.raises(ValueError, match="model.calibration"):
        _clf("tiny-bert", "linear", "contextual")


@pytest.mark.parametrize("model, readout", CASES)
def test_calibration_none_leaves_logits_bitwise_unchanged(model, readout):
    none = _clf(model, readout, "none")
    default = Classifier(load_backbone(model), none.adapter, TASK, readout, max_length=16)  # no keyword at all
    params = _params(none)
    enc = none.encode(EXAMPLES)
    b = none.batch(enc, range(len(enc)))
    out, prep, p = none._forward(params, b)  # the plain forward + readout, no content-free rows
    plain = none.readout_logits(out, prep, b, p)
    assert torch.equal(none.logits(params, b), plain) and torch.equal(default.logits(params, b), plain)


def test_config_passes_calibration_to_the_classifier(tiny_cfg):
    assert build_experiment(tiny_cfg()).objective.calibration == "none"
    exp = build_experiment(tiny_cfg(model__calibration="contextual"))
    assert exp.objective.calibration == "contextual"
    with pytest.raises(ValueError, match="model.calibration"):
        build_experiment(tiny_cfg(model__calibration="contextual", model__readout="linear"))
