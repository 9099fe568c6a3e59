"""The gradient trainer's learning rates: one rate for every trained tensor, or the readout head at its own
(``method.trainer.head_lr``), checked on one SGD step against the gradients computed by hand."""

from __future__ import annotations

import pytest
import torch

from fedpeft.adapters.soft_prompt import SoftPrompt, SoftPromptSettings
from fedpeft.backbones.loading import load_backbone
from fedpeft.data.types import Example, TaskData
from fedpeft.model.classifier import Classifier
from fedpeft.trainers.gradient import GradientSettings, param_groups, train_local

pytestmark = pytest.mark.usefixtures("one_thread")

TASK = TaskData(name="toy", class_names=["neg", "pos"], train=[], test=[], label_words=["bad", "great"],
                label_descriptions=["it is bad", "it is great"])
EXAMPLES = [Example("the film was a waste of time", 0), Example("lovely and warm", 1)] * 2


def _one_sgd_step(**rates):
    clf = Classifier(load_backbone("tiny-bert"), SoftPrompt(SoftPromptSettings(num_tokens=3)), TASK, "linear",
                     max_length=12)
    params = clf.init_params(torch.Generator().manual_seed(0))
    enc = clf.encode(EXAMPLES)
    cfg = GradientSettings(batch_size=4, max_steps=1, grad_clip=None, **rates)
    # the gradient at the start, on the one batch the step sees (all four examples)
    work = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    clf.loss(clf.outputs(work, clf.batch(enc, [0, 1, 2, 3])), clf.batch(enc, [0, 1, 2, 3])).backward()
    res = train_local(clf, params, enc, "sgd", cfg, torch.Generator().manual_seed(0))
    return params, {k: w.grad for k, w in work.items()}, res.params


def test_head_lr_trains_the_readout_head_at_its_own_rate():
    start, grad, trained = _one_sgd_step(lr=0.1, head_lr=2.0)
    assert set(start) == {"prompt", "head.weight", "head.bias"}
    for name, rate in (("prompt", 0.1), ("head.weight", 2.0), ("head.bias", 2.0)):  # SGD: w - rate * grad
        assert torch.allclose(trained[name], start[name] - rate * grad[name], atol=1e-6), name


def test_without_head_lr_every_tensor_trains_at_lr_in_one_group():
    start, grad, trained = _one_sgd_step(lr=0.1)
    for name in start:
        assert torch.allclose(trained[name], start[name] - 0.1 * grad[name], atol=1e-6), name
    assert param_groups(["head.bias", "prompt"], GradientSettings()) == [["head.bias", "prompt"]]
    assert param_groups(["head.bias", "prompt"], GradientSettings(head_lr=1.0)) == [["prompt"], ["head.bias"]]
    assert param_groups(["prompt"], GradientSettings(head_lr=1.0)) == [["prompt"]]  # no head: one group


@pytest.mark.parametrize("schedule, ratio", [("linear", 0.06), ("linear", 0.0), ("constant", 0.25)])
def test_the_learning_rate_schedule_is_transformers_linear_schedule_with_warmup(schedule, ratio):
    from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

    from fedpeft.trainers.gradient import lr_factor

    steps = 29
    cfg = GradientSettings(lr=1.0, schedule=schedule, warmup_ratio=ratio)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    warmup = int(steps * ratio)
    hf = (get_linear_schedule_with_warmup(opt, warmup, steps) if schedule == "linear"
          else get_constant_schedule_with_warmup(opt, warmup))
    want = []
    for _ in range(steps):
        want.append(opt.param_groups[0]["lr"])
        opt.step()
        hf.step()
    assert [lr_factor(s, steps, cfg) for s in range(steps)] == pytest.approx(want, abs=1e-12)


def test_a_linear_schedule_moves_the_tensors_less_than_the_constant_rate():
    clf = Classifier(load_backbone("tiny-bert"), SoftPrompt(SoftPromptSettings(num_tokens=3)), TASK, "linear",
                     max_length=12)
    params = clf.init_params(torch.Generator().manual_seed(0))
    data = clf.encode(EXAMPLES)
    moved = {}
    for schedule in ("constant", "linear"):
        cfg = GradientSettings(lr=0.1, batch_size=4, local_epochs=4, schedule=schedule, warmup_ratio=0.5)
        out = train_local(clf, params, data, "sgd", cfg, torch.Generator().manual_seed(1)).params
        moved[schedule] = sum(float((out[k] - params[k]).abs().sum()) for k in params)
    assert 0 < moved["linear"] < moved["constant"]


def test_pooler_pooling_reads_the_encoders_pretrained_pooler_as_hf_sequence_classification_does():
    from transformers import BertForSequenceClassification

    from fedpeft.adapters.identity import TemplateOnly

    backbone = load_backbone("tiny-bert")
    plain = Classifier(backbone, TemplateOnly(), TASK, "linear", max_length=12, pooling="pooler")
    batch = plain.batch(plain.encode(EXAMPLES), [0, 1])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    hf = BertForSequenceClassification(backbone.model.config).eval()
    plain_weights = {k.replace(".base_layer", ""): v for k, v in backbone.model.state_dict().items()
                     if ".lora_" not in k}  # the shared backbone may carry other tests' LoRA layers
    hf.bert.load_state_dict(plain_weights)
    params = {"head.weight": hf.classifier.weight.detach().clone(), "head.bias": hf.classifier.bias.detach().clone()}
    with torch.no_grad():
        torch.testing.assert_close(plain.logits(params, batch), hf(input_ids=ids, attention_mask=mask).logits,
                                   rtol=1e-5, atol=1e-6)
