"""The method contract, checked for every preset on every tiny model family (as HF PEFT's parametrised tests):
one round runs, byte counts are the encoded lengths, the frozen backbone is unchanged, a stopped run resumes to
the same metrics, and malformed replies are rejected. Then combinations no preset names, composed from the CLI."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_overrides

from fedpeft.build import build_method
from fedpeft.comm.codec import Message, decode, encode
from fedpeft.comm.update import Update
from fedpeft.experiment import build_experiment
from fedpeft.methods import PRESETS
from fedpeft.resolve import load_config
from fedpeft.runtime.audit import FULL_MODEL_PRESETS, audit_reply
from fedpeft.runtime.embedded import StopAfterRound, run_embedded
from fedpeft.sharing import SHARING
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS
from fedpeft.trainers import TRAINERS
from fedpeft.transforms import TRANSFORMS
from fedpeft.transforms.scale_delta import ScaleDelta, ScaleDeltaSettings
from tests.conformance.cases import LEAST

MODELS = ["tiny-bert", "tiny-llama"]
SMALL = {  # per adapter, trainer and post-tuning: the smallest settings that still exercise it
    "soft_prompt": {"method.adapter.num_tokens": 3},
    "token_prompt": {"method.adapter.num_tokens": 3},
    "deep_prompt": {"method.adapter.num_tokens": 2},
    "projected_prompt": {"method.adapter.num_tokens": 3, "method.adapter.intrinsic_dim": 8},
    "cmaes": {"method.trainer.iterations": 2},
    "discrete_search": {"method.trainer.steps": 3},
    "bbt": {"method.post_tuning.iterations": 2, "method.post_tuning.intrinsic_dim": 8,
            "method.post_tuning.popsize": 4, "method.post_tuning.shots": 2},
    "gradient": {"method.post_tuning.steps": 2, "method.post_tuning.shots": 2},
    "zo_sgd": {"method.trainer.local_steps": 2, "method.trainer.pool_size": 64},
}


# presets whose trainer needs another task than the tiny classification one (and the models that can run it)
PRESET_TASKS = {"feddpo": ({"task.name": "synthetic-preference", "task.max_length": 64, "task.max_response_length": 8},
                           ("tiny-llama",))}


def first_model(preset: str) -> str:
    return PRESET_TASKS.get(preset, ({}, MODELS))[1][0]

pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(preset: str, model: str, **extra):
    defaults = PRESETS.get(preset).method_defaults
    adapter, trainer = defaults["adapter"]["name"], defaults["trainer"]["name"]
    post = defaults.get("post_tuning", {}).get("name")
    over = {"method.name": preset, "model.name": model, "task.num_examples": 72, "federation.rounds": 2,
            "method.adapter.num_tokens": None, "method.trainer.max_steps": None, "method.trainer.batch_size": None,
            **SMALL.get(adapter, {}), **SMALL.get(trainer, {}), **SMALL.get(post, {})}
    if trainer in ("adam", "adamw", "sgd"):
        over |= {"method.trainer.max_steps": 2, "method.trainer.batch_size": 8}
    if preset == "fedpeptao":
        over["method.sharing.warmup_rounds"] = 1
    task, models = PRESET_TASKS.get(preset, ({}, MODELS))
    if model not in models:
        pytest.skip(f"{preset} needs {' or '.join(models)}")
    over |= task | extra
    return load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in over.items()}))


def _strip(records):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("preset", PRESETS.names())
def test_preset_contract(preset, model, tmp_path):
    cfg = _cfg(preset, model)
    exp = build_experiment(cfg)
    before = exp.backbone.checksum()
    sent: dict[tuple[int, int], int] = {}
    replies: dict[tuple[int, int], bytes] = {}

    def record(rnd, cid, data):
        sent[(rnd, cid)] = len(data)
        replies[(rnd, cid)] = data
        return data

    summary = run_embedded(cfg, tmp_path / "full", experiment=exp, reply_hook=record)
    recs = RunDir(tmp_path / "full").read_metrics()
    assert [r["round"] for r in recs] == [1, 2] and all(r["num_ok"] == 3 for r in recs)
    assert math.isfinite(recs[-1]["loss"]) and 0 <= recs[-1]["accuracy"] <= 1
    # bytes are the lengths of the real encoded messages, both directions
    for r in recs:
        assert r["bytes_up"] == sum(sent[(r["round"], c["client"])] for c in r["clients"])
    method = build_method(cfg, exp)
    first = method.configure_round(method.server_init(), 1, list(range(3)))
    assert [c["bytes_down"] for c in recs[0]["clients"]] == [len(encode(first[c], method.wire)) for c in sorted(first)]
    # the frozen backbone never changes
    assert exp.backbone.checksum() == before and summary["backbone_unchanged"]
    audit_payloads(preset, exp, replies)
    # stop after round 1 + resume == uninterrupted
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", experiment=exp, stop_after_round=1)
    run_embedded(cfg, tmp_path / "cut", experiment=exp, resume=True)
    assert _strip(RunDir(tmp_path / "cut").read_metrics()) == _strip(recs)


def audit_payloads(preset: str, exp, replies: dict[tuple[int, int], bytes]) -> None:
    """Every reply of a whole run (all valid: the server accepted each, so its tensors are exactly its schema's)
    passes the payload audit: numbers as scalars, far fewer values than the backbone, no frozen weight, no text of
    the client's data."""
    for (rnd, cid), data in replies.items():
        assert audit_reply(data, exp, cid, preset in FULL_MODEL_PRESETS) == [], (rnd, cid)


def test_the_payload_audit_finds_weights_text_and_non_numbers(tmp_path):
    cfg = _cfg("fedprompt", "tiny-bert")
    exp = build_experiment(cfg)
    name, weight = next((n, p) for n, p in exp.backbone.model.named_parameters() if p.dim() == 2)
    text = exp.task.train[int(exp.train_parts[1][0])].text_a
    leaky = encode(Message({"w": weight.detach().clone()}, {"note": text, "num_examples": 3}))
    found = audit_reply(leaky, exp, 1)
    assert any(f"equals the frozen weight {name}" in p for p in found)
    assert any("is a str" in p for p in found) and any("client's text" in p for p in found)
    assert any("of the backbone" in p for p in audit_reply(encode(Message({"w": torch.zeros(10**6)})), exp, 1))


@pytest.mark.parametrize("preset", PRESETS.names())
def test_malformed_replies_are_rejected(preset, tmp_path):
    cfg = _cfg(preset, first_model(preset), **{"federation.rounds": 1})

    def corrupt(rnd, cid, data):
        msg = decode(data)
        floats = sorted(k for k, v in msg.tensors.items() if v.is_floating_point())
        if cid == 0:  # a NaN, or for replies without tensors an impossible example count
            if floats:
                msg.tensors[floats[0]].view(-1)[0] = float("nan")
            else:
                msg.scalars["num_examples"] = -1
        if cid == 1:  # a wrong shape, or a stray tensor
            if floats:
                msg.tensors[floats[0]] = torch.zeros(2, 1)
            else:
                msg.tensors["extra"] = torch.zeros(1)
        return encode(msg)

    run_embedded(cfg, tmp_path / "run", reply_hook=corrupt)
    rec = RunDir(tmp_path / "run").read_metrics()[0]
    assert {c["client"]: c["status"] for c in rec["clients"]} == {0: "rejected", 1: "rejected", 2: "ok"}


# ---------------------------------------------------------------- any combination runs


def _run(tmp_path, name, preset, model="tiny-bert", **extra):
    summary = run_embedded(_cfg(preset, model, **extra), tmp_path / name)
    return summary, RunDir(tmp_path / name).read_metrics()


def test_fedprompt_with_a_server_optimiser_differs_from_fedavg(tmp_path):
    _, avg = _run(tmp_path, "avg", "fedprompt")
    _, adam = _run(tmp_path, "adam", "fedprompt", **{"method.aggregator.name": "fedadam"})
    assert adam[0]["bytes_up"] == avg[0]["bytes_up"] and adam[-1]["loss"] != avg[-1]["loss"]


def test_fedpeptao_layer_sharing_with_coordinate_median(tmp_path):
    summary, recs = _run(tmp_path, "run", "fedpeptao", **{"method.aggregator.name": "median",
                                                           "federation.rounds": 3})
    _, state, _, _ = RunDir(tmp_path / "run").load_checkpoint()
    assert len(state.scalars["sharing"]["selected"]) == 1  # ⌈0.5 · 2⌉ layers after the warm-up round
    assert recs[2]["bytes_up"] < recs[0]["bytes_up"]


def test_fedbpt_adapter_and_trainer_with_fedavg_upload_their_distribution(tmp_path):
    seen = {}
    cfg = _cfg("fedbpt", "tiny-bert", **{"method.aggregator.name": "fedavg"})
    run_embedded(cfg, tmp_path / "run", reply_hook=lambda r, c, d: seen.setdefault(c, set(decode(d).tensors)) and d)
    assert seen[0] == {"z", "sigma", "cov", "loss"}


def test_norm_clipping_wrapper_reports_clipped_clients(tmp_path):
    _, recs = _run(tmp_path, "run", "fedprompt", **{"method.wrappers": "[{name: clip, max_norm: 1.0e-6}]"})
    assert all(r["server"]["clipped"] == 3 for r in recs)


def test_selector_all_ignores_clients_per_round(tmp_path):
    _, recs = _run(tmp_path, "run", "fedprompt", **{"federation.clients_per_round": 1,
                                                     "method.selector.name": "all"})
    assert all(r["num_selected"] == 3 for r in recs)


def test_fedprox_keeps_local_training_near_the_global(tmp_path):
    drift = {}
    for mu in (0.0, 100.0):
        cfg = _cfg("fedprompt", "tiny-bert", **{"method.trainer.prox_mu": mu, "method.trainer.name": "sgd",
                                                 "method.trainer.lr": 0.005, "method.trainer.max_steps": 6,
                                                 "method.trainer.grad_clip": None, "federation.rounds": 1})
        exp = build_experiment(cfg)
        method = build_method(cfg, exp)
        inst = method.configure_round(method.server_init(), 1, [0])[0]
        reply = method.client_update(inst, exp.client(0))
        drift[mu] = float((reply.tensors["prompt"] - inst.tensors["prompt"]).norm())
    assert 0 < drift[100.0] < 0.7 * drift[0.0]


def test_scale_delta_transform_is_exact():
    start = {"p": torch.tensor([1.0, 2.0])}
    up = Update(0, {"p": torch.tensor([2.0, 0.0])}, 5)
    out = ScaleDelta(ScaleDeltaSettings(factor=3.0)).apply(up, start, 1, torch.Generator())
    assert torch.equal(out.tensors["p"], torch.tensor([4.0, -4.0])) and out.weight == 5


def test_scale_delta_in_a_run_boosts_the_uploaded_delta(tmp_path):
    got = {}
    for factor in (1.0, 4.0):
        cfg = _cfg("fedprompt", "tiny-bert", **{"method.transforms": f"[{{name: scale_delta, factor: {factor}}}]",
                                                 "federation.rounds": 1})
        exp = build_experiment(cfg)
        method = build_method(cfg, exp)
        inst = method.configure_round(method.server_init(), 1, [0])[0]
        got[factor] = method.client_update(inst, exp.client(0)).tensors["prompt"] - inst.tensors["prompt"]
    assert torch.allclose(got[4.0], 4 * got[1.0], atol=1e-5)


def _takes_transforms(preset: str) -> bool:
    """Its trainer uploads what the client-side transforms change (trained tensors)."""
    kind = TRAINERS.get(PRESETS.get(preset).method_defaults["trainer"]["name"]).kind
    return all(kind in TRANSFORMS.get(n).accepts for n in TRANSFORMS.names())


TRANSFORMABLE = [p for p in PRESETS.names() if _takes_transforms(p)]


def test_every_sharing_policy_is_in_a_preset_that_takes_transforms():
    used = {PRESETS.get(p).method_defaults["sharing"]["name"] for p in TRANSFORMABLE}
    assert set(SHARING.names()) <= used, f"no gradient preset uses {sorted(set(SHARING.names()) - used)}"


@pytest.mark.parametrize("preset", TRANSFORMABLE)
def test_client_transforms_see_the_start_of_what_each_client_uploads(preset, tmp_path, monkeypatch):
    """Every registered transform, chained, takes its delta from the start of each uploaded tensor in the shape it
    is uploaded in (cut to the client's LoRA rank, to its kept heads, FLoRA's fresh block), so no client fails."""
    seen: list[list[str]] = []
    for name in TRANSFORMS.names():
        def spy(self, update, start, round, generator, _apply=TRANSFORMS.get(name).apply):
            seen.append([k for k, v in update.tensors.items()
                         if v.is_floating_point() and (k not in start or start[k].shape != v.shape)])
            return _apply(self, update, start, round, generator)
        monkeypatch.setattr(TRANSFORMS.get(name), "apply", spy)
    chain = [{"name": n, **LEAST["transforms"][n]} for n in TRANSFORMS.names()]
    tiers = [{"name": "small", "share": 0.5, "rank": 2}, {"name": "large", "share": 0.5, "rank": 4}]
    ranked = SHARING.get(PRESETS.get(preset).method_defaults["sharing"]["name"]).ranked
    extra = {"method.adapter.r": 4, "federation.client_profiles": tiers} if ranked else {}
    _, recs = _run(tmp_path, "run", preset, **{"method.transforms": chain, "federation.rounds": 1, **extra})
    assert [c["status"] for c in recs[0]["clients"]] == ["ok"] * len(recs[0]["clients"])
    assert len(seen) == len(recs[0]["clients"]) * len(chain) and not any(seen), seen


# ---------------------------------------------------------------- device


def test_cpu_device_is_accepted_and_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    run_embedded(_cfg("fedprompt", "tiny-bert", **{"runtime.device": "cpu", "federation.rounds": 1}), tmp_path / "c")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="runtime.device: 'cuda'"):
            build_experiment(_cfg("fedprompt", "tiny-bert", **{"runtime.device": "cuda"}))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("preset", ["fedprompt", "fedpeptao", "fedbpt", "fedavg-full", "icl"])
