"""Generation tasks on a tiny random LLaMA: the completion-only loss mask, greedy decoding against a loop that
recomputes the whole sequence, learning on a memorisable set for every adapter, the forward-only fitness, the
text metrics against sacrebleu/rouge-score, an end-to-end run, ``fedpeft generate`` and the PEFT export."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedpeft.adapters import ADAPTERS, AdapterContext
from fedpeft.backbones.instruction_encoding import ALPACA_NO_INPUT, PromptFormat, end_token_id
from fedpeft.backbones.loading import load_backbone
from fedpeft.data.types import Example, TaskData
from fedpeft.model import LanguageModel
from fedpeft.model.blackbox import BlackBox
from fedpeft.model.language_model import IGNORE, response_labels
from fedpeft.text_metrics import text_metrics
from fedpeft.trainers.gradient import GradientSettings, train_local

ADAPTER_SETTINGS = {"lora": {"r": 4}, "soft_prompt": {"num_tokens": 4, "position": "before_all"},
                    "deep_prompt": {"num_tokens": 3}, "full": {}}
EXAMPLES = [Example("say hello", 0, None, target="hello world"),
            Example("count on", 0, "one two", target="three four five"),
            Example("name a colour", 0, None, target="green")]


def _task(prompt_template: str | None = None) -> TaskData:
    return TaskData(name="t", class_names=[], train=[], test=[], label_words=[], label_descriptions=[],
                    kind="generation", prompt_template=prompt_template)


def _lm(adapter: str, backbone=None, task: TaskData | None = None) -> LanguageModel:
    backbone = backbone or load_backbone("tiny-llama")
    task = task or _task()
    entry = ADAPTERS.entry(adapter)
    ad = entry.obj(entry.settings(**ADAPTER_SETTINGS[adapter]) if entry.settings else None)
    ad.bind(AdapterContext(0, task, "lm", backbone))
    return LanguageModel(backbone, ad, task, max_length=64, max_response_length=8)


def _trained_params(lm: LanguageModel, seed: int = 0) -> dict[str, torch.Tensor]:
    """Initial tensors moved off their starting point (LoRA's B = 0 would make the adapter a no-op)."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in lm.init_params(g).items()}


def test_loss_mask_covers_exactly_the_response_tokens() -> None:
    lm = _lm("lora")
    tok = lm.backbone.tokenizer
    enc = lm.encode(EXAMPLES)
    for i, ex in enumerate(EXAMPLES):
        response = tok(ex.target, add_special_tokens=False)["input_ids"] + [end_token_id(tok)]
        prompt = tok(ALPACA_NO_INPUT.split("{instruction}")[0], add_special_tokens=False)["input_ids"]
        ids = enc.input_ids[i]
        assert ids[int(enc.response_start[i]):] == response
        if ex.text_b is None:
            assert ids[1:1 + len(prompt)] == prompt  # after [CLS], the template's fixed text, untouched
    batch = lm.batch(enc, [0, 1, 2])
    labels = response_labels(batch)
    for i in range(3):
        kept = labels[i][labels[i] != IGNORE].tolist()
        assert kept == enc.input_ids[i][int(enc.response_start[i]):]
    scores = lm.outputs(lm.init_params(torch.Generator().manual_seed(0)), batch)
    assert len(scores.targets) == sum(len(r) - int(s) for r, s in zip(enc.input_ids, enc.response_start))


def test_chat_template_prompt_and_mask() -> None:
    base = load_backbone("tiny-llama")
    tok = copy.deepcopy(base.tokenizer)
    tok.chat_template = ("{% for m in messages %}<user> {{ m['content'] }} </user>{% endfor %}"
                         "{% if add_generation_prompt %} <bot> {% endif %}")
    backbone = dataclasses.replace(base, tokenizer=tok, cache={})
    fmt = PromptFormat.of(backbone, None)
    assert fmt.chat and fmt.lead == []
    ex = EXAMPLES[1]
    rendered = tok.apply_chat_template([{"role": "user", "content": "count on\n\none two"}],
                                       add_generation_prompt=True, tokenize=False)
    assert fmt.prompt_text(ex) == rendered
    lm = _lm("lora", backbone)
    enc = lm.encode([ex])
    start = int(enc.response_start[0])
    assert enc.input_ids[0][start:] == tok("three four five", add_special_tokens=False)["input_ids"] + [
        end_token_id(tok)]
    # a user's template wins over the chat template
    assert not PromptFormat.of(backbone, "Q: {instruction}\nA:").chat


def test_long_prompts_are_cut_to_fit_and_responses_at_their_limit() -> None:
    lm = _lm("lora")
    long = Example("word " * 200, 0, None, target="alpha beta gamma delta epsilon zeta eta theta iota kappa")
    enc = lm.encode([long])
    ids, start = enc.input_ids[0], int(enc.response_start[0])
    assert len(ids) == lm.max_length and len(ids) - start == lm.max_response_length
    assert enc.prompt_cut.tolist() == [True] and (enc.cuts.prompts, enc.cuts.responses) == (1, 1)
    with pytest.raises(ValueError, match="task.max_length"):
        LanguageModel(lm.backbone, lm.adapter, _task(), max_length=12, max_response_length=8).encode([long])


@pytest.mark.parametrize("truncation", ["keep_start", "keep_end"])
def test_a_long_structured_input_keeps_its_first_slot_by_default(truncation, caplog) -> None:
    """The default cut (keep_start) drops tokens at the end of the longest field, so a data-to-text input keeps
    the slot every reference mentions; keep_end (the cut before the setting existed) keeps the end. The cut is
    counted per field and warned about, naming the field and the setting."""
    task = dataclasses.replace(_task("Describe: {instruction} | {input}"), truncation=truncation)
    lm = _lm("lora", task=task)
    tok = lm.backbone.tokenizer
    slots = " | ".join(f"slot{i} value{i}" for i in range(40))
    ex = Example("the entry", 0, slots, target="slot0")
    with caplog.at_level("INFO", logger="fedpeft.backbones.instruction_encoding"):
        enc = lm.encode([ex, EXAMPLES[0]])
    prompt = tok.decode(enc.input_ids[0][:int(enc.response_start[0])])
    whole = tok.decode(enc.input_ids[1][:int(enc.response_start[1])])
    assert "the entry" in prompt and "say hello" in whole  # the short fields are kept whole
    first, last = "slot0 value0", "slot39 value39"
    assert (first in prompt, last in prompt) == ((True, False) if truncation == "keep_start" else (False, True))
    assert enc.prompt_cut.tolist() == [True, False] and enc.cuts.fields == {"input": 1}
    warning = [r for r in caplog.records if r.levelname == "WARNING"]  # 1 of 2 prompts: above 5 %
    assert len(warning) == 1 and "1 of 2 prompts (50%) cut at their " in warning[0].getMessage()
    assert "the input in 1" in warning[0].getMessage() and f"task.truncation {truncation}" in warning[0].getMessage()


def test_a_run_saved_before_the_truncation_setting_keeps_its_cut(tmp_path) -> None:
    """A generation run's config.yaml from before ``task.truncation`` existed is read with the cut it ran with
    (``keep_end``); a new config gets the default, and a classification config is left alone."""
    import yaml

    from fedpeft.config import dump_config
    from fedpeft.resolve import load_config

    for name, old in (("dolly", "keep_end"), ("bbc", "keep_start")):
        raw = yaml.safe_load(dump_config(load_config(None, [f"task.name={name}"])))
        raw["task"].pop("truncation")
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
        assert load_config(tmp_path / "config.yaml").task.truncation == old
    assert load_config(None, ["task.name=dolly"]).task.truncation == "keep_start"
    assert TaskData.from_spec(_task().spec() | {"truncation": "keep_start"}).truncation == "keep_start"
    spec = _task().spec()
    spec.pop("truncation")
    assert TaskData.from_spec(spec).truncation == "keep_end"


def _loop_greedy(lm: LanguageModel, params, prompt_ids: list[int], steps: int) -> list[int]:
    """Greedy decoding without a cache: the whole sequence through ``outputs``' forward each step."""
    ids, out = list(prompt_ids), []
    for _ in range(steps):
        batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                 "lead": lm.format and len(lm.format.lead)}
        res, prep, p = lm._forward(params, batch)
        if lm.backbone.body_and_head is not None:
            logits = lm._head_rows(res.last_hidden_state[:, -1], p)
        else:
            logits = res.logits[:, -1]
        nxt = int(logits.argmax(-1))
        if nxt == lm.end_id:
            break
        out.append(nxt)
        ids.append(nxt)
    return out


