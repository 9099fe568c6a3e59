"""FedKSeed (``zhenqincn/FedKSeed`` @ ``AUTHORS_COMMIT``, ``main.py``) run offline on CPU on SmolLM2-135M-Instruct
with Dolly-15K (their own loader) or GLUE SST-2 / RTE (from the local TSVs), their files unchanged: this launcher
makes the substitutions below at import time, then runs ``main.py`` as ``__main__`` with their README's FedKSeed
Dolly recipe (``--rounds 60 --iid dir0.5 --num_clients 200 --lr 0.0000003 -K 1024 -m 0.05 --log``, with their
defaults ``--local_step 200 --batch_size 1 --zo_eps 0.0005`` spelled out; the README's ``--use_prompts`` is left
out: it takes a value in their parser, so ``--use_prompts --dataset ...`` is an argparse error, and its default
``True`` is what it means), every option overridable, and writes ``<out>/fedkseed.json``: their options, every
evaluation (their metric; for SST-2 / RTE also the verbalizer accuracy as an exact count), per-client-round and
per-round seconds, and the traffic their protocol sends (their code counts no bytes; see ``traffic``).

The substitutions:

1. model: ``--model`` is fedpeft's float32 copy of SmolLM2-135M-Instruct (the folder ``zo_decomfl_anchor``'s
   ``smollm2_folder`` gives; the weights fedpeft's own runs use); their ``AutoTokenizer`` / ``AutoModelForCausalLM``
   ``from_pretrained`` calls load it unchanged (its pad, eos, bos and unk tokens are all set, so their
   ``DefaultToken`` additions do not fire; pad = eos = ``<|im_end|>``);
2. dtype: ``server.py`` loads the model with ``torch_dtype=torch.float16``; its ``AutoModelForCausalLM`` name is a
   shim whose ``from_pretrained`` passes ``torch_dtype=torch.float32`` instead, every other argument unchanged
   (``device_map='cpu'``, ``trust_remote_code=True``), so the model, its ``model_w0`` copy and every perturbation
   ``z`` are float32;
3. device: their code is CUDA-only through ``torch.device(f'cuda:{args.device}')`` (``Server`` / ``Client``) and
   ``.to(self.device)``, plus ``torch.cuda.empty_cache`` / ``max_memory_allocated`` / ``max_memory_reserved`` in
   ``client.py`` (it calls no ``.cuda()``); the ``torch`` name of ``server.py`` and ``client.py`` (bound by their
   ``from optimizers.mezo_optimizer import *``) is a proxy of torch whose ``device('cuda...')`` is the CPU and
   whose ``cuda`` memory calls are no-ops answering 0 (so their ``memory.json`` records 0 bytes, under the key
   ``null``); every other ``torch`` attribute is torch's own; ``main.py``'s own ``torch.cuda.manual_seed_all`` and
   ``CUDA_VISIBLE_DEVICES`` work on a CPU build untouched;
4. data, ``dolly``: their ``LLMDataset`` reads ``data/databricks-dolly-15k.jsonl`` relative to the working
   directory; ``main.py`` runs with the cwd ``<out>/work``, whose ``data/databricks-dolly-15k.jsonl`` is a converted
   copy of the shared ``Dolly/dolly15k.jsonl`` (the same 15,011 records, reassembled from the FedIT split: its keys
   ``input`` / ``output`` renamed to Dolly's ``context`` / ``response``, ``instruction`` and ``category`` kept, the
   other keys dropped, in the shared file's order, sorted by (category, sha1), since Dolly's own order is not
   recoverable); their loader, alpaca-style template, subsampling, ``--zerotask`` held-out category and Dirichlet
   split are unchanged;
5. data, ``sst2`` / ``rte``: their ``--dataset`` choices (``instruct``, ``dolly``) gain ``sst2`` and ``rte``
   (``argparse.ArgumentParser.add_argument`` is wrapped while ``main.py`` runs, only for that option), and
   ``utils_data.load_data.get_loaders`` (the name ``main.py`` imports) is replaced for those two datasets only
   (``dolly`` / ``instruct`` go to theirs): the tokenizer is made as theirs makes it, each example of
   ``SST-2/{train,dev}.tsv`` / ``RTE/{train,dev}.tsv`` becomes an (instruction, response) pair with DeComFL's prompt
   as the source (SST-2 ``f"{sentence.strip()} It was"``, response `` bad`` / `` good`` for 0 / 1; RTE
   ``f'{premise}\\nDoes this mean that "{hypothesis}" is true? Yes or No?\\n'``, response ``Yes`` / ``No`` for
   entailment / not_entailment) and NO template (their ``--use_prompts`` alpaca wrapper is not applied: the raw
   prompt, as fedpeft and DeComFL score it), the response is the label word alone (no eos; ``--glue-eos`` appends
   ``tokenizer.eos_token`` as their Dolly targets do), tokenized and masked by their own
   ``LLMDataset.preprocess`` (``utils_data/llm_dataset.py``: loss on the response tokens only; generation form for a
   non-``loss`` eval metric) and collated by their ``LLMDataCollator``; the clients are their Dolly split applied to
   the GLUE labels (``partition_idx_labeldir`` for ``--iid dir{alpha}`` with ``num_classes`` = the labels present,
   else their equal-size ``random_split``), one shuffled ``DataLoader`` of ``--batch_size`` per client,
   ``--num_clients`` clients; the eval loader is the whole dev set (``--max-dev N``: its first N rows;
   ``--max-train N``: N training rows drawn by ``numpy.random.RandomState(--seed)``, leaving their global RNG
   alone); with ``only_eval`` (their final re-load) the training loaders are skipped, as their
   Natural-Instructions loader does;
6. eval metric, ``sst2`` / ``rte``: the launcher passes ``--eval_metric loss`` (overridable): their default
   ``rouge`` would make the final evaluation a ROUGE-L of 128 greedily generated tokens against the label word;
7. imports: their ``evaluations.py`` needs ``rouge`` (``rouge==1.0.1`` in their requirements), not a fedpeft
   dependency: it is taken from ``--deps`` (default ``<checkout>/../deps``), made with
   ``pip install --no-deps --target runs/fedkseed/deps rouge==1.0.1``;
8. the seed: ``--seed`` is passed to their ``--seed`` (their ``setup_seed`` seeds torch, numpy and ``random``;
   their default would be 42); nothing else is seeded.

Instrumentation only (results unchanged): ``Server.__init__`` / ``aggregate_seed_pool`` /
``update_global_model_by_seed_pool`` / ``eval``, ``Client.local_train_with_seed_pool`` and the two optimizers'
``zo_step`` / ``zo_forward`` are wrapped to time them and record what they return, which seed each step drew, and
what a client pulls and sends (the ``zo_step`` wrapper clears ``projected_grad`` first, to tell an applied step
from an early return: their step sets it before any use); for ``sst2`` / ``rte`` the ``eval`` wrapper also scores
the verbalizer accuracy of the global model (round 0 and the final evaluation; every evaluation with
``--acc-evals all``) on the eval prompts, with its own forwards (``verbalizer_accuracy``).

    python -m benchmarks.zo_fedkseed_anchor runs/fedkseed/checkout --out runs/fedkseed/sst2_s0 --task sst2 --seed 0 \
        --num_clients 3 -m 0.67 --rounds 1 --local_step 2 -K 64 --max-dev 32 --max-train 300 [... any FedKSeed option]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import runpy
import sys
import time
import types
from pathlib import Path

from benchmarks.zo_decomfl_anchor import read_tsv, smollm2_folder, tee

AUTHORS_REPO = "zhenqincn/FedKSeed"
AUTHORS_COMMIT = "ebf8216"
TASKS = {"sst2": "SST-2", "rte": "RTE"}  # their --dataset value -> local GLUE folder
LABEL_WORDS = {"sst2": [" bad", " good"], "rte": ["Yes", "No"]}  # class 0, class 1 (DeComFL's verbalizers)
README_RECIPE = {"--rounds": "60", "--iid": "dir0.5", "--num_clients": "200", "--lr": "0.0000003", "-K": "1024",
                 "-m": "0.05", "--local_step": "200", "--batch_size": "1", "--zo_eps": "0.0005"}
README_FLAGS = ["--log"]
DOLLY_FILE = "databricks-dolly-15k.jsonl"
SEED_BYTES = 8  # a candidate seed as a 64-bit integer (theirs are numpy int64 in [1, 10^11))
SCALAR_BYTES = 4  # a scalar gradient as float32 (their code keeps Python floats)


def glue_prompt(task: str, row: dict[str, str]) -> tuple[str, int]:
    """DeComFL's prompt and the class index (0 / 1) of one TSV row."""
    if task == "sst2":
        return f"{row['sentence'].strip()} It was", int(row["label"])
    premise, hypothesis = row["sentence1"], row["sentence2"]
    label = {"entailment": 0, "not_entailment": 1}[row["label"]]
    return f'{premise}\nDoes this mean that "{hypothesis}" is true? Yes or No?\n', label


