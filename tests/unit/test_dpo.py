"""Preference tasks and the ``dpo`` trainer on a tiny random LLaMA: the losses' equations, HH-RLHF dialogues and their
malformed pairs, the pair encoding, the frozen backbone as reference, equality with TRL's ``DPOTrainer`` (loss and
gradients, three loss types), and a federated run end to end (resumed bit-identically)."""

from __future__ import annotations

import copy
import gzip
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from fedpeft.adapters import ADAPTERS, AdapterContext
from fedpeft.adapters.lora import PEFT_PREFIX
from fedpeft.backbones.loading import _tiny, load_backbone
from fedpeft.backbones.preference_encoding import PairEncoded
from fedpeft.data.tasks.preference import SkippedPair, preference_pair, read_hh_file, split_dialogue
from fedpeft.data.types import Example, TaskData
from fedpeft.model import PreferenceModel
from fedpeft.model.preference import PairLogps
from fedpeft.trainers.dpo import DPOSettings, dpo_losses

PAIRS = [Example("say hello", 0, None, target="hello world", rejected="go away"),
         Example("count on", 0, None, target="three four five", rejected="seven",
                 history=(("user", "count to two"), ("assistant", "one two"))),
         Example("name a colour", 0, None, target="green", rejected="a very long answer about nothing at all")]


def _task() -> TaskData:
    return TaskData(name="t", class_names=[], train=[], test=[], label_words=[], label_descriptions=[],
                    kind="preference")


def _model(adapter: str = "lora", settings: dict | None = None, max_length: int = 64) -> PreferenceModel:
    backbone = load_backbone("tiny-llama")
    entry = ADAPTERS.entry(adapter)
    ad = entry.obj(entry.settings(**(settings or {"r": 4})) if entry.settings else None)
    ad.bind(AdapterContext(0, _task(), "lm", backbone))
    return PreferenceModel(backbone, ad, _task(), max_length=max_length, max_response_length=16)


def _moved(pm: PreferenceModel, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in pm.init_params(g).items()}


# ---------------------------------------------------------------- the equations


def _logps(c, r, tc=(1.0, 1.0), tr=(1.0, 1.0)) -> PairLogps:
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return PairLogps(t(c), t(r), t(tc), t(tr))


def test_losses_follow_their_equations() -> None:
    pol, ref = _logps([-2.0, -5.0], [-3.0, -4.0], (2.0, 4.0), (3.0, 1.0)), _logps([-2.5, -5.0], [-2.0, -4.5])
    beta, eps = 0.5, 0.2
    delta = np.array([(-2.0 + 2.5) - (-3.0 + 2.0), (-5.0 + 5.0) - (-4.0 + 4.5)])
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    np.testing.assert_allclose(dpo_losses(pol, ref, beta).numpy(), -np.log(sig(beta * delta)))
    np.testing.assert_allclose(dpo_losses(pol, ref, beta, "sigmoid", eps).numpy(),
                               -(1 - eps) * np.log(sig(beta * delta)) - eps * np.log(sig(-beta * delta)))
    np.testing.assert_allclose(dpo_losses(pol, ref, beta, "robust", eps).numpy(),
                               (-(1 - eps) * np.log(sig(beta * delta)) + eps * np.log(sig(-beta * delta)))
                               / (1 - 2 * eps))
    ipo = np.array([0.5 / 2 - (-1.0) / 3, 0.0 / 4 - 0.5 / 1]) - 1 / (2 * beta)
    np.testing.assert_allclose(dpo_losses(pol, ref, beta, "ipo").numpy(), ipo ** 2)
    assert dpo_losses(pol, pol, beta)[0].item() == pytest.approx(math.log(2))  # policy = reference


def test_ipo_refuses_label_smoothing() -> None:
    with pytest.raises(ValueError, match="label_smoothing"):
        DPOSettings(loss_type="ipo", label_smoothing=0.1)