@pytest.mark.parametrize("adapter", ["lora", "soft_prompt", "deep_prompt"])
def test_batched_cached_generation_equals_a_full_recompute_loop(adapter: str) -> None:
    lm = _lm(adapter)
    params = _trained_params(lm)
    prompts = lm.encode_prompts(EXAMPLES)
    got = lm.generate(params, prompts, max_new_tokens=6, batch_size=3)
    want = [_loop_greedy(lm, params, prompts.input_ids[i], 6) for i in range(3)]
    assert got == want
    assert any(len(g) > 0 for g in got)


@pytest.fixture(scope="module")
def steerable():
    """A tiny random LLaMA with weights at std 0.2 (``tiny-llama`` has 0.02, whose near-uniform logits an adapter
    that leaves the LM head alone can hardly move within a few steps)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from fedpeft.backbones.loading import Backbone, _freeze

    tok = load_backbone("tiny-llama").tokenizer
    with torch.random.fork_rng():
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512,
                          pad_token_id=tok.pad_token_id, bos_token_id=None, eos_token_id=None, initializer_range=0.2)
        return Backbone("tiny-llama-steerable", _freeze(LlamaForCausalLM(cfg)), tok, "causal")


@pytest.mark.parametrize("adapter,lr", [("lora", 0.03), ("soft_prompt", 0.1), ("deep_prompt", 0.3), ("full", 0.01)])
def test_every_adapter_learns_a_memorisable_set(steerable, adapter: str, lr: float) -> None:
    lm = _lm(adapter, steerable)
    enc = lm.encode(EXAMPLES)
    params = lm.init_params(torch.Generator().manual_seed(0))
    before = lm.evaluate(params, enc)["loss"]
    res = train_local(lm, params, enc, "adam", GradientSettings(lr=lr, batch_size=3, max_steps=40, local_epochs=40),
                      torch.Generator().manual_seed(1))
    after = lm.evaluate(res.params, enc)
    assert after["loss"] < before - 2.5
    assert after["perplexity"] == pytest.approx(np.exp(after["loss"]))


def test_forward_only_fitness_stacks_candidates_like_one_at_a_time() -> None:
    lm = _lm("soft_prompt")
    enc = lm.encode(EXAMPLES)
    g = torch.Generator().manual_seed(3)
    prompts = torch.randn(4, 4, lm.backbone.hidden_size, generator=g) * 0.02
    box = BlackBox(lm, param_name="prompt", param_dims=2)
    stacked = box.sample_losses(prompts, enc)
    for c in range(4):
        one = box.sample_losses(prompts[c], enc)[0]
        assert torch.allclose(stacked[c], one, atol=1e-5)
        s = lm.outputs({"prompt": prompts[c]}, lm.batch(enc, [0, 1, 2]))
        assert torch.allclose(lm.example_losses(s), one, atol=1e-5)
    assert box.metrics(prompts[0], enc)["num_tokens"] == sum(len(r) - int(s) for r, s in
                                                              zip(enc.input_ids, enc.response_start))


def test_text_metrics_equal_sacrebleu_and_rouge_score() -> None:
    import sacrebleu
    from rouge_score.rouge_scorer import RougeScorer

    hyps = ["the cat sat on the mat", "a dog ran in the park today", "hello"]
    refs = [("the cat sat on the mat",), ("the dog ran in the park", "a dog was running in a park"), ("Hello ",)]
    m = text_metrics(hyps, refs)
    streams = [[r[0] for r in refs], [None, refs[1][1], None]]
    assert m["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, streams).score)
    assert m["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, streams).score)
    scorer = RougeScorer(["rougeL"], use_stemmer=True)
    rouge = [max(scorer.score(r, h)["rougeL"].fmeasure for r in rs) for h, rs in zip(hyps, refs)]
    assert m["rouge_l"] == pytest.approx(100 * np.mean(rouge))
    assert m["exact_match"] == pytest.approx(200 / 3)  # the first and the third (case and spaces folded)


def _write_task(folder: Path) -> None:
    words = ["apple", "river", "stone", "cloud", "green", "music"]
    rows = [{"instruction": f"Join {a} and {b}", "response": f"{a} {b}", "cat": f"c{i % 2}"}
            for i, (a, b) in enumerate((a, b) for a in words for b in words if a != b)]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:24]) + "\n")
    (folder / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows[24:30]) + "\n")


def _config(folder: Path, method: str = "fedit", **extra) -> dict:
    return {"seed": 0, "task": {"name": "jsonl", "path": str(folder), "response_column": "response",
                                "max_length": 64, "max_response_length": 8},
            "model": {"name": "tiny-llama"},
            "method": {"name": method, **extra},
            "federation": {"num_clients": 2, "rounds": 2, "partition": {"scheme": "by_column", "column": "cat"}},
            "evaluation": {"generate_every": 2, "max_new_tokens": 4, "generate_examples": 4, "show_examples": 2},
            "runtime": {"progress": False, "threads": 1}}


def test_every_reference_of_a_sample_is_recorded_not_just_the_first(monkeypatch) -> None:
    """metrics.jsonl's samples carry all of an entry's references (WebNLG has up to 7), as the scores use them."""
    import numpy as np

    from fedpeft import generation_eval
    from fedpeft.data.types import Example

    class Format:
        @staticmethod
        def prompt_text(e):
            return e.text_a

    class Objective:
        format = Format()

    examples = [Example("Join a b", 0, target="a b", references=("a b", "b a", "a and b")),
                Example("Join c d", 0, target="c d")]
    monkeypatch.setattr(generation_eval, "generations", lambda *a, **k: ["b a", "d c"])
    out = generation_eval.generation_metrics(Objective(), {}, examples, np.arange(2), set(), 4, 2, show=2)
    assert [s["references"] for s in out["samples"]] == [["a b", "b a", "a and b"], ["c d"]]
    assert out["exact_match"] == 50.0  # the second reference of the first entry matches


@pytest.mark.parametrize("extra", [
    {"sharing": {"name": "fedex"}},  # FedEx-LoRA's residual, folded into a causal LM's linear layers
    {"adapter": {"name": "lora_sb", "r": 4, "target_modules": ["all-linear"]}, "sharing": {"name": "fedsb"}},
], ids=["fedex", "fed-sb"])
def test_exact_lora_aggregation_runs_on_a_generation_task(tmp_path: Path, extra: dict) -> None:
    """FedEx-LoRA and Fed-SB on instruction tuning of a causal LM (``fedit`` with their stage, as the LoRA-family
    benchmark's WebNLG arms run them): every round's global update is the exact average, and the run is scored by
    its generations."""
    from fedpeft.resolve import resolve
    from fedpeft.runtime.embedded import run_embedded

    _write_task(tmp_path)
    out = tmp_path / "run"
    run_embedded(resolve(_config(tmp_path, trainer={"lr": 0.01}, **extra)), out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= r["server"]["aggregation_error"] <= 1e-6 for r in records[1:])
    assert {"bleu", "rouge_l"} <= set(records[-1]["generation"])


def test_generation_run_end_to_end_and_generate_uses_its_adapter(tmp_path: Path) -> None:
    from fedpeft.cli import app
    from fedpeft.predict import open_model
    from fedpeft.resolve import resolve
    from fedpeft.runtime.embedded import run_embedded
    from typer.testing import CliRunner

    _write_task(tmp_path)
    cfg = resolve(_config(tmp_path, trainer={"lr": 0.01}))
    out = tmp_path / "run"
    summary = run_embedded(cfg, out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last["loss"] < records[0]["loss"]
    assert set(last["by_group"]) == {"c0", "c1"}
    gen = last["generation"]
    assert {"bleu", "chrf", "rouge_l", "exact_match"} <= set(gen) and gen["num_generated"] == 4
    assert len(gen["samples"]) == 2 and "generation" not in records[1]  # generate_every 2: the last round only
    assert summary["final_accuracy"] == last["accuracy"]
    model = open_model(out)
    texts = model.generate(["Join apple and river"], max_new_tokens=4)
    result = CliRunner().invoke(app, ["generate", str(out), "--prompt", "Join apple and river",
                                      "--max-new-tokens", "4"])
    assert result.exit_code == 0, result.output
    assert texts[0] in result.output
    refused = CliRunner().invoke(app, ["generate", str(out)])
    assert refused.exit_code != 0 and "--prompt" in refused.output


def test_a_generation_run_leads_with_its_own_metrics_by_default(tmp_path: Path) -> None:
    """With the defaults a generation run decodes its final round: the console's table and final line, summary.json
    and ``compare`` lead with BLEU, chrF and ROUGE-L (next-token accuracy is no generation run's headline)."""
    import yaml
    from typer.testing import CliRunner

    from fedpeft.cli import app

    _write_task(tmp_path)
    raw = _config(tmp_path)
    del raw["evaluation"]["generate_every"]  # the default: the last round decodes
    (tmp_path / "gen.yaml").write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["run", str(tmp_path / "gen.yaml"), "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    final = summary["final_generation"]
    assert final["round"] == 2 and final["num_generated"] == 4 and {"bleu", "chrf", "rouge_l"} <= set(final)
    assert summary["final_perplexity"] > 1
    out = " ".join(res.output.split())
    assert "BLEU" in out and "perplexity" in out and "final accuracy" not in out
    assert f"final BLEU {final['bleu']:.1f}, chrF {final['chrf']:.1f}, ROUGE-L {final['rouge_l']:.1f}" in out
    res = CliRunner().invoke(app, ["compare", str(tmp_path / "run"), "--out", str(tmp_path / "c.html")])
    assert res.exit_code == 0, res.output
    html = (tmp_path / "c.html").read_text()
    assert "final BLEU" in html and "final perplexity" in html and "final accuracy" not in html


@pytest.mark.parametrize("adapter", ["lora", "soft_prompt", "deep_prompt"])
def test_peft_export_generates_the_same_tokens(tmp_path: Path, adapter: str) -> None:
    from peft import PeftModel

    from fedpeft.backbones.loading import _tiny
    from fedpeft.export import export_peft
    from fedpeft.predict import open_model
    from fedpeft.resolve import resolve
    from fedpeft.runtime.embedded import run_embedded

    _write_task(tmp_path)
    method = {"lora": {"name": "fedit", "trainer": {"lr": 0.0002}},
              "soft_prompt": {"name": "fedprompt", "adapter": {"num_tokens": 4, "position": "before_all"}},
              "deep_prompt": {"name": "fedavg-prefix", "adapter": {"num_tokens": 3}}}[adapter]
    cfg = resolve(_config(tmp_path) | {"method": method})
    out = tmp_path / "run"
    run_embedded(cfg, out)
    model = open_model(out)
    lm = model.objective
    lm.end_id = -1  # decode max_new_tokens tokens on both sides: the tiny model's first token is often its end token
    prompts = ["Join apple and river", "Join green and music please now"]
    enc = lm.encode_prompts([Example(p, 0) for p in prompts])
    ours = lm.generate({k: v.float() for k, v in model.params.items()}, enc, max_new_tokens=5)
    export_peft(out, tmp_path / "peft")
    fresh = _tiny("causal", "llama")
    fresh.model.save_pretrained(tmp_path / "base")  # before PEFT injects its layers into it
    peft_model = PeftModel.from_pretrained(fresh.model, tmp_path / "peft").eval()
    width = max(len(r) for r in enc.input_ids)
    ids = torch.tensor([[lm.pad_id] * (width - len(r)) + r for r in enc.input_ids])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in enc.input_ids])
    with torch.no_grad():
        gen = peft_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5,
                                  do_sample=False, pad_token_id=lm.pad_id)
    assert gen[:, width:].tolist() == ours
    assert len({t for row in ours for t in row}) > 1  # not one token repeated: the comparison means something
    # the other loader people use: AutoPeftModelForCausalLM reads the task type and the base model's folder
    from peft import AutoPeftModelForCausalLM

    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["task_type"] == "CAUSAL_LM"
    (tmp_path / "peft" / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path":
                                                                                str(tmp_path / "base")}))
    auto = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "peft").eval()
    with torch.no_grad():
        again = auto.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5,
                              do_sample=False, pad_token_id=lm.pad_id)
    assert again[:, width:].tolist() == ours


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("adapter", ["lora", "soft_prompt", "deep_prompt"])
def test_cuda_generation_matches_cpu_and_bf16_training_learns(steerable, adapter: str) -> None:
    lm_cpu = _lm(adapter, copy.deepcopy(steerable))
    params = _trained_params(lm_cpu)
    prompts = lm_cpu.encode_prompts(EXAMPLES)
    on_cpu = lm_cpu.generate(params, prompts, max_new_tokens=6)
    gpu_backbone = copy.deepcopy(steerable).to("cuda")
    lm_gpu = _lm(adapter, gpu_backbone)
    assert lm_gpu.generate(params, prompts, max_new_tokens=6) == on_cpu
    bf16 = LanguageModel(gpu_backbone, lm_gpu.adapter, lm_gpu.task, 64, 8, autocast="bfloat16")
    enc = bf16.encode(EXAMPLES)
    start = bf16.init_params(torch.Generator().manual_seed(0))
    before = bf16.evaluate(start, enc)["loss"]
    lr = {"lora": 0.03, "soft_prompt": 0.1, "deep_prompt": 0.3}[adapter]
    res = train_local(bf16, start, enc, "adam", GradientSettings(lr=lr, batch_size=3, max_steps=40, local_epochs=40),
                      torch.Generator().manual_seed(1))
    assert bf16.evaluate(res.params, enc)["loss"] < before - 2.5
    assert bf16.generate(res.params, bf16.encode_prompts(EXAMPLES), max_new_tokens=4) is not None


