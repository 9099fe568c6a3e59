"""Head pruning for federated LoRA: importance (Eq. 6), global threshold (Eq. 7), frozen and withheld slices,
sparse upload bytes, head-weighted aggregation (Eq. 8), loss-difference selection (Eq. 9), the paper's
communication and OPs arithmetic, and LoRA through HF peft on the shared backbone."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import last_hidden_ours_and_peft, tiny_overrides

from fedpeft.aggregators.head_weighted import head_weighted
from fedpeft.build import build_method
from fedpeft.comm.codec import decode, encode
from fedpeft.comm.update import Update
from fedpeft.costs import Dims, clean_ops, lora_upload_values, paper_ops
from fedpeft.experiment import build_experiment
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded
from fedpeft.selection.loss_difference import loss_difference
from fedpeft.sharing.head_importance import confidence, head_confidence, key_token_ids
from fedpeft.sharing.head_pruning import n_keep
from fedpeft.tracking.rundir import RunDir

pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(preset="headprune", model="tiny-bert", **extra):
    over = {"method.name": preset, "model.name": model, "method.adapter.num_tokens": None, "method.adapter.r": 4,
            "method.trainer.max_steps": 3, "method.trainer.batch_size": 8, "task.num_examples": 96} | extra
    return load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in over.items()}))


# ---------------------------------------------------------------- Eq. 6: confidence


def test_confidence_on_a_hand_made_attention_tensor():
    # one sample, two heads, 3 queries x 3 keys; key 2 is [SEP] (excluded), query 2 is padding (excluded)
    attn = torch.tensor([[[[0.7, 0.1, 0.2], [0.2, 0.3, 0.5], [0.3, 0.3, 0.4]],
                          [[0.1, 0.1, 0.8], [0.4, 0.4, 0.2], [1.0, 0.0, 0.0]]]])
    query = torch.tensor([[True, True, False]])
    keys = torch.tensor([[True, True, False]])
    conf = confidence(attn, query, keys)
    assert torch.allclose(conf, torch.tensor([[(0.7 + 0.3) / 2, (0.1 + 0.4) / 2]]))
    # through the token ids: [CLS] a [SEP] with sep id 102
    ids = torch.tensor([[101, 7, 102]])
    summed = head_confidence([attn], query, key_token_ids(ids, 3), torch.ones(1, 3, dtype=torch.bool), 102)
    assert torch.allclose(summed, conf[0])
    # prefix keys of deep prompts come first and are not tokens
    assert key_token_ids(ids, 5).tolist() == [[-1, -1, 101, 7, 102]]


# ---------------------------------------------------------------- Eq. 7 and the frozen, withheld slices


def test_kept_heads_are_the_global_top_share():
    assert n_keep(0.9, 144) == 15 and n_keep(0.5, 8) == 4 and n_keep(0.99, 8) == 1 and n_keep(0.0, 12) == 12


def test_pruned_rows_are_frozen_and_absent_from_the_upload():
    cfg = _cfg(**{"method.sharing.sparsity": 0.5})
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    inst = method.configure_round(method.server_init(), 1, [0])[0]
    # a non-zero global B, so that "unchanged" is a real claim
    inst.tensors = {k: (v + 0.01 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)))
                    for k, v in inst.tensors.items()}
    ctx = exp.client(0)
    start = method.format.start(inst)
    plan = method.sharing.plan(start, inst, ctx, 1)
    kept = plan.own["kept"]
    assert len(kept) == 4  # of 2 layers x 4 heads
    alpha = method.sharing.importance(start, ctx)
    assert set(kept) == set(sorted(range(8), key=lambda h: (-float(alpha[h]), h))[:4])  # one global threshold
    reply = decode(encode(method.client_update(inst, ctx), method.wire))
    assert reply.tensors["heads"].tolist() == kept
    full = method.sharing.expand(Update(0, {k: v for k, v in reply.tensors.items() if "lora_" in k}, 1,
                                        {k: reply.tensors[k] for k in ("heads", "head_alpha")}), start)
    changed_rows = 0
    for name, spec in method.sharing.slices.items():
        for heads, dim, a, b in spec:
            same = torch.equal(full.tensors[name][a:b], start[name][a:b])
            if set(heads) & set(kept):
                changed_rows += not same
            else:
                assert same  # a pruned head's B rows: never trained (and, expanded, exactly the global)
        layer_kept = [h for h in kept if any(h in hs for hs, *_ in spec)]
        assert reply.tensors[name].shape[0] == 8 * len(layer_kept)  # only the kept heads' rows travel
    assert changed_rows > 0
    # A travels in full
    assert all(reply.tensors[k].shape == start[k].shape for k in reply.tensors if "lora_A" in k)


def test_upload_bytes_are_kept_rows_plus_A_plus_framing(tmp_path):
    sent = {}
    cfg = _cfg(**{"federation.rounds": 1})
    run_embedded(cfg, tmp_path / "run", reply_hook=lambda r, c, d: sent.setdefault(c, d))
    msg = decode(sent[0])
    r, d, head_dim = 4, 32, 8
    a_bytes = 6 * r * d * 4                  # 2 layers x q, k, v: A [4, 32] in float32
    kept = len(msg.tensors["heads"])
    assert kept == math.ceil(0.1 * 8)
    b_bytes = kept * 3 * head_dim * r * 4    # a kept head's rows in its layer's q, k and v B
    tensor_bytes = a_bytes + b_bytes + kept * 4 + kept * 4  # + head ids (int32) + importances (float32)
    assert sum(t.numel() * t.element_size() for t in msg.tensors.values()) == tensor_bytes
    assert tensor_bytes < len(sent[0]) <= tensor_bytes + 4096  # framing: safetensors header + scalars


def test_malformed_sparse_reply_is_rejected(tmp_path):
    def hook(rnd, cid, data):
        msg = decode(data)
        if cid == 0:  # a row too many for the kept heads it claims
            k = next(k for k in msg.tensors if "lora_B" in k)
            msg.tensors[k] = torch.cat([msg.tensors[k], msg.tensors[k][:1]])
        if cid == 1:  # a duplicated head id
            msg.tensors["heads"] = torch.zeros_like(msg.tensors["heads"])
        return encode(msg)

    cfg = _cfg(**{"federation.rounds": 1, "method.sharing.sparsity": 0.5})
    run_embedded(cfg, tmp_path / "run", reply_hook=hook)
    rec = RunDir(tmp_path / "run").read_metrics()[0]
    assert {c["client"]: c["status"] for c in rec["clients"]} == {0: "rejected", 1: "rejected", 2: "ok"}


# ---------------------------------------------------------------- Eq. 8 and Eq. 9


def test_head_weighted_aggregation_eq8():
    glob = {"B": torch.zeros(4, 1), "A": torch.zeros(2)}
    slices = {"B": [((0,), 0, 0, 2), ((1,), 0, 2, 4)]}
    u1 = Update(0, {"B": torch.tensor([[1.0], [1.0], [0.0], [0.0]]), "A": torch.tensor([2.0, 0.0])}, 1,
                {"head_alpha": torch.tensor([0.5, 0.0])})
    u2 = Update(1, {"B": torch.tensor([[3.0], [3.0], [0.0], [0.0]]), "A": torch.tensor([0.0, 4.0])}, 3,
                {"head_alpha": torch.tensor([1.5, 0.0])})
    out = head_weighted(glob, [u1, u2], slices)
    # head 0: (0.5·1 + 1.5·3) / (2 + eps); head 1 kept by nobody: unchanged (eps keeps 0/0 finite)
    assert torch.allclose(out["B"], torch.tensor([[2.5], [2.5], [0.0], [0.0]]), atol=1e-6)
    assert torch.allclose(out["A"], torch.tensor([0.5, 3.0]))  # Eq. 5: n-weighted
    # a head kept by one client takes that client's rows
    u2.aux_tensors["head_alpha"] = torch.tensor([0.0, 0.0])
    assert torch.allclose(head_weighted(glob, [u1, u2], slices)["B"][:2], torch.ones(2, 1), atol=1e-6)


def test_loss_difference_selection_eq9():
    rng = np.random.default_rng(0)
    history = {0: {"loss": 0.2}, 1: {"loss": 0.9}, 2: {"loss": 0.5}}
    # never-seen clients (3, 4) come first, then the highest last loss
    assert loss_difference([0, 1, 2, 3, 4], 2, history, rng) == [3, 4]
    assert loss_difference([0, 1, 2, 3, 4], 3, history, rng) == [1, 3, 4]
    assert loss_difference([0, 1, 2], 2, history, rng) == [1, 2]


def test_loss_selection_visits_every_client_before_repeating(tmp_path):
    cfg = _cfg(**{"federation.num_clients": 4, "federation.clients_per_round": 2, "federation.rounds": 3,
                  "task.num_examples": 120})
    run_embedded(cfg, tmp_path / "run")
    recs = RunDir(tmp_path / "run").read_metrics()
    first_two = [c["client"] for r in recs[:2] for c in r["clients"]]
    assert sorted(first_two) == [0, 1, 2, 3]
    losses = {c["client"]: c["train_loss"] for r in recs[:2] for c in r["clients"]}
    assert sorted(c["client"] for c in recs[2]["clients"]) == sorted(sorted(losses, key=losses.get)[-2:])


# ---------------------------------------------------------------- the paper's arithmetic, from shapes


def test_paper_communication_t5_small_r16():
    modules = [(512, 512)] * (3 * 18)  # q, k, v of 18 attention blocks
    mib = 4 / 2 ** 20
    assert lora_upload_values(modules, 16, 0.0) * mib == pytest.approx(3.375)          # "3.38 MB"
    assert lora_upload_values(modules, 16, 0.9) * mib == pytest.approx(1.856, abs=1e-3)  # "1.86 MB"
    # the codec's integer head count: 15 of 144 heads kept -> every A plus 15 heads' 3 x [64, 16] rows
    kept = n_keep(0.9, 144)
    assert round((3 * 18 * 16 * 512 + kept * 3 * 64 * 16) * mib, 2) == 1.86


def test_paper_ops_t5_small_r16():
    assert paper_ops(18, 512, 512, 16, 0.0) / 1e9 == pytest.approx(33.07, abs=0.005)
    assert paper_ops(18, 512, 512, 16, 0.9) / 1e9 == pytest.approx(8.47, abs=0.005)
    assert paper_ops(18, 512, 512, 8, 0.0) / 1e9 == pytest.approx(32.38, abs=0.01)


def test_clean_ops_scale_with_kept_heads():
    dims = Dims(layers=6, d=384, heads=12, kv_heads=12, d_ff=1536, ffn_mats=2)
    dense, pruned = clean_ops(dims, 128, 16, 1.0), clean_ops(dims, 128, 16, 0.1)
    assert pruned["total"] < dense["total"] and pruned["backward"] > pruned["forward"]
    no_ffn = clean_ops(Dims(6, 384, 12, 12, 0, 2), 128, 0, 1.0)
    # without FFN and LoRA: 4 T d^2 projections + 2 T^2 d attention per layer, forward
    assert no_ffn["forward"] == 6 * (4 * 128 * 384 ** 2 + 2 * 128 ** 2 * 384)


# ---------------------------------------------------------------- LoRA through peft on the shared backbone


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-llama"])
def test_lora_is_injected_once_and_leaves_the_frozen_function(model):
    cfg = _cfg("fedavg-lora", model)
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    params = method.initial_params()
    clf, batch = exp.objective, exp.objective.batch(exp.test_encoded, [0, 1, 2])
    zero_b = clf.logits(params, batch)
    with torch.no_grad():  # B = 0 is the frozen model itself
        plain = clf.logits({k: torch.zeros_like(v) for k, v in params.items()}, batch)
    assert torch.allclose(zero_b, plain)
    moved = {k: (v + 0.5 if "lora_B" in k else v) for k, v in params.items()}
    assert not torch.allclose(clf.logits(moved, batch), plain)
    n_lora = sum("lora_" in n for n, _ in exp.backbone.model.named_parameters())
    build_method(cfg, exp)  # a second build does not inject again
    assert sum("lora_" in n for n, _ in exp.backbone.model.named_parameters()) == n_lora
    assert all(not p.requires_grad for p in exp.backbone.model.parameters())


def test_gqa_key_value_rows_belong_to_their_query_head_group():
    cfg = _cfg("fedavg-lora", "tiny-llama")
    exp = build_experiment(cfg)
    slices = exp.objective.adapter.head_slices(exp.backbone)
    k_proj = next(v for k, v in slices.items() if "k_proj" in k and ".0." in k)
    q_proj = next(v for k, v in slices.items() if "q_proj" in k and ".0." in k)
    assert [h for h, *_ in q_proj] == [(0,), (1,), (2,), (3,)]  # 4 query heads of 8 rows
    assert [(h, a, b) for h, _, a, b in k_proj] == [((0, 1), 0, 8), ((2, 3), 8, 16)]  # 2 KV heads, 2 queries each


# ---------------------------------------------------------------- PEFT interop


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-llama"])
def test_export_loads_in_peft_with_the_same_outputs(model, tmp_path):
    from fedpeft.export import export_peft
    from fedpeft.methods.state import ServerState

    cfg = _cfg("headprune", model, **{"federation.rounds": 2, "method.sharing.sparsity": 0.5})
    exp = build_experiment(cfg)
    run_embedded(cfg, tmp_path / "run", experiment=exp)
    out, _ = export_peft(tmp_path / "run", tmp_path / "peft")
    glob = ServerState.from_message(RunDir(tmp_path / "run").load_checkpoint()[1]).glob
    assert any(float(v.abs().sum()) > 0 for k, v in glob.items() if "lora_B" in k)  # trained, not the zero init
    # the same frozen weights as a plain transformers model, then PEFT's own loader on top
    ours, theirs = last_hidden_ours_and_peft(exp, glob, out)
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_head_pruning_of_deep_prompts_withholds_pruned_key_value_heads(tmp_path):
    """The same policy on P-tuning v2 prefixes: a layer's prefix columns of a pruned key/value head stay frozen
    and do not travel (Table 3's prompt methods, here with real head-assignable slices)."""
    sent = {}
    cfg = _cfg("fedavg-prefix", **{"method.adapter.num_tokens": 2, "method.adapter.r": None,
                                   "method.sharing": "{name: head_pruning, sparsity: 0.5}", "federation.rounds": 1})
    exp = build_experiment(cfg)
    run_embedded(cfg, tmp_path / "run", experiment=exp, reply_hook=lambda r, c, d: sent.setdefault(c, d) and d)
    msg = decode(sent[0])
    kept = msg.tensors["heads"].tolist()
    assert len(kept) == 4  # of 2 layers x 4 heads
    for layer in range(2):
        n_kept = sum(layer * 4 <= h < (layer + 1) * 4 for h in kept)
        assert msg.tensors[f"prefix.{layer}"].shape == (2, 2, 8 * n_kept)  # [h, k/v, kept heads x head_dim]
    rec = RunDir(tmp_path / "run").read_metrics()[0]
    assert rec["num_ok"] == 3 and all(c["kept_heads"] == 4 for c in rec["clients"])
    # the record names the heads each client kept (auditable selections), as its reply sent them
    assert {c["client"]: c["kept_head_ids"] for c in rec["clients"]}[0] == kept
    assert all(len(set(c["kept_head_ids"])) == 4 and all(0 <= h < 8 for h in c["kept_head_ids"])
               for c in rec["clients"])


# ---------------------------------------------------------------- masked vs physically pruned heads


def test_masked_and_physically_pruned_steps_agree_on_kept_parameters():
    """Zeroing the pruned heads' outputs and not computing them at all give the same loss and the same
    gradients on A and on the kept heads' B rows."""
    from fedpeft.backbones.attention_layout import head_overrides
    from fedpeft.sharing.head_pruning import _take, kept_slices

    cfg = _cfg("headprune", **{"method.sharing.sparsity": 0.75})
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    gen = torch.Generator().manual_seed(3)
    params = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in method.initial_params().items()}
    kept = [1, 5]  # one head in each layer
    slices = method.sharing.slices
    idx = kept_slices(slices, set(kept))
    full = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    small = {k: (_take(v, slices[k], idx[k]) if k in slices else v).clone().requires_grad_(True)
             for k, v in params.items()}
    batch = exp.objective.batch(exp.test_encoded, list(range(8)))
    loss = {}
    for mode, p in (("masked", full), ("pruned", small)):
        static = head_overrides(exp.backbone, kept, mode)
        loss[mode] = torch.nn.functional.cross_entropy(exp.objective.logits(p, batch, static), batch["labels"])
        loss[mode].backward()
    assert float(loss["masked"].detach()) == pytest.approx(float(loss["pruned"].detach()), abs=1e-5)
    for k in params:
        g_small = small[k].grad
        g_full = _take(full[k].grad, slices[k], idx[k]) if k in slices else full[k].grad
        assert torch.allclose(g_full, g_small, atol=1e-6), k
    # and it is a different function from keeping every head (the paper's lora_only default)
    with torch.no_grad():
        intact = exp.objective.logits(params, batch)
        pruned = exp.objective.logits(small, batch, head_overrides(exp.backbone, kept, "pruned"))
    assert (intact - pruned).abs().max() > 1e-3