# ---------------------------------------------------------------- data


def test_hh_dialogue_split_at_the_last_assistant_turn() -> None:
    text = "\n\nHuman: hi there\n\nAssistant: hello\n\nHuman: how are you?\n\nAssistant: fine, thanks"
    history, prompt, response = split_dialogue(text, "f line 1")
    assert history == (("user", "hi there"), ("assistant", "hello"))
    assert (prompt, response) == ("how are you?", "fine, thanks")
    ex = preference_pair(text, text.replace("fine, thanks", "go away"), "g", "f line 1")
    assert (ex.target, ex.rejected, ex.group, ex.history) == ("fine, thanks", "go away", "g", history)


def test_malformed_pairs_error_or_skip(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="f line 3: the dialogue has no assistant turn"):
        split_dialogue("\n\nHuman: only a question", "f line 3")
    same = "\n\nHuman: q\n\nAssistant: a"
    with pytest.raises(SkippedPair, match="identical"):
        preference_pair(same, same, None, "f line 1")
    with pytest.raises(SkippedPair, match="differ before"):
        preference_pair(same, "\n\nHuman: other\n\nAssistant: a", None, "f line 1")
    path = tmp_path / "test.jsonl.gz"
    rows = [{"chosen": same, "rejected": same + "!"}, {"chosen": same, "rejected": same}, {"chosen": same}]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ValueError, match=f"{path} line 3: a pair needs the keys 'chosen' and 'rejected'"):
        read_hh_file(path, "g", Counter())
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in rows[:2]))
    skipped: Counter = Counter()
    assert len(read_hh_file(path, "g", skipped)) == 1
    assert skipped == {"the chosen and rejected responses are identical": 1}


def test_pair_encoding_shares_the_prompt_and_drops_old_turns() -> None:
    pm = _model()
    enc = pm.encode(PAIRS)
    assert isinstance(enc, PairEncoded) and len(enc) == 3
    for i, ex in enumerate(PAIRS):
        s = int(enc.response_start[i])
        assert enc.input_ids[i][:s] == enc.rejected_ids[i][:s]
        tok = pm.backbone.tokenizer
        assert enc.input_ids[i][s:-1] == tok(ex.target, add_special_tokens=False)["input_ids"][:15]
    assert "count to two" in pm.format.prompt_text(PAIRS[1])  # the history is in the prompt
    short = _model(max_length=40).encode([PAIRS[1]])
    assert short.cuts.fields.get("history") == 1 and len(short.input_ids[0]) <= 40
    batch = pm.batch(enc, [0, 2])
    assert batch["input_ids"].shape[0] == 4  # chosen 0, 2, then rejected 0, 2
    assert batch["input_ids"][2, :len(enc.rejected_ids[0])].tolist() == enc.rejected_ids[0]


# ---------------------------------------------------------------- the reference


@pytest.mark.parametrize("adapter,settings", [("lora", {"r": 4}), ("soft_prompt", {"num_tokens": 3}),
                                              ("deep_prompt", {"num_tokens": 2})])
def test_reference_is_the_backbone_without_the_adapter(adapter: str, settings: dict) -> None:
    pm = _model(adapter, settings)
    enc = pm.encode(PAIRS)
    batch = pm.batch(enc, [0, 1, 2])
    hf = _tiny("causal", "llama").model  # a fresh copy of the backbone, nothing injected
    logp = torch.log_softmax(hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, -1)
    seqs = enc.sequences()
    rows = [0, 1, 2, 3, 4, 5]
    want = torch.tensor([sum(logp[j, t - 1, seqs.input_ids[i][t]].item()
                             for t in range(int(seqs.response_start[i]), len(seqs.input_ids[i])))
                         for j, i in zip(rows, [0, 1, 2, 3, 4, 5])])
    ref = pm.reference_logps(batch)
    torch.testing.assert_close(torch.cat([ref.chosen, ref.rejected]), want, atol=1e-5, rtol=1e-5)
    moved = pm.outputs(_moved(pm), batch)
    assert not torch.allclose(moved.chosen, ref.chosen)  # the adapter changes the policy, not the reference