@pytest.mark.parametrize("override,field", [
    ({"model": {"name": "tiny-llama", "readout": "similarity"}}, "model.readout"),
    ({"model": {"name": "tiny-llama", "calibration": "contextual"}}, "model.calibration"),
    ({"runtime": {"client_batch": 2}}, "runtime.client_batch")])
def test_classification_settings_on_a_generation_task_fail_before_loading(tmp_path: Path, override, field) -> None:
    from fedpeft.config import ConfigError
    from fedpeft.resolve import resolve

    raw = _config(tmp_path)
    for k, v in override.items():
        raw[k] = raw.get(k, {}) | v
    with pytest.raises(ConfigError, match=field):
        resolve(raw)


def _strip(records):
    from fedpeft.tracking.summary import TIMING_FIELDS

    flower_only = ("flower_record_bytes", "model_loads")  # what only a Flower run records (test_flower.FLOWER_ONLY)
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS + flower_only} for r in records]


@pytest.mark.slow
def test_generation_resume_and_flower_sim_give_the_embedded_numbers(tmp_path: Path) -> None:
    from fedpeft.resolve import resolve
    from fedpeft.runtime.embedded import StopAfterRound, run_embedded
    from fedpeft.runtime.flower.simulation import run_flower_sim
    from fedpeft.tracking.rundir import RunDir

    _write_task(tmp_path)
    raw = _config(tmp_path, trainer={"lr": 0.01, "reset_optimizer": False})
    raw["federation"]["rounds"] = 3
    raw["evaluation"]["generate_every"] = 1
    cfg = resolve(raw)
    run_embedded(cfg, tmp_path / "full")
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=1)
    run_embedded(cfg, tmp_path / "cut", resume=True)
    full = _strip(RunDir(tmp_path / "full").read_metrics())
    assert _strip(RunDir(tmp_path / "cut").read_metrics()) == full
    run_flower_sim(cfg, tmp_path / "sim")
    assert _strip(RunDir(tmp_path / "sim").read_metrics()) == full  # losses, generations, bytes: bit for bit
    a = RunDir(tmp_path / "full").load_checkpoint()[1].tensors
    b = RunDir(tmp_path / "sim").load_checkpoint()[1].tensors
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_local_only_scores_each_clients_own_generations(tmp_path: Path) -> None:
    from fedpeft.resolve import resolve
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    _write_task(tmp_path)
    raw = _config(tmp_path, adapter={"name": "lora", "r": 2}, trainer={"name": "adamw", "lr": 0.01})
    raw["method"]["name"] = "local-only"
    cfg = resolve(raw)
    run_embedded(cfg, tmp_path / "run")
    last = RunDir(tmp_path / "run").read_metrics()[-1]
    assert set(last["local_generation"]) == {"0", "1"}
    assert all({"bleu", "chrf", "rouge_l", "exact_match"} <= set(g) for g in last["local_generation"].values())
    assert set(last["local_loss"]) == {"0", "1"}