def glue_rows(task: str, data: Path, split: str, limit: int | None, seed: int | None) -> list[tuple[str, int]]:
    """(prompt, label) of ``split``: all rows, or ``limit`` of them (the first ones for dev; for train a draw
    by ``RandomState(seed)``, kept in file order)."""
    rows = [glue_prompt(task, r) for r in read_tsv(data / TASKS[task] / f"{split}.tsv")]
    if limit is None or limit >= len(rows):
        return rows
    if seed is None:
        return rows[:limit]
    import numpy as np

    keep = np.sort(np.random.RandomState(seed).choice(len(rows), limit, replace=False))
    return [rows[i] for i in keep]


def their_tokenizer(args):
    """The tokenizer exactly as their ``get_loaders`` makes it."""
    from transformers import AutoTokenizer
    from utils_data.default_tokens import DefaultToken

    tokenizer = AutoTokenizer.from_pretrained(args.model, use_fast=True)
    tokenizer.model_max_length = args.max_length
    special_tokens = dict()
    for key, token in (("pad_token", DefaultToken.PAD_TOKEN), ("eos_token", DefaultToken.EOS_TOKEN),
                       ("bos_token", DefaultToken.BOS_TOKEN), ("unk_token", DefaultToken.UNK_TOKEN)):
        if getattr(tokenizer, key) is None:
            special_tokens[key] = token.value
    tokenizer.add_special_tokens(special_tokens)
    return tokenizer


