"""FedBPT end to end on tiny random backbones: projection, black box, perturbation, bytes, no gradients, resume,
and the faithfulness switches (uploaded fitness, shared noise, pycma options, covariance model)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from conftest import tiny_overrides

from fedpeft.adapters.projected_prompt import (
    ProjectedPrompt,
    ProjectedPromptSettings,
    projection_std,
)
from fedpeft.model.blackbox import BlackBox
from fedpeft.model.classifier import Classifier
from fedpeft.backbones.loading import load_backbone
from fedpeft.comm.codec import decode, encode, framing_overhead, payload_bytes
from fedpeft.build import build_method
from fedpeft.config import ConfigError
from fedpeft.resolve import load_config
from fedpeft.data import load_task
from fedpeft.data.types import Example
from fedpeft.experiment import build_experiment
from fedpeft.methods import PRESETS
from fedpeft.perturbation import perturb, ratio_fitness, replacement_vocab, text_span
from fedpeft.runtime.embedded import StopAfterRound, run_embedded
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS
from fedpeft.trainers import cmaes as cmaes_module
from fedpeft.trainers.black_box import cmaes_streams
from fedpeft.trainers.cmaes import CMAESSettings, CMAState, local_cmaes

D, I, M = 24, 3, 4


pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(method: str = "fedbpt", **extra):
    base = {"method.adapter.num_tokens": M, "method.adapter.intrinsic_dim": D, "method.trainer.iterations": I} \
        if method in ("fedbpt", "fedavg-bbt") else {}
    over = tiny_overrides(method__name=method, method__adapter__num_tokens=None, method__trainer__max_steps=None,
                          method__trainer__batch_size=None, task__num_examples=96, **(base | extra))
    return load_config(None, over)


def _classifier(model: str, seed: int = 3, pooling: str = "all", **adapter) -> Classifier:
    cfg = load_config(None, tiny_overrides(**{"model.name": model}))
    task = load_task(cfg.task, 0)
    adapter = ProjectedPrompt(ProjectedPromptSettings(num_tokens=M, intrinsic_dim=D, seed=seed, **adapter))
    clf = Classifier(load_backbone(model), adapter, task, "auto", 20.0, 24, pooling=pooling)
    clf.task_examples = task.train  # type: ignore[attr-defined]
    return clf


def test_presets_listed_and_config_errors_name_fields():
    for name in ("fedbpt", "fedavg-bbt", "manual-prompt", "icl"):
        assert name in PRESETS.names()
    with pytest.raises(ConfigError, match="method.trainer.popsize"):
        _cfg(**{"method.trainer.popsize": 1})
    with pytest.raises(ConfigError, match="method.trainer.covariance"):
        _cfg(**{"method.trainer.covariance": "banded"})
    with pytest.raises(ConfigError, match="method.trainer.noise"):
        _cfg(**{"method.trainer.noise": "common"})
    with pytest.raises(ConfigError, match=r"method.trainer.*mirrors \(3\) must be at most popsize // 2 \(2\)"):
        _cfg(**{"method.trainer.mirrors": 3})


def test_the_suffix_placement_on_an_encoder_is_refused_in_plain_words():
    from fedpeft.adapters.base import AdapterContext

    clf = _classifier("tiny-bert", placement="suffix")
    with pytest.raises(ValueError, match=r"'suffix' needs a causal LM .* \(got an encoder model, readout auto\)"):
        clf.adapter.bind(AdapterContext(0, None, "auto", clf.backbone))


def test_projection_is_shared_by_seed_with_spec_std():
    bb = load_backbone("tiny-bert")
    s = ProjectedPromptSettings(num_tokens=M, intrinsic_dim=200, sigma0=2.0, seed=11)
    a1, a2 = ProjectedPrompt(s).projection(bb), ProjectedPrompt(s).projection(bb)
    assert torch.equal(a1, a2)  # every client rebuilds the same A from the seed
    other = ProjectedPrompt(s.model_copy(update={"seed": 12})).projection(bb)
    assert not torch.equal(a1, other)
    assert a1.shape == (M * bb.hidden_size, 200)
    want = projection_std(float(bb.input_embeddings().weight.std()), 200, 2.0)
    assert want == pytest.approx(float(bb.input_embeddings().weight.std()) / (math.sqrt(200) * 2.0))
    assert float(a1.std()) == pytest.approx(want, rel=0.03)


@pytest.mark.parametrize("model, pooling", [("tiny-bert", "all"), ("tiny-bert", "text"), ("tiny-bert-mlm", "all"),
                                            ("tiny-llama", "all")])
def test_batched_population_equals_separate_forwards(model, pooling):
    clf = _classifier(model, pooling=pooling)
    data = clf.encode(clf.task_examples[:7])  # type: ignore[attr-defined]
    z = torch.randn(5, D, generator=torch.Generator().manual_seed(0))
    one = BlackBox(clf, batched=True)
    sep = BlackBox(clf, batched=False)
    lb, ls = one.sample_losses(z, data), sep.sample_losses(z, data)
    torch.testing.assert_close(lb, ls, atol=1e-5, rtol=1e-5)
    for c in range(5):  # also equals a lone forward of that candidate
        torch.testing.assert_close(lb[c], BlackBox(clf).sample_losses(z[c], data)[0], atol=1e-5, rtol=1e-5)
    assert one.usage.queries == 1 and sep.usage.queries == 5
    assert one.usage.candidates == sep.usage.candidates == 5
    assert one.usage.tokens == sep.usage.tokens > 5 * 7 * M
    assert not torch.allclose(lb[0], lb[1])  # the candidates really differ


def test_prompt_is_placeholder_embedding_plus_Az_after_first_token():
    clf = _classifier("tiny-bert")
    bb, ad = clf.backbone, clf.adapter
    data = clf.encode(clf.task_examples[:2])  # type: ignore[attr-defined]
    b = clf.batch(data, [0, 1])
    z = torch.randn(D)
    prep = ad.prepare(bb, {"z": z}, b["input_ids"], b["attention_mask"], data.lead)
    a = ad.projection(bb)
    p0 = ad.prompt(bb, torch.zeros(D))[0]
    expected = p0 + (a @ z).view(M, -1)
    torch.testing.assert_close(prep.embeds[0, data.lead:data.lead + M], expected)
    assert prep.inserted == M and prep.embeds.shape[1] == b["input_ids"].shape[1] + M


def _suffix_rows(clf: Classifier, n: int = 6):
    """n rows of n different lengths (right padding in the batch)."""
    words = "a truly lovely film with a plot that drags on and on".split()
    data = clf.encode([Example(" ".join(words[:i + 1]), i % 2) for i in range(n)])
    assert len({len(r) for r in data.input_ids}) == n
    return data


def test_suffix_placement_puts_the_prompt_between_the_text_and_its_final_token():
    clf = _classifier("tiny-llama", placement="suffix", kv_cache=False)
    data = _suffix_rows(clf, 3)
    b = clf.batch(data, [0, 1, 2])
    z = torch.randn(2, D)
    prep = clf.adapter.prepare(clf.backbone, {"z": z}, b["input_ids"], b["attention_mask"], data.lead)
    emb, prompt = clf.backbone.input_embeddings()(b["input_ids"]), clf.adapter.prompt(clf.backbone, z)
    for c in range(2):  # candidate-major
        for i, row in enumerate(data.input_ids):
            r, last = c * 3 + i, len(row) - 1
            assert torch.equal(prep.embeds[r, :last], emb[i, :last])
            torch.testing.assert_close(prep.embeds[r, last:last + M], prompt[c])
            assert torch.equal(prep.embeds[r, last + M], emb[i, last])
            assert prep.attention_mask[r].tolist() == [1] * (len(row) + M) + [0] * (prep.embeds.shape[1] - len(row) - M)
    assert prep.insert_at.tolist() == [len(r) - 1 for r in data.input_ids] * 2 and prep.inserted == M


def test_suffix_kv_cache_equals_the_uncached_suffix_forward():
    """The text once to a key/value cache, tiled for lambda = 3 candidates, then only p_1..p_m + the final token
    per candidate: the same label logits as whole suffix-placed sequences (and as each row alone, unpadded)."""
    cached = _classifier("tiny-llama", placement="suffix")
    whole = _classifier("tiny-llama", placement="suffix", kv_cache=False)
    data = _suffix_rows(cached)
    z = torch.randn(3, D, generator=torch.Generator().manual_seed(0)) * 3
    lc, lw = BlackBox(cached).logits(z, data), BlackBox(whole).logits(z, data)
    torch.testing.assert_close(lc, lw, atol=1e-5, rtol=1e-5)
    for i in range(len(data)):
        torch.testing.assert_close(lc[:, i], BlackBox(whole, batched=False).logits(z, data.subset([i]))[:, 0],
                                   atol=1e-5, rtol=1e-5)
    assert not torch.allclose(lc[0], lc[1])  # the candidates differ
    prefix = BlackBox(_classifier("tiny-llama")).logits(z, data)
    assert not torch.allclose(lc, prefix, atol=1e-4)  # another placement, other numbers


def test_suffix_text_cache_is_computed_once_and_kept_for_the_same_rows():
    def text_runs(clf, calls):
        body = clf.backbone.body_and_head[1]
        seen = []
        hook = body.register_forward_pre_hook(lambda mod, args, kw: seen.append("input_ids" in kw), with_kwargs=True)
        try:
            for data in calls:
                BlackBox(clf).logits(torch.randn(5, D), data)
        finally:
            hook.remove()
        return sum(seen), len(seen)

    clf = _classifier("tiny-llama", placement="suffix", kv_cache_keep=2)
    clf.backbone.cache.pop("text_kv", None)
    data = _suffix_rows(clf)
    other = data.subset([1, 0, 2])
    assert text_runs(clf, [data, data, data]) == (1, 4)  # text once; 5 candidates in one suffix forward per call
    assert text_runs(clf, [other, data]) == (1, 3)       # new rows: a new text cache; the first one still kept
    clf.adapter.cfg.kv_cache_keep = 0
    assert text_runs(clf, [data, data]) == (2, 4)        # nothing kept or looked up: the text runs in every call


def test_suffix_placement_needs_a_causal_verbalizer(tmp_path):
    with pytest.raises(ValueError, match="method.adapter.placement"):
        build_experiment(_cfg(**{"method.adapter.placement": "suffix"}))  # tiny-bert, similarity readout
    runs = {kv: run_embedded(_cfg(**{"model.name": "tiny-llama", "method.adapter.placement": "suffix",
                                     "method.adapter.kv_cache": kv, "federation.rounds": 1}), tmp_path / str(kv))
            for kv in (True, False)}
    assert runs[True]["final_accuracy"] == pytest.approx(runs[False]["final_accuracy"])
    assert runs[True]["upload_tensor_bytes"] == runs[False]["upload_tensor_bytes"]


def test_perturbation_replaces_only_text_tokens_at_rate():
    clf = _classifier("tiny-bert-mlm")
    bb, task = clf.backbone, clf.task
    data = clf.encode(clf.task_examples)  # type: ignore[attr-defined]
    span = text_span(bb, task, clf.readout, 24)
    vocab = replacement_vocab(bb)
    special = set(bb.tokenizer.all_special_ids)
    assert not special & set(vocab.tolist())
    pert, replaced, eligible = perturb(data, 0.4, vocab, np.random.default_rng(0), span)
    assert abs(replaced / eligible - 0.4) < 0.03
    for old, new, mi in zip(data.input_ids, pert.input_ids, data.mask_index):
        assert len(old) == len(new)
        assert old[: span.prefix] == new[: span.prefix]  # [CLS] and any literal before the text
        assert old[len(old) - span.suffix:] == new[len(new) - span.suffix:]  # "It was [MASK]." [SEP]
        assert new[mi] == bb.tokenizer.mask_token_id
    assert span.suffix >= 3
    same, r0, _ = perturb(data, 0.0, vocab, np.random.default_rng(0), span)
    assert same.input_ids == data.input_ids and r0 == 0
    _, _, n_all = perturb(data, 0.5, vocab, np.random.default_rng(0), None)
    assert n_all == sum(len(r) for r in data.input_ids)


def test_ratio_forms_on_small_tensors():
    clean = torch.tensor([[1.0, 3.0], [2.0, 2.0]])
    pert = torch.tensor([[2.0, 2.0], [1.0, 4.0]])
    torch.testing.assert_close(ratio_fitness(clean, pert, "dataset"), torch.tensor([2.0 / 2.0, 2.0 / 2.5]))
    torch.testing.assert_close(ratio_fitness(clean, pert, "sample"), torch.tensor([(0.5 + 1.5) / 2, (2 + 0.5) / 2]))
    assert torch.isfinite(ratio_fitness(clean, torch.zeros(2, 2))).all()


def test_ratio_objective_prefers_input_sensitive_prompt_under_label_skew():
    """Spec §8.2 check 6 (the mechanism of Eq. 7 and Fig. 3) on a planted two-class signal.

    A client holds 90% of class 1. A "bias-only" prompt shifts every logit toward class 1; an
    "input-sensitive" prompt amplifies the input feature. The clean loss prefers the collapsing bias
    prompt; the ratio to the loss on perturbed inputs (features replaced by noise) prefers the other.
    """
    g = torch.Generator().manual_seed(0)
    n = 400
    y = (torch.rand(n, generator=g) < 0.9).long()
    clean_x = (2 * y - 1) * 0.5 + torch.randn(n, generator=g)
    perturbed_x = torch.randn(n, generator=g)

    def losses(x, gain, bias):
        logits = torch.stack([torch.zeros(n), gain * x + bias], dim=1)
        return torch.nn.functional.cross_entropy(logits, y, reduction="none")[None]

    prompts = {"bias": (0.0, 2.2), "sensitive": (1.5, 0.0)}
    clean = {k: losses(clean_x, *v) for k, v in prompts.items()}
    ratio = {k: ratio_fitness(clean[k], losses(perturbed_x, *v))[0] for k, v in prompts.items()}
    assert clean["bias"].mean() < clean["sensitive"].mean()
    assert ratio["bias"] == pytest.approx(1.0) and ratio["sensitive"] < 0.7


def test_rp_zero_gives_clean_loss_fitness():
    clf = _classifier("tiny-bert")
    data = clf.encode(clf.task_examples[:6])  # type: ignore[attr-defined]
    start = CMAState(np.zeros(D), 1.0, np.eye(D))
    cfg = CMAESSettings(iterations=2, popsize=4, perturb_rate=0.0)
    res = local_cmaes(BlackBox(clf), data, start, cfg, np.random.default_rng(5))
    assert math.isnan(res.ratio_loss) and res.replaced_share == 0.0
    assert res.clean_loss == pytest.approx(float(BlackBox(clf).losses(torch.from_numpy(res.state.mean).float(),
                                                                         data)[0]), abs=1e-6)
    assert res.sigmas.shape == (2,) and res.sigmas[0] == 1.0
    assert res.usage["queries"] == 2 + 1  # one batched forward per iteration plus the final clean loss


def test_uplink_is_d_plus_I_plus_1_floats_and_downlink_counts_covariance(tmp_path):
    cfg = _cfg()
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    state = method.server_init()
    inst = method.configure_round(state, 1, [0])[0]
    reply = method.client_update(decode(encode(inst, method.wire)), exp.client(0))
    assert payload_bytes(reply, method.wire) == (D + I + 1) * 4
    assert len(encode(reply, method.wire)) == (D + I + 1) * 4 + framing_overhead(reply, method.wire)
    assert set(reply.tensors) == {"z", "sigmas", "loss"}  # the projection A is never sent
    assert payload_bytes(inst, method.wire) == (D + D * D) * 4
    summary = run_embedded(cfg, tmp_path / "full")
    assert summary["upload_tensor_bytes"] == (D + I + 1) * 4
    assert 0 < summary["upload_framing_bytes"] <= 512
    down = {}
    for mode in ("full", "diagonal", "none"):
        s = run_embedded(_cfg(**{"method.trainer.covariance": mode, "federation.rounds": 1}), tmp_path / f"cov-{mode}")
        down[mode] = s["bytes_down_per_client_round"]
    assert down["full"] - down["none"] >= D * D * 4
    assert D * 4 <= down["diagonal"] - down["none"] < D * 4 + 128


def test_fedavg_bbt_averages_local_statistics():
    cfg = _cfg("fedavg-bbt")
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    state = method.server_init()
    insts = method.configure_round(state, 1, [0, 1, 2])
    replies = {c: decode(encode(method.client_update(m, exp.client(c)), method.wire)) for c, m in insts.items()}
    assert payload_bytes(replies[0], method.wire) == (D + 1 + 1 + D * D) * 4
    new = method.aggregate(state, 1, replies)
    n = np.array([replies[c].scalars["num_examples"] for c in range(3)], dtype=float)
    w = n / n.sum()
    z = sum(w[c] * replies[c].tensors["z"].double().numpy() for c in range(3))
    np.testing.assert_allclose(new.tensors["z"].numpy(), z, atol=1e-6)
    sig = sum(w[c] * float(replies[c].tensors["sigma"][0]) for c in range(3))
    assert float(new.tensors["sigma"][0]) == pytest.approx(sig, rel=1e-6)
    assert method.configure_round(new, 2, [0])[0].scalars["sigma"] == pytest.approx(sig, rel=1e-6)
    cov = sum(w[c] * replies[c].tensors["cov"].double().numpy() for c in range(3))
    np.testing.assert_allclose(new.tensors["cov"].numpy(), cov, atol=1e-6)


def test_backbone_never_gets_a_gradient(tmp_path):
    cfg = _cfg()
    exp = build_experiment(cfg)
    before = exp.backbone.checksum()
    modes = []
    hook = exp.backbone.model.register_forward_hook(
        lambda mod, args, out: modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled())))
    try:
        summary = run_embedded(cfg, tmp_path / "run", experiment=exp)
    finally:
        hook.remove()
    assert modes and all(inf and not grad for inf, grad in modes)
    assert exp.backbone.checksum() == before and summary["backbone_unchanged"] is True
    assert all(not p.requires_grad and p.grad is None for p in exp.backbone.model.parameters())


def _strip(records):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


@pytest.mark.parametrize("method", ["fedbpt", "fedavg-bbt"])
def test_resume_gives_identical_metrics(method, tmp_path):
    cfg = _cfg(method, **{"federation.rounds": 3})
    exp = build_experiment(cfg)
    full = run_embedded(cfg, tmp_path / "full", experiment=exp)
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=1, experiment=exp)
    resumed = run_embedded(cfg, tmp_path / "cut", resume=True, experiment=exp)
    assert _strip(RunDir(tmp_path / "full").read_metrics()) == _strip(RunDir(tmp_path / "cut").read_metrics())
    assert {k: v for k, v in full.items() if k != "wall_seconds"} == \
        {k: v for k, v in resumed.items() if k != "wall_seconds"}


def test_gradient_free_baselines_run(tmp_path):
    manual = run_embedded(_cfg("manual-prompt", **{"federation.rounds": 1}), tmp_path / "manual")
    icl = run_embedded(_cfg("icl", **{"federation.rounds": 1}), tmp_path / "icl")
    assert manual["trainable_params"] == 0 and manual["upload_tensor_bytes"] == 0
    assert icl["trainable_params"] == 0
    assert 0 <= manual["final_accuracy"] <= 1 and 0 <= icl["final_accuracy"] <= 1


def test_query_accounting_and_replacement_rate_in_a_run(tmp_path):
    run_embedded(_cfg(**{"federation.rounds": 1, "method.trainer.iterations": 4}), tmp_path / "run")
    clients = RunDir(tmp_path / "run").read_metrics()[0]["clients"]
    for c in clients:  # (clean + perturbed) x I, then the final mean clean + perturbed: one batched forward each
        assert c["queries"] == 2 * 4 + 2
        assert c["candidates"] == 2 * 4 * 5 + 2 and c["examples"] == c["candidates"] * c["num_examples"]
        assert abs(c["replaced_share"] - 0.5) < 0.1


def test_server_step_size_is_logged_and_stays_calibrated(tmp_path):
    """Spec §8.2 check 10: with sigma' (Eq. 16) and the ratio transfer, sigma stays within [0.2, 3] sigma_0."""
    run_embedded(_cfg(**{"federation.rounds": 4}), tmp_path / "run")
    server = [r["server"] for r in RunDir(tmp_path / "run").read_metrics()]
    assert len(server) == 4 and all(s["sigma_prime"] > 0 and s["sigma_server"] > 0 for s in server)
    assert all(0.2 <= s["sigma"] <= 3.0 for s in server)


