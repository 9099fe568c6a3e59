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