# ---------------------------------------------------------------- TRL


@pytest.mark.parametrize("loss_type,eps,beta", [("sigmoid", 0.0, 0.3), ("ipo", 0.0, 0.5), ("robust", 0.2, 0.3)])
def test_loss_and_gradients_equal_trl(tmp_path: Path, loss_type: str, eps: float, beta: float) -> None:
    """fedpeft's DPO loss and its LoRA gradients equal TRL's DPOTrainer on the same batch, model and adapter, to
    1e-5 (TRL's fused LM head gives float32 log-probabilities even for a float64 model: that is the floor)."""
    from datasets import Dataset
    from peft import set_peft_model_state_dict
    from trl import DPOConfig, DPOTrainer

    pm = _model()
    params = {k: v.requires_grad_(True) for k, v in _moved(pm).items()}
    tok = copy.deepcopy(pm.backbone.tokenizer)
    tok.eos_token = "[SEP]"
    data = Dataset.from_dict({"prompt": ["say hello", "count on one two", "name a colour"],
                              "chosen": [" hello world", " three four five", " green"],
                              "rejected": [" go away", " seven", " a very long answer about nothing"]})
    peft_config, state = pm.adapter.to_peft(pm.backbone, {k: v.detach() for k, v in params.items()}, "CAUSAL_LM")
    args = DPOConfig(output_dir=str(tmp_path), beta=beta, loss_type=[loss_type], label_smoothing=eps,
                     per_device_train_batch_size=3, report_to="none", use_cpu=True, max_length=None)
    # a new adapter (TRL's reference: the adapter disabled), then set to fedpeft's tensors
    trainer = DPOTrainer(model=_tiny("causal", "llama").model, args=args, train_dataset=data, processing_class=tok,
                         peft_config=peft_config)
    set_peft_model_state_dict(trainer.model, state)
    rows = [trainer.train_dataset[i] for i in range(3)]
    batch = trainer.data_collator(rows)
    trl_loss = trainer.compute_loss(trainer.model, batch)
    trl_loss.backward()
    trl_grads = {n.replace(".default", ""): p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}

    enc = PairEncoded([r["prompt_ids"] + r["chosen_ids"] for r in rows], np.zeros(3, dtype=np.int64),
                      np.full(3, -1, dtype=np.int64), 0, np.array([len(r["prompt_ids"]) for r in rows]),
                      rejected_ids=[r["prompt_ids"] + r["rejected_ids"] for r in rows])
    ours_batch = pm.batch(enc, [0, 1, 2])
    ref = pm.reference_logps(ours_batch)
    loss = dpo_losses(pm.outputs(params, ours_batch), ref, beta, loss_type, eps).mean()
    loss.backward()
    assert abs(loss.item() - trl_loss.item()) <= 1e-5
    assert len(trl_grads) == len(params)
    scale = max(1.0, max(g.abs().max().item() for g in trl_grads.values()))  # float32 sums: relative to the largest
    for k, v in params.items():
        assert (v.grad - trl_grads[PEFT_PREFIX + k]).abs().max().item() <= 1e-5 * scale, k


# ---------------------------------------------------------------- a federated run


def _feddpo(tmp_path: Path, name: str, **extra):
    from conftest import tiny_overrides

    from fedpeft.resolve import load_config
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    over = {"task.name": "synthetic-preference", "task.num_examples": 120, "task.max_length": 48,
            "task.max_response_length": 8, "model.name": "tiny-llama", "method.name": "feddpo",
            "method.adapter.num_tokens": None, "method.adapter.r": 4, "method.trainer.lr": 5e-3,
            "method.trainer.max_steps": 4, "method.trainer.batch_size": 8, "federation.num_clients": 3,
            "federation.rounds": 3, "federation.partition.scheme": "by_column", "evaluation.round_zero": True}
    cfg = load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in (over | extra).items()}))
    run_embedded(cfg, tmp_path / name)
    return RunDir(tmp_path / name).read_metrics()