@pytest.mark.parametrize("method,extra", [
    ("fedprompt", {}), ("fedavg-prefix", {"adapter": {"num_tokens": 3}}), ("fedpeptao", {"adapter": {"num_tokens": 3}}),
    ("headprune", {}), ("fedavg-full", {}), ("fedit", {"sharing": {"name": "ffa"}}),
    ("fedit", {"sharing": {"name": "fedsa"}}),
    ("fedbpt", {"adapter": {"num_tokens": 3, "intrinsic_dim": 16}, "trainer": {"iterations": 2}}),
    ("discrete-prompt", {"adapter": {"num_tokens": 3}, "trainer": {"steps": 3},
                         "post_tuning": {"iterations": 2, "popsize": 4, "intrinsic_dim": 8}})])
def test_every_method_runs_on_a_generation_task(tmp_path: Path, method: str, extra: dict) -> None:
    """Gradient, forward-only (response loss as the CMA-ES / search fitness) and head-pruned methods alike."""
    from fedpeft.resolve import resolve
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    _write_task(tmp_path)
    raw = _config(tmp_path, **extra)
    raw["method"]["name"] = method
    raw["federation"]["rounds"] = 1
    raw["evaluation"]["generate_every"] = 1
    run_embedded(resolve(raw), tmp_path / "run")
    last = RunDir(tmp_path / "run").read_metrics()[-1]
    assert last["num_ok"] == 2 and last["bytes_up"] > 0
    assert np.isfinite(last["loss"]) and last["generation"]["num_generated"] == 4