def glue_dataset(rows, task: str, tokenizer, generation: bool, eos: bool):
    """Their Dolly ``LLMDataset`` filled with GLUE pairs: sources = the raw prompts, targets = the label words,
    through their ``preprocess`` (``categories`` = the class index, as their Dolly items carry their category)."""
    from torch.utils.data import Dataset
    from utils_data.llm_dataset import LLMDataset

    ds = LLMDataset.__new__(LLMDataset)
    Dataset.__init__(ds)
    sources = [p for p, _ in rows]
    targets = [LABEL_WORDS[task][y] + (tokenizer.eos_token if eos else "") for _, y in rows]
    d = ds.preprocess(sources, targets, tokenizer, generation=generation)
    ds.input_ids, ds.labels, ds.categories = d["input_ids"], d["labels"], [y for _, y in rows]
    return ds


def local_get_loaders(task: str, data: Path, opts, rec: "Record", original):
    """Substitution 5: ``get_loaders(args, only_eval)`` for ``--dataset sst2|rte``; theirs for any other."""

    def get_loaders(args, only_eval=False):
        if args.dataset not in TASKS:
            return original(args, only_eval=only_eval)
        import numpy as np
        import torch
        from collections import Counter
        from torch.utils.data import DataLoader, Subset
        from utils_data.llm_dataset import LLMDataCollator
        from utils_data.partition_data import partition_idx_labeldir

        tokenizer = their_tokenizer(args)
        collator = LLMDataCollator(tokenizer=tokenizer)
        dev = glue_rows(task, data, "dev", opts.max_dev, None)
        eval_set = glue_dataset(dev, task, tokenizer, generation=args.eval_metric != "loss", eos=opts.glue_eos)
        rec.dev_rows = dev
        rec.dev_check = target_check(eval_set, dev, task, tokenizer)
        eval_loader = DataLoader(eval_set, batch_size=args.batch_size, collate_fn=collator)
        if only_eval:
            return [], eval_loader, tokenizer
        train = glue_rows(task, data, "train", opts.max_train, opts.seed)
        train_set = glue_dataset(train, task, tokenizer, generation=False, eos=opts.glue_eos)
        rec.train_check = target_check(train_set, train, task, tokenizer)
        y_train = np.array([y for _, y in train])
        if "dir" in args.iid:  # their Dolly branch, on the GLUE labels
            split = partition_idx_labeldir(y_train, n_parties=args.num_clients, alpha=float(args.iid[3:]),
                                           num_classes=len(Counter(y_train)))
            subsets = [Subset(train_set, indices=idx) for _, idx in split.items()]
        else:
            n_parts = [int(len(train_set) / args.num_clients) for _ in range(args.num_clients - 1)]
            n_parts.append(len(train_set) - sum(n_parts))
            subsets = torch.utils.data.dataset.random_split(train_set, n_parts)
        rec.partition = [{"client": i, "examples": len(s), "labels": dict(Counter(int(y_train[j]) for j in s.indices))}
                         for i, s in enumerate(subsets)]
        loaders = [DataLoader(s, shuffle=True, batch_size=args.batch_size, collate_fn=collator) for s in subsets]
        return loaders, eval_loader, tokenizer

    return get_loaders