def test_feddpo_learns_the_preference_and_the_run_generates_and_exports(tmp_path: Path, one_thread) -> None:
    from fedpeft.export import export_peft
    from fedpeft.predict import open_model

    recs = _feddpo(tmp_path, "dpo")
    start, last = recs[0], recs[-1]
    assert start["round"] == 0 and start["accuracy"] == 0.5 and start["reward_margin"] == 0.0  # policy = reference
    assert last["accuracy"] > 0.8 and last["reward_margin"] > 0 and last["loss"] < start["loss"]
    assert set(last["by_group"]) == {"sports", "business", "science"}  # each natural client's pairs
    model = open_model(tmp_path / "dpo")
    assert len(model.generate(["please answer: apple river"], max_new_tokens=4)) == 1
    out, _ = export_peft(tmp_path / "dpo", tmp_path / "peft")
    assert (out / "adapter_model.safetensors").is_file()
    # the cached reference trains as the per-step one does (its numbers differ only in float rounding)
    cached = _feddpo(tmp_path, "cached", **{"method.trainer.reference": "cached"})
    assert abs(cached[-1]["accuracy"] - last["accuracy"]) <= 0.05
    assert cached[-1]["loss"] == pytest.approx(last["loss"], rel=1e-3)


def test_init_from_starts_where_the_earlier_run_ended(tmp_path: Path, one_thread) -> None:
    first = _feddpo(tmp_path, "first")
    again = _feddpo(tmp_path, "again", **{"method.init_from": str(tmp_path / "first"), "federation.rounds": 1})
    assert again[0]["round"] == 0 and again[0]["loss"] == pytest.approx(first[-1]["loss"], abs=1e-6)
    with pytest.raises(ValueError, match="method.init_from: .* does not fit"):
        _feddpo(tmp_path, "wrong", **{"method.init_from": str(tmp_path / "first"), "method.adapter.r": 2})


def test_compatibility_pairs_the_task_and_the_trainer(tiny_cfg) -> None:
    with pytest.raises(ValueError, match="method.trainer.name: 'dpo' learns from preference pairs"):
        tiny_cfg(method__name="feddpo", method__adapter__num_tokens=None)
    with pytest.raises(ValueError, match="method.trainer.name: task 'synthetic-preference' holds preference pairs"):
        tiny_cfg(task__name="synthetic-preference", model__name="tiny-llama", method__name="fedit",
                 method__adapter__num_tokens=None, task__max_length=48, task__max_response_length=8)


def test_round_suites_score_the_refusal_rate_every_round(tmp_path: Path, one_thread) -> None:
    from fedpeft.data.paths import shared_data_dir

    if shared_data_dir() is None or not (shared_data_dir() / "AdvBench").is_dir():
        pytest.skip("needs shared/data/AdvBench")
    recs = _feddpo(tmp_path, "suites", **{"federation.rounds": 1, "evaluation.round_suites":
                                          "[{name: advbench, limit: 3, settings: {max_new_tokens: 4}}]"})
    assert [sorted(r["suites"]) for r in recs] == [["advbench"], ["advbench"]]  # round 0 and round 1
    assert 0 <= recs[-1]["suites"]["advbench"]["harmless_rate"] <= 100