@pytest.mark.parametrize("method", ["hetlora", "flexlora", "flora"])
def test_clients_of_different_lora_ranks_tune_a_generative_model(tmp_path: Path, method: str) -> None:
    """Resource tiers on a generation task: each client uploads at its tier's rank, the global loss falls."""
    from fedpeft.resolve import resolve
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    _write_task(tmp_path)
    raw = _config(tmp_path, method, adapter={"r": 4, "lora_alpha": 8.0}, trainer={"lr": 0.01, "max_steps": 3})
    raw["federation"]["client_profiles"] = [{"name": "small", "share": 0.5, "rank": 1},
                                            {"name": "large", "share": 0.5, "rank": 4}]
    summary = run_embedded(resolve(raw), tmp_path / "run")
    records = RunDir(tmp_path / "run").read_metrics()
    tier_rank = {"small": 1, "large": 4}
    for c in records[-1]["clients"]:
        assert c["status"] == "ok" and 1 <= c["rank"] <= tier_rank[summary["client_tiers"][c["client"]]]
    assert records[-1]["loss"] < records[0]["loss"]


def test_predict_refuses_a_generation_run(tmp_path: Path) -> None:
    from fedpeft.cli import app
    from typer.testing import CliRunner

    _write_task(tmp_path)
    from fedpeft.resolve import resolve
    from fedpeft.runtime.embedded import run_embedded

    raw = _config(tmp_path)
    raw["federation"]["rounds"] = 1
    raw["evaluation"]["generate_every"] = 0
    run_embedded(resolve(raw), tmp_path / "run")
    res = CliRunner().invoke(app, ["predict", str(tmp_path / "run"), "--text", "hello"])
    assert res.exit_code != 0 and "fedpeft generate" in res.output