def test_physically_pruned_run_uploads_the_same_wire_format(tmp_path):
    sent = {}
    cfg = _cfg(**{"federation.rounds": 1, "method.sharing.mode": "pruned", "method.sharing.sparsity": 0.5})
    run_embedded(cfg, tmp_path / "run", reply_hook=lambda r, c, d: sent.setdefault(c, d) and d)
    rec = RunDir(tmp_path / "run").read_metrics()[0]
    assert rec["num_ok"] == 3 and rec["num_rejected"] == 0
    msg = decode(sent[0])
    assert sum(msg.tensors[k].shape[0] for k in msg.tensors if "lora_B" in k) == 3 * 8 * 4  # 4 kept heads' rows
    with pytest.raises(ValueError, match="grouped-query"):
        run_embedded(_cfg(model="tiny-llama", **{"federation.rounds": 1, "method.sharing.mode": "pruned"}),
                     tmp_path / "gqa")
    # the cut rows belong to other heads as the kept heads change: optimizer moments cannot carry over
    with pytest.raises(ValueError, match="method.trainer.reset_optimizer: false .* sharing 'head_pruning'"):
        _cfg(**{"method.sharing.mode": "pruned", "method.trainer.reset_optimizer": False})
    _cfg(**{"method.sharing.mode": "masked", "method.trainer.reset_optimizer": False})