def target_check(ds, rows, task: str, tokenizer) -> dict:
    """How many examples have a first response token (in their tokenization of prompt + word) that is not the
    verbalizer id ``tokenizer.encode(word)[-1]`` of their class (loss-form datasets only)."""
    ids = [tokenizer.encode(w)[-1] for w in LABEL_WORDS[task]]
    bad = lengths = 0
    for i, (_, y) in enumerate(rows):
        labels = ds.labels[i]
        kept = (labels != -100).nonzero()
        if len(kept) == 0 or int(labels[kept[0, 0]]) != ids[y]:
            bad += 1
        lengths = max(lengths, len(ds.input_ids[i]))
    return {"examples": len(rows), "first_target_token_not_the_verbalizer": bad, "longest_tokens": lengths}


def dolly_workdir(shared: Path, work: Path) -> dict:
    """Substitution 4: ``<work>/data/databricks-dolly-15k.jsonl`` in Dolly's own keys, from the shared file."""
    (work / "data").mkdir(parents=True, exist_ok=True)
    src, dst = shared / "Dolly" / "dolly15k.jsonl", work / "data" / DOLLY_FILE
    lines, cats = [], set()
    for line in src.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        cats.add(r["category"])
        lines.append(json.dumps({"instruction": r["instruction"], "context": r["input"], "response": r["output"],
                                 "category": r["category"]}, ensure_ascii=False))
    dst.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"source": str(src), "file": str(dst), "records": len(lines),
            "category_codes": dict(enumerate(sorted(cats)))}  # pandas.Categorical codes, as their loader uses


class _CpuCuda(types.SimpleNamespace):
    """Substitution 3: the ``torch.cuda`` their ``client.py`` calls, on a CPU."""

    def __getattr__(self, name):
        import torch

        return getattr(torch.cuda, name)

    @staticmethod
    def empty_cache():
        return None

    @staticmethod
    def max_memory_allocated(device=None):
        return 0

    @staticmethod
    def max_memory_reserved(device=None):
        return 0


class _CpuTorch(types.ModuleType):
    """Substitution 3: ``torch`` as their ``server.py`` / ``client.py`` see it: ``device('cuda:N')`` is the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _CpuCuda()

    def __getattr__(self, name):
        import torch

        return getattr(torch, name)

    @staticmethod
    def device(*args, **kwargs):
        import torch

        if args and str(args[0]).startswith("cuda"):
            return torch.device("cpu")
        return torch.device(*args, **kwargs)


class Record:
    """What the instrumentation sees: steps, client rounds, server rounds, evaluations."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.client_rounds: list[dict] = []
        self.server_rounds: list[dict] = []
        self.evals: list[dict] = []
        self.forwards = 0
        self.server = None
        self.last_pull: dict[int, list[float]] = {}  # client -> server.seed_pool values when it last pulled
        self.dev_rows: list = []
        self.dev_check = self.train_check = None
        self.partition: list[dict] = []