def test_local_cmaes_lowers_the_clean_loss():
    clf = _classifier("tiny-bert")
    data = clf.encode(clf.task_examples[:16])  # type: ignore[attr-defined]
    cfg = CMAESSettings(iterations=12, popsize=6, perturb_rate=0.0)
    res = local_cmaes(BlackBox(clf), data, CMAState(np.zeros(D), 1.0, np.eye(D)), cfg, np.random.default_rng(0),
                      evaluate_start=True)
    assert res.clean_loss < res.first_loss


def _record_sampling(monkeypatch) -> list[tuple[np.ndarray, dict]]:
    """Every local ``sample`` call's C and the state of the noise stream it draws from."""
    calls = []
    real = cmaes_module.sample

    def recording(state, lam, rng, injected=None):
        calls.append((state.cov.copy(), copy.deepcopy(rng.bit_generator.state)))
        return real(state, lam, rng, injected)

    monkeypatch.setattr(cmaes_module, "sample", recording)
    return calls


def test_uploaded_fitness_is_the_clean_loss_or_the_authors_ratio():
    """server_fitness: clean F^k (paper, C9) or clean / perturbed mean CE at the final mean (fedbpt_train.py)."""
    replies = {}
    for mode in ("clean", "ratio"):
        cfg = _cfg(**{"method.trainer.server_fitness": mode})
        exp = build_experiment(cfg)
        method = build_method(cfg, exp)
        inst = method.configure_round(method.server_init(), 1, [0])[0]
        replies[mode] = method.client_update(inst, exp.client(0))
    clean, ratio = replies["clean"], replies["ratio"]
    torch.testing.assert_close(clean.tensors["z"], ratio.tensors["z"])  # the switch changes only what is reported
    assert float(clean.tensors["loss"][0]) == pytest.approx(clean.scalars["train_loss"], rel=1e-6)
    assert float(ratio.tensors["loss"][0]) == pytest.approx(ratio.scalars["ratio_loss"], rel=1e-6)
    assert ratio.scalars["ratio_loss"] != pytest.approx(ratio.scalars["train_loss"], rel=1e-3)
    # without perturbation there is no ratio: the authors' client then uploads the clean loss too (--perturb 0)
    cfg = _cfg(**{"method.trainer.server_fitness": "ratio", "method.trainer.perturb_rate": 0.0})
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    reply = method.client_update(method.configure_round(method.server_init(), 1, [0])[0], exp.client(0))
    assert float(reply.tensors["loss"][0]) == pytest.approx(reply.scalars["train_loss"], rel=1e-6)


