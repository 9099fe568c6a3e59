"""Personalized gradient-free discrete prompt tuning as run by the framework (spec 004 §2.4-2.9, §8): the
candidate set, the local token search step by step, query counts, the uint16 token-index upload, Eq. 5 with its
residual, the server/client p' synchronisation of every download codec (clients that miss rounds included),
non-participants, BBT post-tuning, resume and config errors. The pure codec math is in test_prompt_codecs.py."""

from __future__ import annotations

import copy
import math
import statistics

import numpy as np
import pytest
import torch
from conftest import tiny_overrides

import fedpeft.trainers.discrete_search as ds
from fedpeft.adapters.token_prompt import candidate_ids
from fedpeft.model.blackbox import BlackBox
from fedpeft.backbones.encoding import Encoded
from fedpeft.build import build_method
from fedpeft.clients import sub_state
from fedpeft.comm.codec import Message, decode, encode, payload_bytes
from fedpeft.comm.update import unpack
from fedpeft.config import ConfigError
from fedpeft.experiment import build_experiment
from fedpeft.methods import PRESETS
from fedpeft.post_tuning.base import PostTuningContext, few_shot_split
from fedpeft.post_tuning.bbt import BBTPostTuning, BBTSettings
from fedpeft.resolve import load_config
from fedpeft.runtime.client import handle_train
from fedpeft.runtime.embedded import StopAfterRound, run_embedded
from fedpeft.runtime.server import RoundDriver
from fedpeft.runtime.validation import InvalidReply, validate_reply
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS
from fedpeft.trainers.discrete_search import DiscreteSearchSettings, search

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = ["tiny-bert", "tiny-llama"]
BBT_SMALL = {"method.post_tuning.iterations": 2, "method.post_tuning.intrinsic_dim": 8,
             "method.post_tuning.popsize": 4, "method.post_tuning.shots": 2}


def _cfg(preset: str = "discrete-prompt", model: str = "tiny-bert", **extra):
    """A tiny config of ``preset`` (dotted keys in ``extra``), as tests/conformance/test_presets.py builds them."""
    defaults = PRESETS.get(preset).method_defaults
    over = {"method.name": preset, "model.name": model, "task.num_examples": 72, "federation.rounds": 2,
            "method.adapter.num_tokens": 4, "method.trainer.max_steps": None, "method.trainer.batch_size": None}
    if defaults["trainer"]["name"] == "discrete_search":
        over["method.trainer.steps"] = 4
    if defaults["adapter"]["name"] == "projected_prompt":
        over |= {"method.adapter.num_tokens": 3, "method.adapter.intrinsic_dim": 8,
                 "method.trainer.iterations": 2}
    if defaults.get("post_tuning", {}).get("name") == "bbt":
        over |= BBT_SMALL
    over |= extra
    return load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in over.items()}))


def _setup(preset: str = "discrete-prompt", model: str = "tiny-bert", **extra):
    cfg = _cfg(preset, model, **extra)
    exp = build_experiment(cfg)
    return cfg, exp, build_method(cfg, exp)


def _wire(msg: Message, method) -> Message:
    """What the other side receives: the message through the codec (bytes and back)."""
    return decode(encode(msg, method.wire))


def _train_round(method, exp, state: Message, rnd: int, clients: list[int], states: dict[int, Message]):
    """One round through the wire, like the embedded runtime: (new state, instructions, replies)."""
    instructions = {c: _wire(m, method) for c, m in method.configure_round(state, rnd, clients).items()}
    replies = {}
    for c, inst in instructions.items():
        ctx = exp.client(c)
        ctx.state = states.get(c, Message())
        replies[c] = _wire(method.client_update(inst, ctx), method)
        states[c] = ctx.state
    return method.aggregate(state, rnd, replies), instructions, replies


def _rebuilt(method, exp, inst: Message, c: int, states: dict[int, Message]) -> torch.Tensor:
    """The p' client ``c`` rebuilds from ``inst`` with (a copy of) its own state, which is left untouched."""
    ctx = exp.client(c)
    ctx.state = copy.deepcopy(states.get(c, Message()))
    return method._decode_down(_wire(inst, method), ctx).tensors["prompt"]