def state_bytes(model) -> int:
    """Bytes of a model's distinct parameters and buffers (what ``deepcopy`` duplicates)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def verbalizer_accuracy(model, tokenizer, rows, task: str) -> dict:
    """Accuracy of ``model`` on (prompt, label) rows: logits at the last prompt token, argmax over the two label
    words' ids ``tokenizer.encode(word)[-1]`` (DeComFL's convention; ties -> class 0)."""
    import torch

    ids = [tokenizer.encode(w)[-1] for w in LABEL_WORDS[task]]
    was_training, preds, correct = model.training, [], 0
    model.eval()
    with torch.inference_mode():
        for prompt, y in rows:
            x = tokenizer(prompt, return_tensors="pt", max_length=tokenizer.model_max_length, truncation=True)
            logits = model(input_ids=x.input_ids).logits[0, -1, ids]
            pred = int(logits[1] > logits[0])
            preds.append(pred)
            correct += int(pred == y)
    model.train(was_training)
    return {"verbalizer_accuracy": correct / max(len(rows), 1), "verbalizer_correct": correct,
            "verbalizer_total": len(rows), "verbalizer_ids": ids, "predictions": preds}


def _patch(checkout: Path, deps: Path | None, task: str, data: Path, opts, rec: Record) -> None:
    """The substitutions of the module doc (and the recording wrappers), before ``main.py`` runs."""
    if deps is not None and deps.is_dir():
        sys.path.insert(0, str(deps))  # 7
    sys.path.insert(0, str(checkout))
    import torch
    import client as client_mod
    import optimizers.mezo_bias_optimizer as bias_mod
    import optimizers.mezo_optimizer as mezo_mod
    import server as server_mod
    import utils_data.load_data as load_mod

    for mod in (client_mod, server_mod, load_mod, mezo_mod):
        if not Path(mod.__file__).resolve().is_relative_to(checkout):
            raise RuntimeError(f"{mod.__name__} imported from {mod.__file__}, not from {checkout}")
    cpu_torch = _CpuTorch()  # 3
    client_mod.torch = server_mod.torch = cpu_torch
    auto = server_mod.AutoModelForCausalLM

    class Float32CausalLM:  # 2
        @staticmethod
        def from_pretrained(*args, **kwargs):
            kwargs["torch_dtype"] = torch.float32
            return auto.from_pretrained(*args, **kwargs)

    server_mod.AutoModelForCausalLM = Float32CausalLM
    load_mod.get_loaders = local_get_loaders(task, data, opts, rec, load_mod.get_loaders)  # 5
    _instrument(server_mod.Server, client_mod.Client, (mezo_mod.MeZOFramework, bias_mod.MeZOBiasOptimizer),
                task, opts, rec)


def _instrument(Server, Client, optimizers, task: str, opts, rec: Record) -> None:
    """The recording wrappers (results unchanged)."""
    for cls in optimizers:
        step, forward = cls.zo_step, cls.zo_forward

        def zo_step(self, batch, local_seed_pool=None, _step=step):
            t0 = time.perf_counter()
            self.projected_grad = None  # set by their step before any use; stays None on an early return
            logits, loss = _step(self, batch, local_seed_pool=local_seed_pool)
            g = self.projected_grad
            rec.steps.append({"seed": int(self.zo_random_seed), "loss": float(loss),
                              "projected_grad": None if g is None else float(g), "applied": g is not None,
                              "tokens": int(batch["input_ids"].numel()), "seconds": time.perf_counter() - t0})
            return logits, loss

        def zo_forward(self, batch, _forward=forward):
            rec.forwards += 1
            return _forward(self, batch)

        cls.zo_step, cls.zo_forward = zo_step, zo_forward

    init, aggregate, update, evaluate = (Server.__init__, Server.aggregate_seed_pool,
                                         Server.update_global_model_by_seed_pool, Server.eval)

    def server_init(self, *a, **k):
        init(self, *a, **k)
        rec.server = self

    def aggregate_seed_pool(self, selected_client_list):
        t0 = time.perf_counter()
        out = aggregate(self, selected_client_list)
        rec.server_rounds.append({"round": rec.client_rounds[-1]["round"] if rec.client_rounds else None,
                                  "clients": [c.idx for c in selected_client_list],
                                  "aggregate_seconds": time.perf_counter() - t0})
        return out

    def update_global_model_by_seed_pool(self):
        t0 = time.perf_counter()
        out = update(self)
        rec.server_rounds[-1] |= {"update_seconds": time.perf_counter() - t0,
                                  "nonzero_seeds": sum(1 for g in self.seed_pool.values() if g != 0.0)}
        return out

    def server_eval(self, cur_round, eval_avg_acc):
        call = len(rec.evals)
        final = call == self.args.rounds + 1  # main.py's last call, after re-loading the eval set
        t0 = time.perf_counter()
        value = evaluate(self, cur_round, eval_avg_acc)
        row = {"call": call, "round": cur_round, "final": final, "metric": self.args.eval_metric, "value": value,
               "examples": len(self.eval_loader.dataset), "seconds": time.perf_counter() - t0}
        if task in TASKS and (opts.acc_evals == "all" or call == 0 or final):
            t1 = time.perf_counter()
            row |= verbalizer_accuracy(self.model, self.tokenizer, rec.dev_rows, task)
            row["verbalizer_seconds"] = time.perf_counter() - t1
        rec.evals.append(row)
        return value

    Server.__init__, Server.aggregate_seed_pool = server_init, aggregate_seed_pool
    Server.update_global_model_by_seed_pool, Server.eval = update_global_model_by_seed_pool, server_eval
    train = Client.local_train_with_seed_pool

    def local_train_with_seed_pool(self, pulled_model, cur_round, memory_record_dic=None, probabilities=None,
                                   gradient_history=None):
        pool = [float(g) for g in rec.server.seed_pool.values()]  # what the global model is built from
        last = rec.last_pull.get(self.idx, [0.0] * len(pool))  # w0 before a first pull
        changed = sum(1 for a, b in zip(pool, last) if a != b)
        rec.last_pull[self.idx] = pool
        pulled_bytes = state_bytes(pulled_model)
        n0, f0, t0 = len(rec.steps), rec.forwards, time.perf_counter()
        out = train(self, pulled_model, cur_round, memory_record_dic=memory_record_dic,
                    probabilities=probabilities, gradient_history=gradient_history)
        steps = rec.steps[n0:]
        for s in steps:
            s |= {"round": cur_round, "client": self.idx}
        rec.client_rounds.append({
            "round": cur_round, "client": self.idx, "client_examples": len(self.train_loader.dataset),
            "steps": len(steps), "applied_steps": sum(s["applied"] for s in steps), "forwards": rec.forwards - f0,
            "mean_loss": sum(s["loss"] for s in steps) / max(len(steps), 1),
            "distinct_nonzero_seeds_up": sum(1 for g in self.local_seed_pool.values() if g != 0.0),
            "local_pool_entries": len(self.local_seed_pool), "pulled_model_bytes": pulled_bytes,
            "seed_pool_entries_changed_since_last_pull": changed, "seconds": time.perf_counter() - t0})
        return out

    Client.local_train_with_seed_pool = local_train_with_seed_pool


def traffic(rec: Record, k: int) -> dict:
    """Bytes per client-round (their code counts none). "their_code" = what their simulation moves in memory: the
    client gets ``deepcopy(server.model)`` (every parameter and buffer) and the server reads the client's
    ``local_seed_pool``, a dict of all K (seed -> float) entries. "paper" = what FedKSeed's protocol sends, the K
    candidate seeds being fixed at the start: up = one (candidate, scalar gradient) pair per local step with a
    finite loss, the candidate as a 64-bit seed (``up_bytes``) or as its index in the K candidates
    (``up_bytes_index``, ceil(log2 K / 8) bytes); down = the K accumulated scalar gradients, from which the client
    rebuilds the global model from w0 (``down_bytes``, K x 4 bytes), or only the entries that changed since its last
    pull, each with its index (``down_bytes_sparse``); scalars as float32. Not per round: the K candidate seeds,
    once per client (K x 8 bytes, or 8 bytes for one generator seed)."""
    index_bytes = max(1, math.ceil(math.log2(max(k, 2)) / 8))
    rows = []
    for r in rec.client_rounds:
        pairs = r["applied_steps"]
        rows.append({"round": r["round"], "client": r["client"],
                     "their_code": {"down_bytes": r["pulled_model_bytes"],
                                    "up_entries": r["local_pool_entries"],
                                    "up_bytes": r["local_pool_entries"] * (SEED_BYTES + SCALAR_BYTES)},
                     "paper": {"up_pairs": pairs, "up_bytes": pairs * (SEED_BYTES + SCALAR_BYTES),
                               "up_bytes_index": pairs * (index_bytes + SCALAR_BYTES), "down_scalars": k,
                               "down_bytes": k * SCALAR_BYTES,
                               "down_entries_sparse": r["seed_pool_entries_changed_since_last_pull"],
                               "down_bytes_sparse": r["seed_pool_entries_changed_since_last_pull"]
                               * (index_bytes + SCALAR_BYTES)}})
    n = max(len(rows), 1)

    def total(side: str, key: str) -> int:
        return sum(r[side][key] for r in rows)

    summary = {side: {f"total_{key}": total(side, key) for key in keys} | {f"mean_{key}_per_client_round":
                                                                           total(side, key) / n for key in keys}
               for side, keys in (("their_code", ("down_bytes", "up_bytes")),
                                  ("paper", ("down_bytes", "down_bytes_sparse", "up_bytes", "up_bytes_index")))}
    return {"rule": traffic.__doc__.replace("\n", " ").replace("    ", ""), "K": k, "seed_bytes": SEED_BYTES,
            "index_bytes": index_bytes, "scalar_bytes": SCALAR_BYTES, "client_rounds": len(rows),
            "setup_bytes_per_client": {"candidate_seeds": k * SEED_BYTES, "one_generator_seed": SEED_BYTES},
            **summary, "per_client_round": rows}


def rounds_summary(rec: Record) -> list[dict]:
    """Per round: the clients, their steps and forwards, and seconds (local training, aggregation, rebuild, eval)."""
    out = []
    for s in rec.server_rounds:
        crs = [c for c in rec.client_rounds if c["round"] == s["round"]]
        ev = [e for e in rec.evals if e["round"] == s["round"] and not e["final"]]
        train = sum(c["seconds"] for c in crs)
        out.append({"round": s["round"], "clients": s["clients"], "steps": sum(c["steps"] for c in crs),
                    "forwards": sum(c["forwards"] for c in crs), "client_train_seconds": train,
                    "aggregate_seconds": s["aggregate_seconds"], "update_seconds": s.get("update_seconds"),
                    "nonzero_seeds_after": s.get("nonzero_seeds"),
                    "round_seconds": train + s["aggregate_seconds"] + s.get("update_seconds", 0.0),
                    "eval_seconds": sum(e["seconds"] + e.get("verbalizer_seconds", 0.0) for e in ev)})
    return out


@contextlib.contextmanager
def dataset_choices(extra: list[str]):
    """Substitution 5: their ``--dataset`` option also accepts ``extra`` while ``main.py`` builds its parser."""
    add = argparse.ArgumentParser.add_argument

    def add_argument(self, *names, **kwargs):
        if "--dataset" in names and kwargs.get("choices") is not None:
            kwargs["choices"] = list(kwargs["choices"]) + [c for c in extra if c not in kwargs["choices"]]
        return add(self, *names, **kwargs)

    argparse.ArgumentParser.add_argument = add_argument
    try:
        yield
    finally:
        argparse.ArgumentParser.add_argument = add


@contextlib.contextmanager
def cwd(path: Path):
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def their_argv(args, rest: list[str]) -> list[str]:
    """main.py's command line: the README recipe, the task, model, seed and log folder, then ``rest`` (later
    options win in their parser)."""
    argv = ["main.py", "--model", smollm2_folder(), "--dataset", args.task, "--seed", str(args.seed),
            "--log_root", str((args.out / "logs").resolve())]
    argv += [x for kv in README_RECIPE.items() for x in kv] + README_FLAGS
    if args.task in TASKS:
        argv += ["--eval_metric", "loss"]  # 6
    return argv + rest


def main(argv: list[str] | None = None) -> None:
    from fedpeft.data.paths import shared_data_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkout", type=Path, help=f"a checkout of {AUTHORS_REPO} at {AUTHORS_COMMIT}")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--task", choices=sorted([*TASKS, "dolly"]), default="sst2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", type=Path, default=shared_data_dir(), help="folder holding SST-2/, RTE/ and Dolly/")
    p.add_argument("--deps", type=Path, default=None, help="folder with rouge (default <checkout>/../deps)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-train", type=int, default=None, help="sst2/rte: N training rows (default all)")
    p.add_argument("--max-dev", type=int, default=None, help="sst2/rte: the first N dev rows (default all)")
    p.add_argument("--glue-eos", action="store_true", help="sst2/rte: targets = label word + eos token")
    p.add_argument("--acc-evals", choices=["ends", "all"], default="ends",
                   help="sst2/rte: verbalizer accuracy at round 0 and the final eval, or at every eval")
    launcher_argv = list(sys.argv if argv is None else ["zo_fedkseed_anchor", *argv])
    args, rest = p.parse_known_args(argv)
    if args.data is None:
        p.error("--data: no shared/data folder found")
    if args.task == "dolly" and (args.max_train is not None or args.max_dev is not None or args.glue_eos):
        p.error("--max-train/--max-dev/--glue-eos are for sst2/rte; for dolly use their --dataset_subsample")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    checkout = args.checkout.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    work = (args.out / "work").resolve()
    work.mkdir(exist_ok=True)
    dolly = dolly_workdir(args.data, work) if args.task == "dolly" else None  # 4
    rec = Record()
    _patch(checkout, args.deps or checkout.parent / "deps", args.task, args.data, args, rec)
    sys.argv = their_argv(args, rest)
    t0 = time.perf_counter()
    with tee(args.out / "fedkseed.log"), cwd(work), dataset_choices(list(TASKS)):
        g = runpy.run_path(str(checkout / "main.py"), run_name="__main__")
    wall = time.perf_counter() - t0
    opts = vars(g["args"])
    first, final = rec.evals[0], rec.evals[-1]
    rounds = rounds_summary(rec)
    steps = [s["seconds"] for s in rec.steps]
    result = {
        "authors_repo": AUTHORS_REPO, "authors_commit": AUTHORS_COMMIT, "checkout": str(checkout),
        "task": args.task, "seed": args.seed, "launcher_argv": launcher_argv, "argv": sys.argv, "options": opts,
        "model_folder": opts["model"], "launcher_options": {k: str(v) for k, v in vars(args).items()},
        "dolly": dolly, "glue_checks": {"dev": rec.dev_check, "train": rec.train_check},
        "partition": rec.partition or None, "label_words": LABEL_WORDS.get(args.task),
        "final_metric": {"name": final["metric"], "value": final["value"]},
        "round0_metric": {"name": first["metric"], "value": first["value"]},
        "their_eval_avg_acc": g.get("eval_avg_acc"), "evals": rec.evals,
        "wall_seconds": wall, "seconds_per_round": [r["round_seconds"] for r in rounds],
        "seconds_per_step_mean": sum(steps) / max(len(steps), 1),
        "forwards_per_step": rec.forwards / max(len(rec.steps), 1), "clients_per_round": int(
            opts["num_clients"] * opts["m"]), "rounds": rounds, "client_rounds": rec.client_rounds,
        "steps": rec.steps, "traffic": traffic(rec, opts["K"]),
    }
    for key, row in (("round0", first), ("final", final)):
        if "verbalizer_accuracy" in row:
            result[f"{key}_verbalizer_accuracy"] = row["verbalizer_accuracy"]
            result[f"{key}_verbalizer_correct_total"] = [row["verbalizer_correct"], row["verbalizer_total"]]
    (args.out / "fedkseed.json").write_text(json.dumps(result, indent=1, default=str))
    keys = ("round0_metric", "final_metric", "round0_verbalizer_correct_total", "final_verbalizer_correct_total",
            "wall_seconds", "seconds_per_round", "seconds_per_step_mean", "forwards_per_step")
    t = result["traffic"]
    print(json.dumps({k: result[k] for k in keys if k in result}
                     | {"paper_bytes_per_client_round": {k: v for k, v in t["paper"].items() if k.startswith("mean")},
                        "their_code_bytes_per_client_round": {k: v for k, v in t["their_code"].items()
                                                              if k.startswith("mean")}}, indent=1))


if __name__ == "__main__":
    main()
