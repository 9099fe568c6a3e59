"""Generation speed as ratios measured in one run: fedpeft's LoRA SFT step against a bare PEFT + PyTorch loop on the
same batches (and that loop padded to ``max_length``: what dynamic padding saves), fedpeft's step with the batch's
rows packed into one sequence (``runtime.padding_free``) against its padded step, and fedpeft's batched greedy
decoding against HF ``generate`` on the merged model for LoRA, and on PEFT's own model (``get_peft_model`` with the
adapter's ``to_peft`` export) for the soft prompt and the deep prompt (same tokens).

The model has SmolLM2-135M's architecture (30 layers, d 576, 9 heads / 3 key-value heads, vocabulary 49,152) with
random weights: speed does not depend on the weight values, and the random model travels to a GPU machine that
cannot receive the real weights. ``python -m benchmarks.generation_perf [--device cuda] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import statistics
import time

import torch

from fedpeft.adapters import ADAPTERS, AdapterContext
from fedpeft.backbones.encoding import Encoded
from fedpeft.backbones.loading import Backbone, _freeze, load_backbone
from fedpeft.data.types import TaskData
from fedpeft.methods.fedit import LLAMA_LINEAR
from fedpeft.model import LanguageModel
from fedpeft.trainers.gradient import GradientSettings, train_local


def smollm2_shaped(device: str) -> Backbone:
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_backbone("tiny-llama").tokenizer
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                      tie_word_embeddings=True, pad_token_id=tok.pad_token_id, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    return Backbone("smollm2-shaped-random", _freeze(LlamaForCausalLM(cfg)), tok, "causal").to(device)


def batches(n: int, length: int, prompt: int, vocab: int, seed: int = 0) -> Encoded:
    import numpy as np

    g = np.random.default_rng(seed)
    lengths = g.integers(length // 2, length + 1, n)
    ids = [list(map(int, g.integers(1000, vocab, int(k)))) for k in lengths]
    starts = np.minimum(prompt, lengths - 1)
    return Encoded(ids, np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64), 0, starts.astype(np.int64))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def fedpeft_decoding(lm: LanguageModel, params, prompts: Encoded):
    """fedpeft's greedy decoding as ``run(new_tokens) -> new tokens per row``."""
    return lambda new_tokens: lm.generate(params, prompts, new_tokens, batch_size=16)


def hf_decoding(model, prompts: Encoded, pad_id: int, device: str, dtype):
    """HF ``generate`` (greedy, exactly ``new_tokens``) on the left-padded prompts as ``run(new_tokens)``."""
    width = max(len(r) for r in prompts.input_ids)
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in prompts.input_ids], device=device)
    mask = (torch.arange(width, device=device)[None] >= torch.tensor(
        [width - len(r) for r in prompts.input_ids], device=device)[:, None]).long()
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=pad_id)

    def run(new_tokens: int) -> list[list[int]]:
        with torch.no_grad(), torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype is not None):
            return model.generate(**kw, max_new_tokens=new_tokens, min_new_tokens=new_tokens)[:, width:].tolist()

    return run


def decoding_ratio(ours, theirs, reference: str, new_tokens: int, device: str, repeats: int = 3) -> dict:
    """Median seconds of each side over ``repeats`` alternating calls (after a 4-token warm-up of each), their
    ratio, and how many rows got the same tokens. Alternating keeps a shared machine's drift off the ratio (one
    call each once gave 1.6x for the deep prompt, alternating calls 1.0x). Every call's time is kept, in order: the
    first full-length call meets key lengths the warm-up did not, so a per-shape cost on the GPU (cuDNN attention
    builds a plan per new shape) shows as a slow first call of whichever side goes first."""
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    tokens = {}
    for run in (ours, theirs):
        run(4)
    for _ in range(repeats):
        for side, run in (("ours", ours), ("theirs", theirs)):
            sync(device)
            t = time.perf_counter()
            tokens[side] = run(new_tokens)
            sync(device)
            times[side].append(time.perf_counter() - t)
    ours_s, theirs_s = statistics.median(times["ours"]), statistics.median(times["theirs"])
    same = sum(x == y for x, y in zip(tokens["theirs"], tokens["ours"]))
    return {"fedpeft": ours_s, reference: theirs_s, "ratio": ours_s / theirs_s, "prompts": len(tokens["ours"]),
            "new_tokens": new_tokens, "repeats": repeats, "rows_with_same_tokens": same, "calls_s": times}