def test_cuda_run_matches_cpu(preset, tmp_path):
    cpu = _run(tmp_path, "cpu", preset, **{"runtime.device": "cpu"})[1]
    gpu_summary, gpu = _run(tmp_path, "gpu", preset, **{"runtime.device": "cuda"})
    assert [r["bytes_up"] for r in gpu] == [r["bytes_up"] for r in cpu]  # the wire format does not change
    assert [r["loss"] for r in gpu] == pytest.approx([r["loss"] for r in cpu], rel=1e-3, abs=1e-4)
    assert gpu_summary["backbone_unchanged"]
    bf16 = _run(tmp_path, "bf16", preset, **{"runtime.device": "cuda", "runtime.autocast": "bfloat16"})[1]
    assert all(math.isfinite(r["loss"]) for r in bf16)


def test_uniform_selector_by_fraction(tmp_path):
    cfg = _cfg("fedprompt", "tiny-bert", **{"federation.num_clients": 5, "method.selector.fraction": 0.5,
                                             "task.num_examples": 120})
    _, recs = _run(tmp_path, "run", "fedprompt", **{"federation.num_clients": 5, "method.selector.fraction": 0.5,
                                                     "task.num_examples": 120})
    assert all(r["num_selected"] == 3 for r in recs) and cfg.method.selector.fraction == 0.5