def test_quantization_is_refused_on_cpu_before_loading(tmp_path: Path) -> None:
    from fedpeft.config import ConfigError
    from fedpeft.resolve import resolve

    raw = _config(tmp_path)
    raw["model"]["quantization"] = "4bit"
    with pytest.raises(ConfigError, match="model.quantization: '4bit' quantizes with bitsandbytes on a CUDA GPU"):
        resolve(raw)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["4bit", "8bit"])
def test_qlora_trains_and_generates_on_cuda(tmp_path: Path, mode: str) -> None:
    pytest.importorskip("bitsandbytes")
    from fedpeft.resolve import resolve
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    _write_task(tmp_path)
    raw = _config(tmp_path, trainer={"lr": 0.01})
    raw["model"]["quantization"] = mode
    raw["runtime"] |= {"device": "cuda", "autocast": "bfloat16"}
    run_embedded(resolve(raw), tmp_path / "run")
    records = RunDir(tmp_path / "run").read_metrics()
    assert records[-1]["loss"] < records[0]["loss"] and records[-1]["generation"]["num_generated"] == 4


@pytest.mark.parametrize("adapter", ["lora", "soft_prompt"])
def test_gradient_checkpointing_gives_the_same_training(steerable, adapter: str) -> None:
    """Activation checkpointing recomputes the layers in the backward with the adapter's tensors still in place:
    the same losses and tensors as without it (up to float rounding)."""
    results, saved = [], []
    for checkpointing in (False, True):
        model = copy.deepcopy(steerable)
        lm = _lm(adapter, dataclasses.replace(model, cache={}))
        if checkpointing:
            lm.checkpoint_activations()
        enc = lm.encode(EXAMPLES)
        count = [0]

        def pack(t, count=count):
            count[0] += 1
            return t

        params = lm.init_params(torch.Generator().manual_seed(0))
        work = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        batch = lm.batch(enc, [0, 1, 2])
        with lm.held(work), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lm.loss(lm.outputs(work, batch), batch).backward()
        saved.append(count[0])
        res = train_local(lm, lm.init_params(torch.Generator().manual_seed(0)), enc, "adam",
                          GradientSettings(lr=0.05, batch_size=3, max_steps=5, local_epochs=5),
                          torch.Generator().manual_seed(1))
        results.append(res)
    plain, ckpt = results
    assert saved[1] < saved[0] / 2  # the layers kept their inputs only: their activations are recomputed
    assert ckpt.mean_loss == pytest.approx(plain.mean_loss, rel=1e-5)
    assert all(torch.allclose(plain.params[k], ckpt.params[k], atol=1e-5) for k in plain.params)
    assert any(not torch.equal(v, lm.init_params(torch.Generator().manual_seed(0))[k])
               for k, v in ckpt.params.items())