def test_per_layer_quota_keeps_the_same_number_in_every_layer_and_the_remainder_by_order():
    from fedpeft.sharing.head_pruning import kept_heads

    order = [0, 1, 2, 3, 8, 9, 4, 5, 10, 11, 6, 7]  # 3 layers of 4 heads; layer 0's heads score best
    assert kept_heads(order, 5) == [0, 1, 2, 3, 8]  # one global threshold
    # ⌊5/3⌋ = 1 per layer (0, 8, 4), then one more in the layers whose next head comes first (1, then 9)
    assert kept_heads(order, 5, per_layer=4) == [0, 1, 4, 8, 9]
    assert kept_heads(order, 12, per_layer=4) == list(range(12))


@pytest.mark.parametrize("variant", [{"scoring": "lowest"}, {"sinks": "cls_and_eos"}, {"quota": "per_layer"}])
def test_scoring_variants_keep_other_heads_than_the_papers(variant):
    """Each variant runs end to end and, on the same data and adapter, keeps another set of heads than Eq. 6-7."""
    kept = {}
    for name, extra in (("paper", {}), ("variant", variant)):
        cfg = _cfg("headprune", **{f"method.sharing.{k}": v for k, v in (extra | {"sparsity": 0.5}).items()})
        exp = build_experiment(cfg)
        method = build_method(cfg, exp)
        inst = method.configure_round(method.server_init(), 1, [0])[0]
        client = exp.client(0)
        start = method.sharing.client_params(method.format.start(inst), {})
        kept[name] = method.sharing.plan(start, inst, client, 1).own["kept"]
        assert len(kept[name]) == method.sharing.keep
    assert kept["paper"] != kept["variant"]
    if variant.get("quota") == "per_layer":
        per = exp.backbone.model.config.num_attention_heads
        layers = method.sharing.num_heads // per
        counts = [sum(h // per == layer for h in kept["variant"]) for layer in range(layers)]
        assert max(counts) - min(counts) <= 1


def test_fixed_random_heads_are_one_draw_for_every_client_and_round():
    """``random`` redraws the kept heads per client and round; ``random_fixed`` keeps one seeded set everywhere (as
    few distinct heads trained over a run as a scored variant), and another seed draws another set."""
    def kept(scoring, seed=0):
        cfg = _cfg("headprune", seed=seed, **{"method.sharing.scoring": scoring, "method.sharing.sparsity": 0.5})
        exp = build_experiment(cfg)
        method = build_method(cfg, exp)
        out = {}
        for rnd, cid in ((1, 0), (1, 1), (2, 0), (3, 2)):
            inst = method.configure_round(method.server_init(), rnd, [cid])[cid]
            start = method.sharing.client_params(method.format.start(inst), {})
            out[rnd, cid] = tuple(method.sharing.plan(start, inst, exp.client(cid), rnd).own["kept"])
        return out

    fixed, redrawn = kept("random_fixed"), kept("random")
    assert len(set(fixed.values())) == 1 and len(set(redrawn.values())) > 1
    assert set(kept("random_fixed", seed=1).values()) != set(fixed.values())