def test_noise_streams_shared_or_independent():
    first = {}
    for noise in ("independent", "shared", "shared_round"):
        for rnd in (1, 2):
            for client in (0, 1):
                pert, sampling = cmaes_streams(7, rnd, client, noise)
                first[noise, rnd, client] = (pert.standard_normal(), sampling.standard_normal())
    assert len({first["independent", r, c][1] for r in (1, 2) for c in (0, 1)}) == 4  # per client and round
    assert len({first["shared", r, c][1] for r in (1, 2) for c in (0, 1)}) == 1  # authors: every client, every round
    assert first["shared_round", 1, 0][1] == first["shared_round", 1, 1][1] != first["shared_round", 2, 0][1]
    for noise in ("independent", "shared", "shared_round"):  # perturbations: per client, their own stream
        assert first[noise, 1, 0][0] == first["independent", 1, 0][0] != first[noise, 1, 1][0]
        assert first[noise, 1, 0][0] != first[noise, 1, 0][1]


def test_perturbation_does_not_shift_the_sampling_noise(monkeypatch):
    """FedBPT (r_p > 0) and its r_p = 0 variant draw the same sampling noise for the same client and round
    (common random numbers for their paired comparison): same z in round 1, same candidates."""
    draws = {}
    for rate in (0.5, 0.0):
        cfg = _cfg(**{"method.trainer.perturb_rate": rate})
        exp = build_experiment(cfg)
        method = build_method(cfg, exp)
        calls = _record_sampling(monkeypatch)
        method.client_update(method.configure_round(method.server_init(), 1, [1])[1], exp.client(1))
        draws[rate] = calls[0][1]
    assert draws[0.5] == draws[0.0]