def _strip(records):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


class RecordingBox(BlackBox):
    """The black box, remembering every ``losses`` call: (stacked prompts, losses, number of examples)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[torch.Tensor, torch.Tensor, int]] = []

    def losses(self, z: torch.Tensor, data: Encoded) -> torch.Tensor:
        out = super().losses(z, data)
        self.calls.append((z.detach().clone(), out.clone(), len(data)))
        return out


# ---------------------------------------------------------------- 1. candidate set (Eq. 7)


def test_candidates_are_the_top_k_cosine_neighbours_among_non_special_ids():
    _, exp, method = _setup()
    vocab = method.trainer.vocabulary()
    table = vocab.table
    special = set(exp.backbone.tokenizer.all_special_ids)
    allowed = candidate_ids(exp.backbone)
    assert special and torch.equal(vocab.ids, allowed)
    assert allowed.tolist() == [i for i in range(table.shape[0]) if i not in special]
    assert torch.equal(table, exp.backbone.input_embeddings().weight.detach().float())

    unit = table[allowed].double()
    unit = unit / unit.norm(dim=1, keepdim=True)
    g = torch.Generator().manual_seed(0)
    tokens = allowed[torch.randperm(len(allowed), generator=g)[:20]]
    rows = [0.1 * torch.randn(table.shape[1], generator=g) for _ in range(4)]
    rows += [0.6 * table[a] + 0.4 * table[b] for a, b in zip(tokens[:4], tokens[4:8])]  # p' mixtures
    rows += [table[v] for v in tokens] + [table[s] for s in sorted(special)]
    checked = 0
    for row in rows:
        for k in (1, 5, 8):
            sims = unit @ (row.double() / row.double().norm())
            order = torch.argsort(-sims, stable=True)
            if sims[order[k - 1]] - sims[order[k]] < 1e-6:  # a float32 near-tie: the order is not defined
                continue
            assert vocab.nearest(row, k).tolist() == allowed[order[:k]].tolist()
            checked += 1
    assert checked >= 0.9 * 3 * len(rows)
    for v in tokens.tolist():  # a token row: the token is its own nearest neighbour, hence in C
        assert v in vocab.nearest(table[v], 5).tolist() and int(vocab.nearest(table[v], 1)) == v
    for s in special:  # special ids are never candidates, even for their own embedding
        assert s not in vocab.nearest(table[s], 50).tolist()


# ---------------------------------------------------------------- 2./4. the local search, step by step


def _replay(box: RecordingBox, vocab, start, k, acceptance, whole, batch_size=None):
    """Re-derive every step of Alg. 3 from the recorded black-box calls and check it (Eqs. 6-7)."""
    table = vocab.table
    calls = box.calls
    p = start.clone()
    changed = torch.zeros(start.shape[0], dtype=torch.bool)
    tokens = torch.full((start.shape[0],), -1)
    trace, rejected, positions = [], 0, []
    if whole:
        z0, l0, _ = calls[0]
        assert torch.equal(z0, start)
        current, calls = float(l0[0]), calls[1:]
    for z, losses, n in calls:
        extra = 0 if whole else 1
        assert z.shape == (k + extra, *start.shape)
        if not whole:
            assert n == batch_size and torch.equal(z[-1], p)  # the current prompt, on the same minibatch
            current = float(losses[-1])
        differs = (z[:k] != p.unsqueeze(0)).any(dim=2).any(dim=0)
        assert int(differs.sum()) == 1  # one position per step; every other row is the current prompt's
        t = int(torch.nonzero(differs))
        positions.append(t)
        near = vocab.nearest(p[t], k)
        assert torch.equal(z[:k, t], table[near])  # the K nearest tokens of the CURRENT row (Eq. 7)
        j = int(torch.argmin(losses[:k]))
        rejected += float(losses[j]) > current  # every candidate is worse than the current prompt
        if acceptance == "literal_eq6" or float(losses[j]) < current:
            p[t] = table[near[j]]
            changed[t], tokens[t], current = True, int(near[j]), float(losses[j])
        trace.append(current)
    return p, changed, tokens, trace, rejected, positions


@pytest.mark.parametrize("model", MODELS)
def test_search_steps_follow_eqs_6_7_and_keep_current_is_monotone(model):
    llama = model == "tiny-llama"  # its verbalizer readout runs the full LM head: far slower forwards
    _, exp, method = _setup(model=model, **{"task.num_examples": 36 if llama else 72})
    vocab = method.trainer.vocabulary()
    data = exp.client(0).train
    assert len(data) <= DiscreteSearchSettings().full_set_max
    init = method.initial_params()["prompt"]
    T, K, S = init.shape[0], 3 if llama else 4, 5 if llama else 12
    # a p' whose rows are not tokens (as after a compressed download); start and seed chosen so that some
    # step finds every candidate worse than the current prompt
    start = 0.7 * init + 0.3 * init.roll(1, dims=0) if llama else 0.5 * init
    seed = 1 if llama else 7
    for acceptance in ("keep_current", "literal_eq6"):
        box = RecordingBox(exp.objective, param_name="prompt", param_dims=2)
        cfg = DiscreteSearchSettings(steps=S, candidates=K, acceptance=acceptance)
        p, changed, tok, trace = search(box, vocab, start, data, cfg, np.random.default_rng(seed))
        assert len(box.calls) == S + 1 and len(trace) == S
        want_p, want_changed, want_tok, want_trace, rejected, positions = _replay(box, vocab, start, K, acceptance,
                                                                                  whole=True)
        assert torch.equal(p, want_p) and torch.equal(changed, want_changed) and trace == want_trace
        assert torch.equal(tok[changed], want_tok[changed])
        # 4. changed rows are rows of e(V), bit for bit; unchanged rows are the incoming prompt's
        for t in range(T):
            if changed[t]:
                assert int(tok[t]) in set(vocab.ids.tolist()) and torch.equal(p[t], vocab.table[tok[t]])
            else:
                assert torch.equal(p[t], start[t])
        start_loss = float(box.calls[0][1][0])
        if acceptance == "keep_current":
            assert all(b <= a for a, b in zip([start_loss, *trace], trace))  # non-increasing
            assert rejected > 0  # the keep-current rule was exercised
        else:  # every visited row was replaced, whatever its loss
            assert set(torch.nonzero(changed).flatten().tolist()) == set(positions)
        # the trace's last value is the loss of the returned prompt on the whole local set
        assert trace[-1] == pytest.approx(float(box.losses(p, data)[0]), abs=1e-6)


def test_minibatch_search_scores_the_current_prompt_with_the_candidates():
    _, exp, method = _setup()
    vocab = method.trainer.vocabulary()
    data = exp.client(1).train
    start = method.initial_params()["prompt"]
    box = RecordingBox(exp.objective, param_name="prompt", param_dims=2)
    cfg = DiscreteSearchSettings(steps=6, candidates=3, full_set_max=8, batch_size=5)
    p, changed, _, _ = search(box, vocab, start, data, cfg, np.random.default_rng(3))
    assert len(data) > cfg.full_set_max and len(box.calls) == 6
    want_p, want_changed, *_ = _replay(box, vocab, start, 3, "keep_current", whole=False, batch_size=5)
    assert torch.equal(p, want_p) and torch.equal(changed, want_changed)
    assert box.usage.candidates == 6 * (3 + 1) and box.usage.queries == 6


# ---------------------------------------------------------------- 3. query counts per client per round


@pytest.mark.parametrize("mode", ["whole", "minibatch", "chunked"])
def test_candidate_evaluations_and_forwards_per_client_round(mode):
    S, K = 5, 3
    extra = {"method.trainer.steps": S, "method.trainer.candidates": K}
    if mode == "minibatch":
        extra |= {"method.trainer.full_set_max": 8, "method.trainer.batch_size": 6}
    if mode == "chunked":  # 38 rows per forward: K x 12 examples per chunk, 2 chunks for 19 examples
        extra |= {"method.trainer.max_rows": 38}
    _, exp, method = _setup(**extra)
    vocab_size = method.trainer.vocabulary().table.shape[0]
    box = BlackBox(exp.objective, param_name="prompt", param_dims=2)
    state, states = method.server_init(), {}
    for rnd in (1, 2):
        prev = state.tensors["prompt"].clone()
        schema = method.reply_schema(state)
        state, _, replies = _train_round(method, exp, state, rnd, [0, 1, 2], states)
        for c, reply in replies.items():
            n = len(exp.client(c).train)
            assert n == 19
            s = reply.scalars
            # the reported training loss is the uploaded prompt's on the whole local set
            prompt = method.format.decode(unpack(reply, schema, c), {"prompt": prev}).tensors["prompt"]
            assert s["train_loss"] == pytest.approx(float(box.losses(prompt, exp.client(c).train)[0]), abs=1e-6)
            assert s["rows_changed"] == int((reply.tensors["tokens"].to(torch.int64) != vocab_size).sum())
            if mode == "whole":
                assert (s["candidates"], s["queries"]) == (S * K + 1, S + 1)
            elif mode == "minibatch":
                assert (s["candidates"], s["queries"]) == (S * (K + 1), S)
            else:
                assert (s["candidates"], s["queries"]) == (S * K + 1, 1 + S * math.ceil(n / (38 // K)))


# ---------------------------------------------------------------- 5. upload (Alg. 4) and its validation


@pytest.mark.parametrize("model", MODELS)
def test_upload_is_t_uint16_indices_and_the_server_decodes_the_clients_prompt(model, monkeypatch):
    small = {"task.num_examples": 36, "method.trainer.steps": 2, "method.trainer.candidates": 3}
    _, exp, method = _setup(model=model, **(small if model == "tiny-llama" else {}))
    vocab_size = method.trainer.vocabulary().table.shape[0]
    T = method.initial_params()["prompt"].shape[0]
    found = {}

    def spy(box, vocab, prompt, data, cfg, rng):
        out = search(box, vocab, prompt, data, cfg, rng)
        found[len(found)] = (prompt.clone(), *out)
        return out

    monkeypatch.setattr(ds, "search", spy)
    state, states = method.server_init(), {}
    state, _, _ = _train_round(method, exp, state, 1, [0, 1, 2], states)
    sent = state.tensors["prompt"].clone()  # p'_1: mixtures, not tokens (analogy download)
    found.clear()
    new_state, instructions, replies = _train_round(method, exp, state, 2, [0, 1, 2], states)
    schema = method.reply_schema(state)
    sentinels = 0
    for i, c in enumerate(sorted(replies)):
        reply = replies[c]
        received, prompt, changed, tokens, _ = found[i]
        assert torch.equal(received, sent)  # the client searched from the server's p'
        assert set(reply.tensors) == {"tokens"}
        up = reply.tensors["tokens"]
        assert up.dtype == torch.uint16 and up.shape == (T,)
        assert payload_bytes(reply, method.wire) == 2 * T
        assert sum(v.numel() * v.element_size() for v in decode(encode(reply, method.wire)).tensors.values()) == 2 * T
        idx = up.to(torch.int64)
        assert torch.equal(idx[~changed], torch.full((int((~changed).sum()),), vocab_size))
        assert torch.equal(idx[changed], tokens[changed])
        sentinels += int((~changed).sum())
        validate_reply(reply, schema, 0)
        server = method.format.decode(unpack(reply, schema, c), {"prompt": sent})
        assert torch.equal(server.tensors["prompt"], prompt)  # bit for bit
    assert sentinels > 0  # some rows travelled as the sentinel
    assert schema.dtype_of("tokens") == torch.uint16 and schema.tensors == {"tokens": (T,)}

    # an index above the sentinel is rejected by validation, not by a crash in aggregation
    bad = copy.deepcopy(replies[0])
    bad.tensors["tokens"][1] = vocab_size + 1
    with pytest.raises(InvalidReply, match="sentinel"):
        validate_reply(bad, schema, 0)
    edge = copy.deepcopy(replies[0])
    edge.tensors["tokens"][:] = vocab_size  # all sentinel: valid, nothing changed
    validate_reply(edge, schema, 0)
    wide = copy.deepcopy(replies[0])
    wide.tensors["tokens"] = wide.tensors["tokens"].to(torch.int32)
    with pytest.raises(InvalidReply, match="dtype"):
        validate_reply(wide, schema, 0)


def test_a_reply_with_an_index_above_the_sentinel_is_rejected_in_the_round():
    cfg, exp, method = _setup()
    vocab_size = method.trainer.vocabulary().table.shape[0]
    driver = RoundDriver(cfg.federation, method)
    state = method.server_init()
    plan = driver.plan_round(state, 1)
    results = {c: handle_train(method, payload, exp.client(c)) for c, payload in plan.instructions.items()}
    msg = decode(results[1])
    msg.tensors["tokens"][0] = vocab_size + 1
    results[1] = encode(msg, method.wire)
    new_state, records = driver.finish_round(state, plan, dict(results))  # finish_round empties what it is given
    assert [r["status"] for r in records] == ["ok", "rejected", "ok"]
    assert "sentinel" in records[1]["error"]
    # the round went on with the two valid replies: Eq. 5 over clients 0 and 2 only
    new_state2, _ = driver.finish_round(state, plan, {c: results[c] for c in (0, 2)})
    assert torch.equal(new_state.tensors["prompt"], new_state2.tensors["prompt"])


# ---------------------------------------------------------------- 6. Eq. 5 and the residual


def test_dense_download_global_is_the_uniform_mean_and_the_residual_is_token_differences():
    _, exp, method = _setup(**{"method.downlink.name": "dense", "method.trainer.steps": 6,
                               "federation.partition.scheme": "dirichlet_quantity"})
    sizes = [len(exp.client(c).train) for c in range(3)]
    assert len(set(sizes)) == 3 and max(sizes) <= 64  # unequal sizes: uniform and FedAvg weights differ
    table = method.trainer.vocabulary().table
    V = table.shape[0]
    state, states = method.server_init(), {}
    for rnd in (1, 2):
        prev = state.tensors["prompt"].clone()
        state, instructions, replies = _train_round(method, exp, state, rnd, [0, 1, 2], states)
        for inst in instructions.values():  # dense: the global prompt itself, in float32
            assert torch.equal(inst.tensors["prompt"], prev)
        schema = method.reply_schema(method.server_init())
        decoded = [method.format.decode(unpack(replies[c], schema, c), {"prompt": prev}).tensors["prompt"]
                   for c in sorted(replies)]
        glob = state.tensors["prompt"]
        M = len(decoded)
        mean = torch.stack(decoded).double().mean(0)
        torch.testing.assert_close(glob.double(), mean, rtol=0, atol=1e-7)
        # R^t = (1/M) sum over the clients that changed row t of (e(tok_i[t]) - p'^t)
        idx = torch.stack([replies[c].tensors["tokens"].to(torch.int64) for c in sorted(replies)])
        residual = torch.zeros_like(prev, dtype=torch.float64)
        for row in idx:
            for t, v in enumerate(row.tolist()):
                if v != V:
                    residual[t] += (table[v].double() - prev[t].double()) / M
        torch.testing.assert_close((glob.double() - prev.double()), residual, rtol=0, atol=1e-7)
        untouched = (idx == V).all(0)
        assert torch.equal(glob[untouched], prev[untouched])  # no client changed them: exactly p'
        assert (idx != V).any()


# ---------------------------------------------------------------- 7. download codecs: server p' == client p'


SCHEDULE = [[0, 1], [0, 2], [0, 1], [0, 2]]  # client 0 every round, 1 and 2 miss rounds, 3 never trains


def _last_trained(c: int, upto: int) -> int:
    rounds = [r for r, cl in enumerate(SCHEDULE[:upto], 1) if c in cl]
    return rounds[-1] if rounds else 1


@pytest.mark.parametrize("phi,wire", [(5, "float32"), (16, "float32"), (16, "float16")])
def test_analogy_download_keeps_every_client_bitwise_in_sync(phi, wire):
    """A float16 method codec must not round the whole-p' fallback: that client would drift off p' for good."""
    cfg, exp, method = _setup(**{"federation.num_clients": 4, "federation.clients_per_round": 2,
                                 "federation.rounds": len(SCHEDULE), "task.num_examples": 96,
                                 "method.downlink.phi": phi, "method.codec.dtype": wire})
    T, D = method.initial_params()["prompt"].shape
    assert cfg.federation.clients_per_round < cfg.federation.num_clients
    chain_bytes, whole_bytes = T * 2 * phi * 2, T * D * 4
    state, states = method.server_init(), {}
    fallbacks = 0
    for rnd, clients in enumerate(SCHEDULE, 1):
        prev = state.tensors["prompt"].clone()
        state, instructions, _ = _train_round(method, exp, state, rnd, clients, states)
        assert sorted(instructions) == clients
        for c, inst in instructions.items():
            missed = (rnd - 1) - _last_trained(c, rnd - 1) + 1  # residual messages the client lacks
            if rnd == 1:
                assert not inst.tensors
            elif missed * chain_bytes <= whole_bytes:
                assert set(inst.tensors) == {"prompt::ids", "prompt::coef"}
                assert inst.tensors["prompt::ids"].dtype == torch.uint16
                assert inst.tensors["prompt::coef"].dtype == torch.float16
                assert inst.tensors["prompt::ids"].shape == (missed, T, phi) == inst.tensors["prompt::coef"].shape
                assert payload_bytes(inst, method.wire) == missed * chain_bytes
            else:
                assert set(inst.tensors) == {"prompt::full"}
            # the p' the client trained from is the server's, bit for bit
            assert torch.equal(sub_state(states[c], "dl/")["prompt"], prev)
            assert int(sub_state(states[c], "dl/")["version"]) == rnd - 1
        # after every round, every client (whatever it missed) rebuilds the server's p' bit for bit
        glob = state.tensors["prompt"]
        assert not torch.equal(glob, prev)
        for c, inst in method.configure_evaluate(state, rnd, [0, 1, 2, 3]).items():
            missed = rnd - _last_trained(c, rnd) + 1
            if missed * chain_bytes > whole_bytes:
                assert set(inst.tensors) == {"prompt::full"} and payload_bytes(inst, method.wire) == whole_bytes
                fallbacks += 1
            else:
                assert set(inst.tensors) == {"prompt::ids", "prompt::coef"}
                assert payload_bytes(inst, method.wire) == missed * chain_bytes
            assert torch.equal(_rebuilt(method, exp, inst, c, states), glob)
    # the rounds-1..4 chain costs 4 x 2 x phi x 2 bytes per row against 4 x D bytes for the whole p'
    assert fallbacks == {5: 0, 16: 2}[phi]


@pytest.mark.parametrize("preset,size", [("discrete-prompt-full", lambda T, D: T * D * 2),
                                         ("discrete-prompt-pca10", lambda T, D: T * 10 * 2),
                                         ("discrete-prompt-quant3", lambda T, D: math.ceil(T * D * 3 / 8) + 2 * T)])
def test_stateless_downloads_keep_every_client_bitwise_in_sync(preset, size, monkeypatch):
    _, exp, method = _setup(preset, **{"federation.num_clients": 4, "federation.clients_per_round": 2,
                                       "federation.rounds": len(SCHEDULE), "task.num_examples": 96})
    T, D = method.initial_params()["prompt"].shape
    seen: list[torch.Tensor] = []

    def spy(box, vocab, prompt, data, cfg, rng):
        seen.append(prompt.clone())
        return search(box, vocab, prompt, data, cfg, rng)

    monkeypatch.setattr(ds, "search", spy)
    state, states = method.server_init(), {}
    for rnd, clients in enumerate(SCHEDULE, 1):
        prev = state.tensors["prompt"].clone()
        seen.clear()
        state, instructions, _ = _train_round(method, exp, state, rnd, clients, states)
        # every selected client searched from exactly the server's p' (the latest message stands for it)
        assert len(seen) == 2 and all(torch.equal(p, prev) for p in seen)
        if rnd > 1:
            assert all(payload_bytes(inst, method.wire) == size(T, D) for inst in instructions.values())
        glob = state.tensors["prompt"]
        assert not torch.equal(glob, prev)
        for c, inst in method.configure_evaluate(state, rnd, [0, 1, 2, 3]).items():
            assert payload_bytes(inst, method.wire) == size(T, D)
            assert torch.equal(_rebuilt(method, exp, inst, c, states), glob)


# ---------------------------------------------------------------- 8. non-participants


def test_non_participants_never_train_but_are_evaluated(tmp_path):
    extra = {"federation.num_clients": 4, "federation.non_participants.fraction": 0.25, "task.num_examples": 96}
    cfg, exp, method = _setup(**extra)
    idle = exp.non_participants
    assert len(idle) == 1
    (np_id,) = idle
    state = method.server_init()
    for rnd in range(1, 8):
        assert np_id not in method.configure_round(state, rnd, [0, 1, 2, 3])
    summary = run_embedded(cfg, tmp_path / "run", experiment=exp)
    assert summary["upload_tensor_bytes"] == 2 * cfg.method.adapter.num_tokens  # T uint16 indices
    recs = RunDir(tmp_path / "run").read_metrics()
    assert len(recs) == 2
    for r in recs:
        trained = {c["client"] for c in r["clients"]}
        assert trained == {0, 1, 2, 3} - {np_id} and r["num_ok"] == 3
        assert set(r["local_accuracy"]) == {"0", "1", "2", "3"}
        acc = {int(k): v for k, v in r["local_accuracy"].items()}
        assert r["local_accuracy_NP"] == pytest.approx(acc[np_id], abs=1e-12)
        assert r["local_accuracy_P"] == pytest.approx(statistics.fmean(v for k, v in acc.items() if k != np_id))
    assert "local_accuracy_global_P" not in recs[0] and "local_accuracy_global_NP" not in recs[0]
    assert "local_accuracy_global_P" in recs[1] and "local_accuracy_global_NP" in recs[1]


# ---------------------------------------------------------------- 9. post-tuning


def test_few_shot_split_draws_at_most_k_per_class_and_a_disjoint_dev_set():
    labels = np.array([0] * 7 + [1] * 3 + [2] * 1)
    data = Encoded([[i] for i in range(len(labels))], labels, np.full(len(labels), -1), 1)
    for seed in range(5):
        train, dev = few_shot_split(data, 2, True, np.random.default_rng(seed))
        tr, dv = {r[0] for r in train.input_ids}, {r[0] for r in dev.input_ids}
        assert not tr & dv and len(tr) == len(train) and len(dv) == len(dev)
        assert np.bincount(train.labels, minlength=3).tolist() == [2, 2, 1]
        assert np.bincount(dev.labels, minlength=3).tolist() == [2, 1, 0]  # class 2 is exhausted
        assert all(labels[i] == lab for i, lab in zip(sorted(tr), train.labels))
        only, none = few_shot_split(data, 2, False, np.random.default_rng(seed))
        assert none is None and only.input_ids == train.input_ids


class AccuracyBox(BlackBox):
    """The black box, remembering every ``accuracy`` call: (prompt, accuracy)."""

    seen: list[tuple[torch.Tensor, float]] = []

    def accuracy(self, z: torch.Tensor, data: Encoded) -> tuple[float, float, np.ndarray]:
        out = super().accuracy(z, data)
        AccuracyBox.seen.append((z.detach().clone(), out[0]))
        return out


def test_bbt_post_tuning_with_dev_selection_is_never_worse_on_dev_and_counts_queries(monkeypatch):
    _, exp, method = _setup()
    clf = exp.objective
    params = method.initial_params()
    pop, iters = 4, 3
    monkeypatch.setattr("fedpeft.post_tuning.bbt.BlackBox", AccuracyBox)
    last_worse = 0
    for sigma in (0.1, 10.0):
        for c in range(3):
            data = exp.client(c).train
            for seed in range(4):
                tuner = BBTPostTuning(BBTSettings(shots=4, intrinsic_dim=6, popsize=pop, iterations=iters,
                                                  sigma=sigma, select="dev"), PostTuningContext(clf))
                rng = np.random.default_rng(seed)
                _, dev = few_shot_split(data, 4, True, copy.deepcopy(rng))
                AccuracyBox.seen = []
                tuned, report = tuner.tune(params, data, rng)
                seen = AccuracyBox.seen
                assert set(tuned) == {"prompt"} and tuned["prompt"].shape == params["prompt"].shape
                # scored on dev: the global prompt first, then the mean after each iteration
                assert len(seen) == iters + 1 and torch.equal(seen[0][0], params["prompt"])
                box = BlackBox(clf, param_name="prompt", param_dims=2)
                before, after = box.accuracy(params["prompt"], dev)[0], box.accuracy(tuned["prompt"], dev)[0]
                assert before == seen[0][1] and after >= before
                best = max(a for _, a in seen)
                assert after == best  # the earliest prompt of best dev accuracy is kept
                assert torch.equal(tuned["prompt"], next(z for z, a in seen if a == best))
                last_worse += seen[-1][1] < best
                assert report == {"post_queries": pop * iters + iters + 1, "post_shots": 8}
                last, report = BBTPostTuning(BBTSettings(shots=4, intrinsic_dim=6, popsize=pop, iterations=iters,
                                                         sigma=sigma, select="last"), PostTuningContext(clf)).tune(
                    params, data, np.random.default_rng(seed))
                assert report["post_queries"] == pop * iters
                assert not torch.equal(last["prompt"], params["prompt"])
    assert last_worse > 0  # the dev selection had something to guard against


def test_bbt_post_tuning_of_a_projected_prompt_searches_z():
    _, exp, method = _setup("bbt-fed", **{"method.post_tuning.intrinsic_dim": 3, "method.post_tuning.select": "last"})
    params = method.initial_params()
    assert set(params) == {"z"} and params["z"].shape == (8,)
    tuned, report = method.post_tuning.tune(params, exp.client(0).train, np.random.default_rng(0))
    assert set(tuned) == {"z"} and tuned["z"].shape == (8,) and tuned["z"].any()
    assert report["post_queries"] == 4 * 2


# ---------------------------------------------------------------- 10. resume


@pytest.mark.parametrize("stop", [1, 2])
def test_resume_with_the_analogy_download_and_missed_rounds(stop, tmp_path):
    """stop=2: a client that trained in round 2 holds p'_1 and needs it in round 3 (its chain starts at round 2),
    so a resume that lost the checkpointed client states would fail that client."""
    cfg = _cfg(**{"federation.clients_per_round": 2, "federation.rounds": 3})
    exp = build_experiment(cfg)
    run_embedded(cfg, tmp_path / "full", experiment=exp)
    full = RunDir(tmp_path / "full").read_metrics()
    assert all(r["num_ok"] == 2 and r["num_failed"] == 0 for r in full)
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", experiment=exp, stop_after_round=stop)
    last, _, clients, _ = RunDir(tmp_path / "cut").load_checkpoint()
    assert last == stop and clients
    for c, st in clients.items():  # the codec's copy of p' is part of the checkpointed client state
        assert {"dl/prompt", "dl/version"} <= set(st.tensors)
    run_embedded(cfg, tmp_path / "cut", experiment=exp, resume=True)
    assert _strip(RunDir(tmp_path / "cut").read_metrics()) == _strip(full)


# ---------------------------------------------------------------- 11. config errors


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"method\.downlink\.name: 'analogy'"):
        _cfg("fedavg-lora", **{"method.downlink.name": "analogy", "method.adapter.num_tokens": None,
                               "method.trainer.max_steps": 2, "method.trainer.batch_size": 8})
    with pytest.raises(ConfigError, match=r"method\.trainer\.name: 'discrete_search'"):
        _cfg(**{"method.adapter.name": "soft_prompt"})
    with pytest.raises(ConfigError, match=r"method\.post_tuning\.name: 'bbt'"):
        _cfg("fedavg-lora", **{"method.post_tuning.name": "bbt", "method.adapter.num_tokens": None,
                               "method.trainer.max_steps": 2, "method.trainer.batch_size": 8})