@pytest.mark.parametrize("adapter", ["lora", "full"])
def test_padding_free_packs_the_rows_and_gives_the_padded_training(steerable, adapter: str) -> None:
    """runtime.padding_free: the batch's rows of different lengths run as one sequence with no pad token, each row
    seeing only itself (a row's logits do not change when another row's tokens do); the same logits, loss,
    gradients and trained tensors as the padded batch, up to float rounding."""
    lm = _lm(adapter, dataclasses.replace(copy.deepcopy(steerable), cache={}))
    enc = lm.encode(EXAMPLES)
    batch = lm.batch(enc, [0, 1, 2])
    assert len(set(batch["lengths_cpu"].tolist())) > 1  # rows of different lengths: the padded batch has pads
    params = _trained_params(lm)
    shapes = []
    hook = lm.backbone.model.model.layers[0].register_forward_pre_hook(
        lambda m, args, kw: shapes.append(tuple((args[0] if args else kw["hidden_states"]).shape[:2])),
        with_kwargs=True)
    grads, scores = [], []
    for pack in (False, True):
        lm.padding_free = pack
        work = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        with lm.held(work):
            s = lm.outputs(work, batch)
            lm.loss(s, batch).backward()
        scores.append(s)
        grads.append({k: v.grad for k, v in work.items()})
    hook.remove()
    assert shapes == [tuple(batch["input_ids"].shape), (1, int(batch["lengths_cpu"].sum()))]
    assert lm.backbone.model.config._attn_implementation == "fedpeft_packed_sdpa"  # each row's slice on its own
    padded, packed = scores
    assert torch.equal(padded.targets, packed.targets) and torch.equal(padded.row, packed.row)
    assert torch.allclose(padded.logits, packed.logits, atol=1e-5)
    assert all(torch.allclose(grads[0][k], grads[1][k], atol=1e-6, rtol=1e-4) for k in grads[0])
    # each row attends to itself alone: another row's tokens leave its logits unchanged
    other = copy.deepcopy(enc)
    other.input_ids[1] = [(t + 7) % 1000 + 1000 for t in other.input_ids[1]]
    with torch.no_grad():
        moved = lm.outputs(params, lm.batch(other, [0, 1, 2]))
    last = packed.row == 2  # packed after row 1: causal attention alone would let it see row 1
    assert torch.allclose(moved.logits[last], packed.logits.detach()[last], atol=1e-6)
    assert not torch.allclose(moved.logits[packed.row == 1], packed.logits.detach()[packed.row == 1], atol=1e-3)
    results = []
    for pack in (False, True):
        lm.padding_free = pack
        results.append(train_local(lm, params, enc, "adam", GradientSettings(lr=0.01, batch_size=3, max_steps=4,
                                                                             local_epochs=4),
                                   torch.Generator().manual_seed(1)))
    assert results[1].mean_loss == pytest.approx(results[0].mean_loss, rel=1e-4)
    assert all(torch.allclose(results[0].params[k], results[1].params[k], atol=1e-4) for k in params)