@pytest.mark.parametrize("noise", ["independent", "shared"])
def test_shared_noise_gives_every_client_the_same_sampling_draws(noise, monkeypatch):
    cfg = _cfg(**{"method.trainer.noise": noise})
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    calls = _record_sampling(monkeypatch)
    state = method.server_init()
    starts = []
    for rnd in (1, 2):
        for c, inst in method.configure_round(state, rnd, [0, 1]).items():
            calls.clear()
            method.client_update(inst, exp.client(c))
            starts.append(calls[0][1])  # the noise stream's state at the first draw of the round
    same = [starts[0] == s for s in starts[1:]]
    assert same == ([True, True, True] if noise == "shared" else [False, False, False])


def test_diagonal_covariance_is_one_model_on_server_and_clients(monkeypatch):
    """covariance=diagonal: the server's C stays diagonal, clients start from exactly its diagonal and their own C
    stays diagonal through the local iterations (every sample draws from a diagonal C)."""
    cfg = _cfg(**{"method.trainer.covariance": "diagonal"})
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    calls = _record_sampling(monkeypatch)
    state = method.server_init()
    for rnd in (1, 2):
        insts = method.configure_round(state, rnd, [0, 1, 2])
        replies = {c: decode(encode(method.client_update(decode(encode(m, method.wire)), exp.client(c)), method.wire))
                   for c, m in insts.items()}
        state = method.aggregate(state, rnd, replies)
        cov = state.tensors["agg/cov"].numpy()
        np.testing.assert_array_equal(cov, np.diag(np.diagonal(cov)))
        assert not np.allclose(np.diagonal(cov), 1.0)
    inst = decode(encode(method.configure_round(state, 3, [0])[0], method.wire))
    assert set(inst.tensors) == {"mean", "cov_diag"}
    np.testing.assert_allclose(inst.tensors["cov_diag"].double().numpy(), np.diagonal(cov), rtol=1e-6)
    calls.clear()
    method.client_update(inst, exp.client(0))
    assert len(calls) == I
    np.testing.assert_array_equal(calls[0][0], np.diag(inst.tensors["cov_diag"].double().numpy()))
    for c, _ in calls:
        np.testing.assert_array_equal(c, np.diag(np.diagonal(c)))