@pytest.mark.parametrize("extra", [
    {"method.adapter.name": "soft_prompt", "method.adapter.num_tokens": 3, "method.adapter.r": None},
    {"method.adapter.name": "deep_prompt", "method.adapter.num_tokens": 2, "method.adapter.r": None},
    {"method.adapter.target_modules": None, "method.sharing.name": "head_pruning",
     "method.aggregator.name": "head_weighted"},
    {"federation.secure_aggregation": "{num_shares: 3, reconstruction_threshold: 2}"},
    {"method.wrappers": "[{name: dp_fedavg, clip: 1.0, noise_multiplier: 0.1}]", "method.aggregator.name": "uniform"},
], ids=["soft_prompt", "deep_prompt", "head_pruned_lora", "secagg", "dp_fedavg"])
def test_dpo_trains_every_gradient_adapter_and_under_secagg_and_dp(tmp_path: Path, one_thread, extra) -> None:
    recs = _feddpo(tmp_path, "run", **{"federation.rounds": 2, "evaluation.round_zero": False} | extra)
    assert [r["num_ok"] for r in recs] == [3, 3] and recs[-1]["reward_margin"] != 0.0


@pytest.mark.slow
def test_feddpo_on_flower_sim_equals_embedded(tmp_path: Path) -> None:
    pytest.importorskip("flwr")
    from conftest import tiny_overrides

    from fedpeft.resolve import load_config
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.runtime.flower.simulation import run_flower_sim
    from fedpeft.tracking.rundir import RunDir
    from fedpeft.tracking.summary import TIMING_FIELDS

    over = {"task.name": "synthetic-preference", "task.num_examples": 60, "task.max_length": 48,
            "task.max_response_length": 8, "model.name": "tiny-llama", "method.name": "feddpo",
            "method.adapter.num_tokens": None, "method.adapter.r": 4, "method.trainer.max_steps": 2,
            "federation.num_clients": 2, "federation.rounds": 1, "runtime.threads": 1}
    cfg = load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in over.items()}))
    run_embedded(cfg, tmp_path / "embedded")
    run_flower_sim(cfg, tmp_path / "sim")
    drop = TIMING_FIELDS + ("flower_record_bytes", "model_loads")
    emb, sim = (RunDir(tmp_path / n).read_metrics() for n in ("embedded", "sim"))
    assert [{k: v for k, v in r.items() if k not in drop} for r in sim] == \
        [{k: v for k, v in r.items() if k not in drop} for r in emb]


def test_a_preference_file_task_reads_pairs_or_dialogues_and_names_bad_rows(tmp_path: Path) -> None:
    from fedpeft.config import ConfigError, TaskConfig
    from fedpeft.data.tasks import load_task

    rows = [{"prompt": f"q{i}", "good": f"yes {i}", "bad": f"no {i}", "who": "ab"[i % 2]} for i in range(10)]
    rows.append({"prompt": "same", "good": "x", "bad": "x", "who": "a"})  # no preference: skipped
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = dict(name="jsonl", path=str(tmp_path / "pairs.jsonl"), instruction_column="prompt",
               response_column="good", rejected_column="bad")
    task = load_task(TaskConfig(**cfg), 0, "who")
    assert task.kind == "preference" and len(task.train) + len(task.test) == 10
    assert json.loads(task.info["skipped"]) == {"the chosen and rejected responses are identical": 1}
    ex = task.train[0]
    assert ex.target.startswith("yes") and ex.rejected.startswith("no") and ex.group in ("a", "b")
    dialogues = [{"chosen": "\n\nHuman: hi\n\nAssistant: hello", "rejected": "\n\nHuman: hi\n\nAssistant: go"}] * 6
    (tmp_path / "hh.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dialogues))
    task = load_task(TaskConfig(name="jsonl", path=str(tmp_path / "hh.jsonl"), response_column="chosen",
                                rejected_column="rejected"), 0)
    assert {(e.text_a, e.target, e.rejected) for e in task.train} == {("hi", "hello", "go")}
    (tmp_path / "bad.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps({"prompt": "q", "good": "a"}) + "\n")
    with pytest.raises(ConfigError, match=r"task.rejected_column: .*bad.jsonl line 2 has no value for 'bad'"):
        load_task(TaskConfig(**cfg | {"path": str(tmp_path / "bad.jsonl")}), 0)