def test_a_padding_free_run_trains_as_the_padded_run(tmp_path: Path) -> None:
    from fedpeft.resolve import resolve
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    _write_task(tmp_path)
    runs = []
    for free in (False, True):
        raw = _config(tmp_path, trainer={"lr": 0.01})
        raw["runtime"]["padding_free"] = free
        raw["evaluation"]["generate_every"] = 0
        run_embedded(resolve(raw), tmp_path / f"run{free}")
        runs.append(RunDir(tmp_path / f"run{free}").read_metrics())
    padded, packed = runs
    assert [r["train_loss"] for r in packed[1:]] == pytest.approx([r["train_loss"] for r in padded[1:]], rel=1e-4)
    assert [r["loss"] for r in packed] == pytest.approx([r["loss"] for r in padded], rel=1e-4)
    assert [r["bytes_up"] for r in packed] == [r["bytes_up"] for r in padded]


def test_padding_free_is_refused_where_rows_cannot_be_packed(tmp_path: Path) -> None:
    from fedpeft.config import ConfigError
    from fedpeft.resolve import resolve

    _write_task(tmp_path)
    raw = _config(tmp_path)
    raw["runtime"]["padding_free"] = True
    raw["method"]["adapter"] = {"name": "soft_prompt", "num_tokens": 4}
    with pytest.raises(ConfigError, match="runtime.padding_free: adapter 'soft_prompt' puts rows .* full, lora"):
        resolve(raw)
    with pytest.raises(ConfigError, match="runtime.padding_free: packs the training rows of a generation task"):
        resolve({"task": {"name": "sst2"}, "runtime": {"padding_free": True}})


def test_keep_best_selects_the_lowest_validation_loss_on_generation(tmp_path: Path) -> None:
    from fedpeft.resolve import resolve
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    _write_task(tmp_path)
    raw = _config(tmp_path, trainer={"lr": 0.01})
    raw["federation"]["rounds"] = 3
    raw["evaluation"] |= {"keep_best": True, "validation_fraction": 0.25, "generate_every": 0}
    summary = run_embedded(resolve(raw), tmp_path / "run")
    records = RunDir(tmp_path / "run").read_metrics()
    losses = {r["round"]: r["val_loss"] for r in records}
    assert summary["best_round"] == min(losses, key=lambda k: (losses[k], k))


def test_dry_run_counts_the_prompts_the_length_limit_cuts(tmp_path: Path) -> None:
    """``fedpeft run --dry-run`` says how many training and test prompts ``task.max_length`` cuts, which field lost
    tokens and at which end, before anything trains."""
    import yaml
    from typer.testing import CliRunner

    from fedpeft.cli import app

    _write_task(tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    for r in rows[:6]:  # a quarter of the training prompts far beyond task.max_length
        r["instruction"] = "Join " + " ".join(f"word{i}" for i in range(80))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "gen.yaml").write_text(yaml.safe_dump(_config(tmp_path)))
    res = CliRunner().invoke(app, ["run", str(tmp_path / "gen.yaml"), "--dry-run"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "train: 6 of 24 prompts (25%) cut at their end to fit task.max_length 64 (the instruction in 6; " \
           "task.truncation keep_start)" in out
    assert "test: no example cut" in out and "its prompt, then the response it learns" in out