def test_local_cmaes_with_pycma_options_mirrors_the_worst_candidate(monkeypatch):
    """mirrors=1 (pycma's delayed selective mirroring): from the second iteration on, the first candidate is the
    previous worst reflected through the previous mean (kept or rescaled along the same line)."""
    clf = _classifier("tiny-bert")
    data = clf.encode(clf.task_examples[:8])  # type: ignore[attr-defined]
    seen = []
    real = cmaes_module.sample

    def recording(state, lam, rng, injected=None):
        x = real(state, lam, rng, injected)
        seen.append((state.mean.copy(), None if injected is None else injected.copy(), x))
        return x

    monkeypatch.setattr(cmaes_module, "sample", recording)
    cfg = CMAESSettings(iterations=4, popsize=5, perturb_rate=0.0, weights="log", mirrors=1)
    res = local_cmaes(BlackBox(clf), data, CMAState(np.zeros(D), 1.0, np.eye(D)), cfg, np.random.default_rng(0))
    assert seen[0][1] is None and all(inj is not None and len(inj) <= 1 for _, inj, _ in seen[1:])
    for (m_old, _, x_old), (m_new, inj, x) in zip(seen, seen[1:]):
        if len(inj):
            assert any(np.allclose(inj[0], m_old - row) for row in x_old)
            step = x[0] - m_new
            assert step @ inj[0] == pytest.approx(np.linalg.norm(step) * np.linalg.norm(inj[0]), rel=1e-9)
    assert res.usage["queries"] == 4 + 1  # mirrors replace candidates: the budget is unchanged


@pytest.mark.slow
def test_fedbpt_minilm_sst2_round(tmp_path):
    cfg = load_config(None, [
        "task.name=sst2", "task.few_shot=4", "task.max_test=40", "task.max_length=48", "model.name=minilm",
        "method.name=fedbpt", "method.adapter.num_tokens=5", "method.adapter.intrinsic_dim=50",
        "method.trainer.iterations=2", "federation.num_clients=2", "federation.rounds=1",
        "federation.partition.scheme=dirichlet", "federation.partition.alpha=1.0",
        "federation.partition.min_size=2", "runtime.progress=false", "evaluation.local=false"])
    exp = build_experiment(cfg)
    before = exp.backbone.checksum()
    s = run_embedded(cfg, tmp_path / "run", experiment=exp)
    assert exp.backbone.checksum() == before
    assert s["upload_tensor_bytes"] == (50 + 2 + 1) * 4 and 0.0 <= s["final_accuracy"] <= 1.0