def step_ops(run, new_tokens: int) -> collections.Counter:
    """The ops one decoding step dispatches, by (op, the dtype, shape and contiguity of each tensor argument): the
    difference between decoding ``new_tokens + 1`` and ``new_tokens`` tokens."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            self.ops[(str(func), tuple((str(x.dtype), tuple(x.shape), x.is_contiguous())
                                        for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)))] += 1
            return func(*args, **kwargs)

    counts = []
    for n in (new_tokens, new_tokens + 1):
        with Log() as log:
            run(n)
        counts.append(log.ops)
    return counts[1] - counts[0]


def profile_decoding(sides: dict, new_tokens: int, device: str) -> dict:
    """Where each side's decoding step goes: aten calls per step (the difference between decoding 2 and
    2 + ``new_tokens`` tokens, divided), the profiler's table of the ops and kernels that took the most time
    (device time on a GPU), and the ops of one step that the sides do not share (``step_op_differences``: op and
    argument dtypes/shapes, with each side's count), to find why one side is slower."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    out: dict = {}
    steps = {}
    for side, run in sides.items():
        calls = []
        for n in (2, 2 + new_tokens):
            sync(device)
            with profile(activities=acts) as prof:
                run(n)
                sync(device)
            calls.append(sum(1 for e in prof.events() if e.name.startswith("aten::")))
        sort = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
        out[side] = {"aten_calls_per_step": (calls[1] - calls[0]) / new_tokens,
                     "top": prof.key_averages().table(sort_by=sort, row_limit=15)}
        steps[side] = step_ops(run, new_tokens)
    keys = sorted(set().union(*steps.values()))
    out["step_op_differences"] = [{"op": op, "args": [list(a) for a in args],
                                   **{side: steps[side][(op, args)] for side in steps}}
                                  for op, args in keys if len({steps[side][(op, args)] for side in steps}) > 1]
    return out

PROMPT_ADAPTERS = {"soft_prompt": {"num_tokens": 20, "position": "before_all"},  # the generation grid's settings
                   "deep_prompt": {"num_tokens": 5}}


def padding_free_ratio(lm: LanguageModel, params, data: Encoded, settings: GradientSettings, device: str,
                       repeats: int = 3) -> dict:
    """Seconds per step of fedpeft's training with the rows packed (``runtime.padding_free``) and padded, as
    medians of ``repeats`` alternating calls on the same batches, their ratio, and the share of pad tokens the
    padded batches held."""
    times: dict[bool, list[float]] = {False: [], True: []}
    losses = {}
    for _ in range(repeats):
        for free in (False, True):
            lm.padding_free = free
            sync(device)
            t = time.perf_counter()
            losses[free] = train_local(lm, params, data, "adamw", settings, torch.Generator().manual_seed(1)).mean_loss
            sync(device)
            times[free].append((time.perf_counter() - t) / settings.max_steps)
    lm.padding_free = False
    # the batches train_local drew: one permutation from the same generator (one pass over the data)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(1)).tolist()
    steps = [order[s * settings.batch_size:(s + 1) * settings.batch_size] for s in range(settings.max_steps)]
    lengths = [[len(data.input_ids[i]) for i in step] for step in steps]
    pads = sum(len(ls) * max(ls) - sum(ls) for ls in lengths) / sum(len(ls) * max(ls) for ls in lengths)
    padded, packed = statistics.median(times[False]), statistics.median(times[True])
    return {"padded": padded, "padding_free": packed, "ratio": packed / padded, "pad_share": pads,
            "mean_loss_padded": losses[False], "mean_loss_padding_free": losses[True], "repeats": repeats}


def prompt_decoding(name: str, bb: Backbone, device: str, length: int, new_tokens: int, autocast: str,
                    task: TaskData) -> dict:
    """fedpeft's decoding with a prompt adapter on ``bb`` (prompt adapters inject nothing into it) against PEFT's
    model of the same adapter (its ``to_peft`` export) on a copy of it, since PEFT's wrapper sets attributes on the
    model it wraps."""
    from peft import get_peft_model, set_peft_model_state_dict

    plain = copy.deepcopy(bb.model)
    entry = ADAPTERS.entry(name)
    adapter = entry.obj(entry.settings(**PROMPT_ADAPTERS[name]))
    adapter.bind(AdapterContext(0, task, "lm", bb))
    lm = LanguageModel(bb, adapter, task, length, length // 2, autocast)
    lm.end_id = -1  # decode exactly new-tokens tokens on both sides
    params = lm.init_params(torch.Generator().manual_seed(0))
    prompts = batches(16, length // 2, length, 30000, seed=2)
    prompts.response_start = None
    # rows of one length: PEFT's prompt-tuning generate drops HF's position ids, so a left-padded row's positions
    # count its pads there (fedpeft and HF generate skip them); unpadded rows must give the same tokens
    shortest = min(len(r) for r in prompts.input_ids)
    prompts.input_ids = [r[:shortest] for r in prompts.input_ids]
    peft_config, tensors = adapter.to_peft(bb, params, "CAUSAL_LM")
    model = get_peft_model(plain, peft_config).eval()
    set_peft_model_state_dict(model, {k: v.to(device) for k, v in tensors.items()})
    dtype = torch.bfloat16 if autocast == "bfloat16" else None
    return decoding_ratio(fedpeft_decoding(lm, params, prompts), hf_decoding(model, prompts, lm.pad_id, device, dtype),
                          "peft_model", new_tokens, device)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile-decoding", action="store_true", help="add where LoRA decoding's steps go, each side")
    a = ap.parse_args()
    bb = smollm2_shaped(a.device)
    base_copy = copy.deepcopy(bb.model)  # the bare loop's own model, before fedpeft injects its LoRA layers
    autocast = "bfloat16" if a.device.startswith("cuda") else "none"
    task = TaskData(name="perf", class_names=[], train=[], test=[], label_words=[], label_descriptions=[],
                    kind="generation")
    entry = ADAPTERS.entry("lora")
    lora = entry.obj(entry.settings(r=16, lora_alpha=32.0, target_modules=LLAMA_LINEAR))
    lora.bind(AdapterContext(0, task, "lm", bb))
    lm = LanguageModel(bb, lora, task, a.length, a.length // 2, autocast)
    data = batches(a.batch * a.steps, a.length, a.length // 2, 30000)
    params = lm.init_params(torch.Generator().manual_seed(0))
    settings = GradientSettings(lr=1e-4, batch_size=a.batch, max_steps=a.steps, local_epochs=1.0, grad_clip=1.0)
    # warm-up on every batch shape both sides will see (dynamic padding: each width is a new kernel shape)
    train_local(lm, params, data, "adamw", settings, torch.Generator().manual_seed(1))
    sync(a.device)
    t = time.perf_counter()
    res = train_local(lm, params, data, "adamw", settings, torch.Generator().manual_seed(1))
    sync(a.device)
    ours = (time.perf_counter() - t) / a.steps

    # the bare loop: PEFT's model, AdamW, the same batches in the same order, completion-only labels
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(base_copy, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LLAMA_LINEAR))
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(1))
    dtype = torch.bfloat16 if autocast == "bfloat16" else None

    def bare_step(idx, pad_to: int | None = None):
        b = lm.batch(data, idx.tolist())
        if pad_to is not None:  # padding to max_length instead of the batch's longest row
            extra = pad_to - b["input_ids"].shape[1]
            b["input_ids"] = torch.nn.functional.pad(b["input_ids"], (0, extra), value=lm.pad_id)
            b["attention_mask"] = torch.nn.functional.pad(b["attention_mask"], (0, extra))
        labels = torch.where(torch.arange(b["input_ids"].shape[1], device=lm.device)[None] >=
                             b["response_start"].to(lm.device)[:, None], b["input_ids"], -100)
        labels = labels.masked_fill(b["attention_mask"] == 0, -100)
        with torch.autocast(a.device.split(":")[0], dtype=dtype, enabled=dtype is not None):
            loss = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()

    for s in range(a.steps):  # warm-up, as above
        bare_step(order[s * a.batch:(s + 1) * a.batch])
        bare_step(order[s * a.batch:(s + 1) * a.batch], pad_to=a.length)
    sync(a.device)
    t = time.perf_counter()
    for s in range(a.steps):
        bare_step(order[s * a.batch:(s + 1) * a.batch])
    sync(a.device)
    bare = (time.perf_counter() - t) / a.steps
    t = time.perf_counter()
    for s in range(a.steps):
        bare_step(order[s * a.batch:(s + 1) * a.batch], pad_to=a.length)
    sync(a.device)
    padded = (time.perf_counter() - t) / a.steps

    # generation: fedpeft's greedy decoding against HF generate on the merged model, same tokens
    lm.end_id = -1  # decode exactly new-tokens tokens on both sides
    trained = {k: v.detach() for k, v in res.params.items()}
    prompts = batches(16, a.length // 2, a.length, 30000, seed=2)
    prompts.response_start = None
    state = {k: v for k, v in model.state_dict().items()}
    for k, v in trained.items():  # load fedpeft's trained tensors into PEFT's model, then merge
        state["base_model.model." + k.replace(".weight", ".default.weight")] = v.to(lm.device)
    model.load_state_dict(state)
    merged = model.merge_and_unload().eval()
    prompt_bb = smollm2_shaped(a.device)  # without the LoRA layers fedpeft injected into ``bb``
    out = {"device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
           "autocast": autocast, "batch": a.batch, "length": a.length, "steps": a.steps,
           "sft_step_s": {"fedpeft": ours, "bare_peft": bare, "ratio": ours / bare,
                          "bare_peft_padded_to_max_length": padded, "dynamic_padding_saves": 1 - bare / padded},
           "padding_free_step_s": padding_free_ratio(lm, params, data, settings, a.device),
           "generate_s": decoding_ratio(fedpeft_decoding(lm, trained, prompts),
                                        hf_decoding(merged, prompts, lm.pad_id, a.device, dtype), "hf_merged",
                                        a.new_tokens, a.device),
           "generate_prompts_s": {name: prompt_decoding(name, prompt_bb, a.device, a.length, a.new_tokens, autocast,
                                                        task) for name in PROMPT_ADAPTERS}}
    if a.device.startswith("cuda"):  # the same, with cuDNN attention (a plan built per new shape) out of the choice
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            out["generate_s_without_cudnn_attention"] = decoding_ratio(
                fedpeft_decoding(lm, trained, prompts), hf_decoding(merged, prompts, lm.pad_id, a.device, dtype),
                "hf_merged", a.new_tokens, a.device)
    if a.profile_decoding:
        out["decoding_profile"] = profile_decoding(
            {"fedpeft": fedpeft_decoding(lm, trained, prompts),
             "hf_merged": hf_decoding(merged, prompts, lm.pad_id, a.device, dtype)}, 8, a.device)
        for side, prof in out["decoding_profile"].items():
            if side != "step_op_differences":
                print(f"{side}: {prof['aten_calls_per_step']:.0f} aten calls per decoding step\n{prof['top']}")
        print("ops of one decoding step that the sides do not share:")
        for d in out["decoding_profile"]["step_op_differences"]:
            print(f"  {d['op']} fedpeft {d['fedpeft']} hf_merged {d['hf_merged']} {d['args']}")
    print(json.dumps(out, indent=1))
    if a.out:
        open(a.out, "w").write(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
