"""P-tuning adapter (FedPrompt Table VI β): the 25.420M count, gradients to every tensor, a federated run whose
upload is the whole template, and prompts that are a deterministic function of the exchanged tensors."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_overrides

from fedpeft.adapters.p_tuning import PTuning, PTuningSettings, template_shapes
from fedpeft.build import build
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded

pytestmark = pytest.mark.usefixtures("one_thread")


def _count(shapes):
    return sum(math.prod(s) for s in shapes.values())


def test_table_vi_count_from_bert_base_shapes():
    d, m = 768, 20
    lstm = template_shapes(d, m, "lstm")
    parts = {"lstm": sum(math.prod(s) for k, s in lstm.items() if ".lstm." in k),
             "mlp": sum(math.prod(s) for k, s in lstm.items() if ".mlp." in k)}
    assert parts == {"lstm": 23_617_536, "mlp": 1_771_008} and lstm["ptuning.embedding"] == (m, d)
    assert _count(lstm) == 25_420_032 - 21 * 768  # what this adapter trains and sends
    # Table VI's 25.420M also counts OpenPrompt's unused MixedTemplate soft_embedding [(m+1), d]
    assert _count(template_shapes(d, m, "lstm", openprompt_soft_embedding=True)) == 25_420_032
    mlp = template_shapes(d, m, "mlp")
    assert _count(mlp) == 2 * (768 * 768 + 768) + m * d == 1_196_544
    assert _count(template_shapes(d, m, "mlp", openprompt_soft_embedding=True)) == 1_212_672


@pytest.mark.parametrize("encoder", ["lstm", "mlp"])
@pytest.mark.parametrize("model", ["tiny-bert", "tiny-llama"])
def test_every_tensor_gets_a_gradient(model, encoder):
    # switching the adapter of the fedprompt preset keeps only the keys given here
    cfg = load_config(None, tiny_overrides(method__name="fedprompt", method__adapter__name="p_tuning",
                                           method__adapter__encoder=encoder, model__name=model))
    assert cfg.method.adapter.name == "p_tuning" and cfg.method.adapter.num_tokens == 4
    exp = build(cfg).exp
    clf = exp.objective
    params = {k: v.requires_grad_(True) for k, v in clf.init_params(torch.Generator().manual_seed(0)).items()}
    batch = clf.batch(exp.client(0).train, list(range(8)))
    torch.nn.functional.cross_entropy(clf.logits(params, batch), batch["labels"]).backward()
    adapter = {k: v for k, v in params.items() if k.startswith("ptuning.")}
    assert set(adapter) == set(template_shapes(clf.backbone.hidden_size, 4, encoder))
    assert all(v.grad is not None and v.grad.abs().sum() > 0 for v in adapter.values()), \
        [k for k, v in adapter.items() if v.grad is None or not v.grad.abs().sum() > 0]


def test_two_round_run_uploads_the_whole_template(tmp_path):
    cfg = load_config(None, tiny_overrides(method__name="fedprompt-ptuning"))
    summary = run_embedded(cfg, tmp_path / "run")
    d = 32  # tiny-bert hidden size
    assert summary["rounds"] == 2 and summary["backbone_unchanged"]
    assert summary["trainable_params"] == _count(template_shapes(d, 4, "lstm"))
    assert summary["upload_tensor_bytes"] == 4 * summary["trainable_params"]


def test_prompt_is_a_deterministic_function_of_the_params():
    built = build(load_config(None, tiny_overrides(method__name="fedprompt-ptuning")))
    method, exp = built.method, built.exp
    inst = method.configure_round(method.server_init(), 1, [0, 1])
    a, b = (method.client_update(inst[c], exp.client(c)).tensors for c in (0, 1))
    again = method.client_update(inst[0], exp.client(0)).tensors
    fresh = PTuning(PTuningSettings(num_tokens=4))  # another process's adapter: same tensors, same prompt
    prompt = exp.objective.adapter.prompt
    with torch.no_grad():
        assert not torch.equal(prompt(a, 32), prompt(b, 32))
        assert all(torch.equal(a[k], again[k]) for k in a)
        assert torch.equal(prompt(a, 32), fresh.prompt(again, 32))
    g = lambda: torch.Generator().manual_seed(7)  # noqa: E731
    one, two = fresh.init(exp.backbone, g()), fresh.init(exp.backbone, g())
    assert all(torch.equal(one[k], two[k]) for k in one)
