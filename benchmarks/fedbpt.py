"""FedBPT benchmark at CPU scale; writes benchmarks/results/fedbpt.md.

Few-shot (40 examples per class in total, drawn before partitioning), 10 clients, all participating,
Dirichlet alpha = 1.0 (non-IID) and IID, SST-2 and AG News from ../shared/data, MiniLM (3 seeds) and
SmolLM2 (fewer rounds, non-IID, ``--smol-seeds``). Methods: manual prompt, ICL, FedAvg-BBT, FedBPT (both
through the forward-only black box), gradient FedPrompt, and with ``--ablations`` FedBPT with r_p = 0
and with the ratio uploaded (authors' code). Reports final-round test accuracy (mean +- std over the
seeds that finished), bytes per client per round up/down, black-box calls, which clients the server
picks as parents under label skew, and the peak RSS of one FedBPT vs one FedPrompt client round (each
in a fresh process, peak reset after loading and a warm-up forward).

Budgets are far below the paper's (I = 8, d = 500, 50 prompt tokens, 200 rounds): see the flags. Jobs
run in priority order (zero-shot, non-IID, SmolLM2, IID, ablations) on ``--workers`` processes under
a wall-clock deadline; jobs that do not fit are listed as not run. Finished runs in ``--runs-dir`` are
collected, not re-run, so a cut benchmark can be continued (``--methods`` adds runs of some methods);
``--render RUNS_DIR`` rewrites the results file from the run directories.

    nice -n 10 .venv/bin/python benchmarks/fedbpt.py --runs-dir runs/fedbpt-bench     # ~90 min, 2 cores
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "fedbpt.md"
TASK_LEN = {"sst2": 40, "agnews": 32}           # tokens per input before the prompt (texts truncated)
PERTURB = {"sst2": 0.6, "agnews": 0.4}          # paper's best r_p (Table 4)
PARTITIONS = {"non-IID a=1.0": ["federation.partition.scheme=dirichlet", "federation.partition.alpha=1.0",
                                "federation.partition.min_size=2"],
              "IID": ["federation.partition.scheme=iid"]}


def _overrides(args, model: str, task: str, part: str, seed: int, max_test: int) -> list[str]:
    return [f"seed={seed}", f"task.name={task}", "task.few_shot=40", f"task.max_test={max_test}",
            f"task.max_length={TASK_LEN[task]}", f"model.name={model}", "federation.num_clients=10",
            f"federation.rounds={args.rounds}", "evaluation.local=false", f"evaluation.batch_size={args.eval_batch}",
            "runtime.progress=false", f"runtime.threads={args.threads}", *PARTITIONS[part]]


def method_overrides(args, method: str, task: str, model: str) -> list[str]:
    """Per-method settings of this benchmark (same prompt length m for every prompt method)."""
    tokens, dim, iters = (args.tokens, args.dim, args.iterations) if model == "minilm" else \
        (args.smol_tokens, args.smol_dim, args.smol_iterations)
    bbt = [f"method.adapter.num_tokens={tokens}", f"method.adapter.intrinsic_dim={dim}",
           f"method.trainer.iterations={iters}", f"method.trainer.popsize={args.popsize}"]
    return {
        "manual-prompt": ["method.name=manual-prompt", "federation.rounds=1"],
        "icl": ["method.name=icl", "federation.rounds=1"],
        "fedavg-bbt": ["method.name=fedavg-bbt", *bbt],
        "fedbpt": ["method.name=fedbpt", *bbt, f"method.trainer.perturb_rate={PERTURB[task]}"],
        "fedbpt-rp0": ["method.name=fedbpt", *bbt, "method.trainer.perturb_rate=0.0"],
        "fedbpt-ratio-up": ["method.name=fedbpt", *bbt, f"method.trainer.perturb_rate={PERTURB[task]}",
                            "method.trainer.server_fitness=ratio"],
        "fedprompt": ["method.name=fedprompt", f"method.adapter.num_tokens={tokens}", "method.trainer.batch_size=8",
                      f"method.trainer.local_epochs={args.fedprompt_epochs}"],
    }[method]


LABELS = {"manual-prompt": "Manual prompt", "icl": "ICL (5 demos)", "fedavg-bbt": "FedAvg-BBT",
          "fedbpt": "FedBPT", "fedprompt": "FedPrompt (gradient)",
          "fedbpt-rp0": "FedBPT, r_p = 0 (ablation: server CMA-ES only)",
          "fedbpt-ratio-up": "FedBPT, ratio uploaded (ablation: authors' code, A12)"}
ABLATIONS = ("fedbpt-rp0", "fedbpt-ratio-up")


def black_box(method: str) -> bool:
    return method.startswith("fedbpt") or method == "fedavg-bbt"


def plan(args) -> list[dict]:
    """Jobs in priority order: zero-shot and MiniLM ICL; the paper's headline setting (non-IID) on MiniLM
    over all seeds; SmolLM2's first trained setting and ICL; MiniLM IID over all seeds; further SmolLM2 runs;
    the ablations last. ``--methods`` keeps only the jobs of those methods."""
    tasks = args.tasks.split(",")
    trained = ("fedbpt", "fedavg-bbt", "fedprompt")
    smol = "smollm2" in args.models.split(",")
    non_iid, iid = PARTITIONS

    def job(model: str, task: str, part: str, seed: int, method: str) -> dict:
        return {"model": model, "task": task, "part": part, "seed": seed, "method": method}

    zero_shot = [job("minilm", t, "-", 0, "manual-prompt") for t in tasks]
    zero_shot += [job("smollm2", t, "-", 0, "manual-prompt") for t in tasks] if smol else []
    minilm = {p: [job("minilm", t, p, s, m) for s in range(args.seeds) for t in tasks for m in trained]
              for p in (non_iid, iid)}
    smol_runs = [job("smollm2", t, non_iid, s, m) for s in range(args.smol_seeds) for t in tasks
                 for m in trained] if smol else []
    icl = {model: [job(model, t, "-", 0, "icl") for t in tasks] for model in ("minilm", "smollm2")}
    if not smol:
        icl["smollm2"] = []
    ablations = [job("minilm", t, non_iid, s, m) for s in range(args.seeds) for t in tasks for m in ABLATIONS] \
        if args.ablations else []
    jobs = (zero_shot + icl["minilm"] + minilm[non_iid] + smol_runs[:3] + icl["smollm2"][:1] + minilm[iid]
            + icl["smollm2"][1:] + smol_runs[3:] + ablations)
    return [j for j in jobs if args.methods is None or j["method"] in args.methods.split(",")]


GUESS_SECONDS = {"smollm2": 400.0, "minilm": 60.0}  # before a job of that kind has run


def _worker_init(threads: int) -> None:
    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(threads)


def run_pool(args, jobs: list[dict], runs: Path, deadline: float, finished, skipped: list[dict]) -> int:
    """Run ``jobs`` in priority order on ``args.workers`` processes (one backbone each, ``args.threads``
    torch threads); a job whose expected time no longer fits before ``deadline`` is skipped. Returns how
    many finished runs were found in ``runs`` and collected instead of re-run."""
    est: dict[tuple, float] = {}
    queue, pending, reused = list(jobs), {}, 0
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=ctx, initializer=_worker_init,
                             initargs=(args.threads,)) as pool:
        while queue or pending:
            while queue and len(pending) < args.workers:
                job = queue.pop(0)
                key = (job["model"], job["task"], job["method"])
                guess = est.get(key, GUESS_SECONDS[job["model"]] if black_box(job["method"]) else 0.0)
                if time.time() + guess > deadline:
                    skipped.append(job)
                    continue
                pending[pool.submit(run_job, args, job, runs)] = job
            if not pending:
                break
            ready, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in ready:
                job = pending.pop(fut)
                try:
                    res = fut.result()
                except Exception as e:  # noqa: BLE001  (one failing job must not lose the others' results)
                    print(f"job {job} failed: {e!r}", file=sys.stderr)
                    continue
                est[(job["model"], job["task"], job["method"])] = res["seconds"]
                reused += bool(res.get("reused"))
                finished(res)
    return reused


def run_job(args, job: dict, runs: Path) -> dict:
    from fedpeft.resolve import load_config
    from fedpeft.runtime.embedded import run_embedded

    max_test = args.max_test if job["model"] == "minilm" else args.smol_max_test
    part = job["part"] if job["part"] != "-" else "IID"
    over = _overrides(args, job["model"], job["task"], part, job["seed"], max_test)
    if job["model"] == "smollm2":
        over.append(f"federation.rounds={args.smol_rounds}")
    over += method_overrides(args, job["method"], job["task"], job["model"])
    cfg = load_config(None, over)
    out = runs / f"{job['model']}-{job['task']}-{part.split()[0]}-{job['method']}-s{job['seed']}"
    if (out / "summary.json").exists():  # finished by an earlier invocation with the same --runs-dir
        return collect(job, out) | {"reused": True}
    t0 = time.time()
    run_embedded(cfg, out)
    return collect(job, out, time.time() - t0)


def collect(job: dict, out: Path, seconds: float | None = None) -> dict:
    """The table row of a finished run directory (summary.json + metrics.jsonl)."""
    from fedpeft.tracking.rundir import RunDir

    s = json.loads((out / "summary.json").read_text())
    recs = RunDir(out).read_metrics()
    queries = sum(c.get("queries", 0) for r in recs for c in r["clients"])
    return {**job, "acc": s["final_accuracy"], "best": s["best_accuracy"], "rounds": s["rounds"],
            "up": s["bytes_up_per_client_round"], "down": s["bytes_down_per_client_round"],
            "up_tensor": s.get("upload_tensor_bytes"), "trainable": s["trainable_params"],
            "queries_per_client_round": queries / max(1, sum(r["num_ok"] for r in recs)),
            "train_loss": [r.get("train_loss") for r in recs], "sigma": recs[-1]["clients"][0].get("final_sigma"),
            "seconds": seconds if seconds is not None else s["wall_seconds"],
            "backbone_unchanged": s["backbone_unchanged"], **parent_skew(job, out, recs)}


SKEWED = 0.8  # a client is "one-class" when its largest class holds >= 80% of its few-shot examples


def parent_skew(job: dict, out: Path, recs: list[dict]) -> dict:
    """Server CMA-ES runs: share of one-class clients among the best-half parents (ranked by the uploaded
    loss) vs among all clients. Client label histograms come from the run log."""
    if not job["method"].startswith("fedbpt"):
        return {}
    found = re.search(r"label histogram per client \(train\): (\[.*\])", (out / "run.log").read_text())
    if not found:
        return {}
    hist = json.loads(found.group(1))
    skewed = {k for k, h in enumerate(hist) if sum(h) and max(h) / sum(h) >= SKEWED}
    key = "ratio_loss" if job["method"] == "fedbpt-ratio-up" else "train_loss"
    parents = [c["client"] for r in recs
               for c in sorted((c for c in r["clients"] if c["status"] == "ok"), key=lambda c: c[key])
               [: r["num_ok"] // 2]]
    return {"parents_skewed": sum(c in skewed for c in parents) / max(1, len(parents)),
            "clients_skewed": len(skewed) / len(hist)}


def jobs_in(runs: Path) -> list[dict]:
    """Rebuild the rows of every finished run under ``runs`` (for ``--render``), in priority order."""
    rows = []
    for out in sorted(runs.iterdir()):
        if not (out / "summary.json").exists():
            continue
        model, task, rest = out.name.split("-", 2)
        part = next(p for p in PARTITIONS if rest.startswith(p.split()[0] + "-"))
        method, seed = rest[len(part.split()[0]) + 1:].rsplit("-s", 1)
        part = "-" if method in ("manual-prompt", "icl") else part
        rows.append(collect({"model": model, "task": task, "part": part, "seed": int(seed), "method": method}, out))
    order = {tuple(sorted(j.items())): i for i, j in enumerate(plan(_defaults()))}
    return sorted(rows, key=lambda r: order.get(tuple(sorted((k, r[k]) for k in
                                                             ("model", "task", "part", "seed", "method"))), 1e9))


# ---------------------------------------------------------------- memory probe (subprocess)


def _vm(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_probe(args, model: str, method: str, batched: bool) -> dict:
    """One client round of ``method`` on SST-2 (client 0, IID): peak RSS, reset after loading and a warm-up
    forward, so that "before" holds the model and the increase is the round's own working memory."""
    import torch

    torch.set_num_threads(args.threads)
    from fedpeft.build import build_method
    from fedpeft.experiment import build_experiment
    from fedpeft.resolve import load_config

    over = _overrides(args, model, "sst2", "IID", 0, 8) + method_overrides(args, method, "sst2", model)
    if method == "fedbpt" and not batched:
        over.append("method.trainer.batched=false")
    cfg = load_config(None, over)
    exp = build_experiment(cfg)
    m = build_method(cfg, exp)
    state = m.server_init()
    inst = m.configure_round(state, 1, [0])[0]
    ctx = exp.client(0)
    m.evaluate_global(state)  # warm-up: encodes the test set and pages the (mmapped) weights in
    base = _vm("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM (peak RSS) to the current RSS
    t0 = time.time()
    m.client_update(inst, ctx)
    return {"model": model, "method": method, "batched": batched, "rss_before_mb": base, "peak_mb": _vm("VmHWM"),
            "delta_mb": _vm("VmHWM") - base, "seconds": time.time() - t0, "examples": len(ctx.train)}


PROBES = [(model, method, batched) for model in ("minilm", "smollm2")
          for method, batched in (("fedbpt", True), ("fedbpt", False), ("fedprompt", True))]


def measure_rss(args) -> list[dict]:
    """Each probe in a fresh process (same benchmark flags), so that peaks do not mix."""
    out = []
    models = args.models.split(",")
    for model, method, batched in (p for p in PROBES if p[0] in models):
        cmd = [sys.executable, str(Path(__file__)), *sys.argv[1:], "--rss-probe", f"{model}:{method}"]
        cmd += [] if batched else ["--sequential"]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900, check=False)
        line = [x for x in res.stdout.splitlines() if x.startswith("{")]
        out.append(json.loads(line[-1]) if line else {"model": model, "method": method, "batched": batched,
                                                      "error": res.stderr[-400:]})
    return out


def probes(args, runs: Path) -> list[dict]:
    """Measure the RSS probes and keep them in ``runs/rss.json``; with ``--no-rss``, reuse that file if any."""
    saved = runs / "rss.json"
    if args.no_rss:
        return json.loads(saved.read_text()) if saved.exists() else []
    rss = measure_rss(args)
    runs.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(rss, indent=1))
    return rss


# ---------------------------------------------------------------- report


def _ms(vals: list[float]) -> str:
    if not vals:
        return "not run"
    m = 100 * statistics.fmean(vals)
    sd = 100 * statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{m:.1f} ± {sd:.1f} (n={len(vals)})"


def _command(args) -> str:
    """The invocation that produced the runs (``--render``/``--rss-probe`` flags dropped) and how."""
    argv, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if a in ("--render", "--render-minutes"):
            skip = True
            continue
        if a == "--no-rss" and getattr(args, "render", None):
            continue
        argv.append(a)
    text = f"`nice -n 10 .venv/bin/python benchmarks/fedbpt.py{''.join(' ' + a for a in argv)}`"
    if getattr(args, "render", None):
        text += (" (runs made by that command, possibly over several invocations with the same --runs-dir; this "
                 "file re-rendered from their run directories with `--render`)")
    elif getattr(args, "reused", 0):
        text += (f" (continuing an earlier invocation: {args.reused} finished runs found in --runs-dir were "
                 "collected, not re-run; the wall time below is this invocation's)")
    return text


def write_report(args, done: list[dict], skipped: list[dict], rss: list[dict], started: float, final: bool) -> None:
    lines = ["# FedBPT benchmark (CPU scale)", ""]
    if not final:
        lines += ["**PARTIAL: the benchmark is still running or was interrupted.**", ""]
    lines += [
        (f"Command: {_command(args)}; wall time {(time.time() - started) / 60:.1f} min on a 2-core CPU machine "
         f"({args.workers} jobs at once, torch threads = {args.threads} each)."),
        "",
        ("Setup (paper → here): few-shot 40 examples per class in total drawn before partitioning (same), 10 clients all "
        "participating (same), Dirichlet α = 1.0 or IID (same); MiniLM-L6 with the similarity readout stands in "
        f"for RoBERTa-large. Budgets are cut to fit {args.budget_min:.0f} minutes of 2 CPU cores: "
        f"rounds T = {args.rounds} (code: 200), local iterations I = {args.iterations} (paper 8), λ = {args.popsize} "
        f"(same), d = {args.dim} (paper 500), prompt length m = {args.tokens} (code 50), test sets capped at "
        f"{args.max_test} examples (stratified), inputs truncated to {TASK_LEN['sst2']} (SST-2) / {TASK_LEN['agnews']} "
        "(AG News) tokens, r_p = 0.6 SST-2 / 0.4 AG News (paper's best), σ₁ = 1, "
        "server σ′ by Eq. 16, best-half parents with equal weights, ratio σ transfer, full covariance downlink. "
        f"FedPrompt: same m, Adam lr 0.03, batch 8, {args.fedprompt_epochs} local epochs per round, FedAvg. "
        "Accuracy = final-round global test accuracy (A z_T), mean ± std over the seeds that finished (n shown)."),
        "",
        "## Accuracy (%), MiniLM",
        "",
        "| Method | trainable | SST-2 IID | SST-2 non-IID | AG News IID | AG News non-IID |",
        "|---|---|---|---|---|---|",
    ]
    def cell(model, method, task, part):
        vals = [r["acc"] for r in done if r["model"] == model and r["method"] == method and r["task"] == task
                and (r["part"] == part or r["part"] == "-")]
        return _ms(vals)

    def single(model, method, task):  # zero-shot: one deterministic run, the same for both partitions
        vals = [r["acc"] for r in done if r["model"] == model and r["method"] == method and r["task"] == task]
        return f"{100 * vals[0]:.1f} (single)" if vals else "not run"
    shown = ("manual-prompt", "icl", "fedavg-bbt", "fedbpt", "fedprompt")
    for method in shown + tuple(a for a in ABLATIONS if any(r["method"] == a for r in done)):
        tr = next((r["trainable"] for r in done if r["method"] == method and r["model"] == "minilm"), "–")
        row = [LABELS[method], str(tr)]
        for task in ("sst2", "agnews"):
            for part in ("IID", "non-IID a=1.0"):
                row.append(cell("minilm", method, task, part) if method not in ("manual-prompt", "icl")
                           else single("minilm", method, task))
        lines.append("| " + " | ".join(row) + " |")
    smol = [r for r in done if r["model"] == "smollm2"]
    lines += ["", "## SmolLM2-135M (next-token verbalizer)", "",
              (f"Cut further: test sets capped at {args.smol_max_test}, T = {args.smol_rounds}, I = "
               f"{args.smol_iterations}, d = {args.smol_dim}, m = {args.smol_tokens}, trained methods on non-IID "
               f"α = 1.0 only, {args.smol_seeds} seed(s), as far as the time budget allowed (one SmolLM2 row costs "
               "~10 MiniLM rows here). Same r_p and FedPrompt settings as MiniLM."), ""]
    if smol:
        lines += ["| Method | task | partition | seed | accuracy (%) | train loss per round | seconds |",
                  "|---|---|---|---|---|---|---|"]
        for r in smol:
            tl = ", ".join(f"{x:.3f}" for x in r["train_loss"] if x is not None) or "–"
            lines.append(f"| {LABELS[r['method']]} | {r['task']} | {r['part']} | {r['seed']} | {100 * r['acc']:.1f} | "
                         f"{tl} | {r['seconds']:.0f} |")
    else:
        lines.append("No SmolLM2 job finished within the budget.")
    lines += ["", "## Communication per client per round (real encoded bytes, float32 wire)", "",
              "| Method | task | uplink B (tensor bytes) | downlink B | black-box forward calls per client round |",
              "|---|---|---|---|---|"]
    seen = set()
    for r in done:
        key = (r["model"], r["method"], r["task"])
        if key in seen or r["model"] != "minilm":
            continue
        seen.add(key)
        calls = f"{r['queries_per_client_round']:.0f}" if black_box(r["method"]) else "–"
        lines.append(f"| {LABELS[r['method']]} | {r['task']} | {r['up']:.0f} ({r['up_tensor']}) | {r['down']:.0f} | "
                     f"{calls} |")
    lines += ["", (f"FedBPT uplink = (d + I + 1) × 4 B + framing = ({args.dim} + {args.iterations} + 1) × 4 = "
              f"{(args.dim + args.iterations + 1) * 4} B of tensors; its downlink carries the full d×d covariance "
              f"({args.dim * args.dim * 4} B at d = {args.dim}; `method.trainer.covariance=diagonal|none` cuts it to "
              "d or 0 floats). FedAvg-BBT uploads its local covariance too. At the paper's d = 500 the FedBPT uplink "
              "is 2,036 B of tensors, the full-covariance downlink 1,000,000 B."), ""]
    skew = sorted((r for r in done if "parents_skewed" in r and r["part"] != "IID"),
                  key=lambda r: (r["model"], r["task"], r["method"], r["seed"]))
    if skew:
        lines += [f"## Who the server picks under label skew (FedBPT, non-IID): share of one-class clients (≥ "
                  f"{SKEWED:.0%} of their examples in one class) among the best-half parents, all rounds", "",
                  "| model | task | seed | method | one-class share of parents | of all clients | acc % |",
                  "|---|---|---|---|---|---|---|"]
        for r in skew:
            lines.append(f"| {r['model']} | {r['task']} | {r['seed']} | {LABELS[r['method']]} | "
                         f"{r['parents_skewed']:.2f} | {r['clients_skewed']:.2f} | {100 * r['acc']:.1f} |")
        lines.append("")
    lines += [("## Peak memory of one client round (SST-2, client 0, IID, same settings as the runs; a fresh "
               "process per probe)"), ""]
    if rss:
        lines += ["| model | client | local examples | peak RSS MB | RSS before round MB | round's increase MB | seconds |",
                  "|---|---|---|---|---|---|---|"]
        for p in rss:
            if "error" in p:
                lines.append(f"| {p['model']} | {p['method']} | error: {p['error'][-120:]!r} | | | | |")
                continue
            name = "FedPrompt (backward)" if p["method"] == "fedprompt" else \
                f"FedBPT ({'batched λ' if p['batched'] else 'one candidate per forward'})"
            lines.append(f"| {p['model']} | {name} | {p['examples']} | {p['peak_mb']:.0f} | {p['rss_before_mb']:.0f} | "
                         f"{p['delta_mb']:.1f} | {p['seconds']:.1f} |")
        ok = {(p["model"], p["method"], p["batched"]): p for p in rss if "error" not in p}
        lines.append("")
        for model in ("minilm", "smollm2"):
            fb, fs, fp = (ok.get((model, "fedbpt", True)), ok.get((model, "fedbpt", False)),
                          ok.get((model, "fedprompt", True)))
            if fb and fs and fp:
                lines.append(f"- {model}: peak RSS ratio FedPrompt / FedBPT = {fp['peak_mb'] / fb['peak_mb']:.2f} "
                             f"(batched λ) and {fp['peak_mb'] / fs['peak_mb']:.2f} (one candidate per forward); "
                             f"ratio of the round's own increase = {fp['delta_mb'] / max(fb['delta_mb'], 1e-9):.2f} "
                             f"and {fp['delta_mb'] / max(fs['delta_mb'], 1e-9):.2f}.")
        lines.append("- Paper (Table 2, GPU, RoBERTa-large): 5.8 GB / 1.8 GB = 3.2.")
    lines += ["", "## Runs", "",
              "| model | task | partition | seed | method | acc % | rounds | train loss per round | seconds |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in done:
        tl = ", ".join(f"{x:.3f}" for x in r["train_loss"] if x is not None) or "–"
        lines.append(f"| {r['model']} | {r['task']} | {r['part']} | {r['seed']} | {LABELS[r['method']]} | "
                     f"{100 * r['acc']:.1f} | {r['rounds']} | {tl} | {r['seconds']:.0f} |")
    if skipped:
        lines += ["", "Not run (time budget): " + "; ".join(
            f"{s['model']}/{s['task']}/{s['part']}/seed {s['seed']}/{LABELS[s['method']]}" for s in skipped)]
    unchanged = all(r["backbone_unchanged"] for r in done) if done else "n/a"
    lines += ["", f"All runs left the backbone checksum unchanged: {unchanged}.", ""]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines))


def _parser():
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-min", type=float, default=90.0, help="wall-clock budget for all jobs")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--popsize", type=int, default=5)
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=5)
    ap.add_argument("--fedprompt-epochs", type=float, default=2.0)
    ap.add_argument("--max-test", type=int, default=150)
    ap.add_argument("--eval-batch", type=int, default=100)
    ap.add_argument("--tasks", default="sst2,agnews")
    ap.add_argument("--models", default="minilm,smollm2")
    ap.add_argument("--smol-max-test", type=int, default=100)
    ap.add_argument("--smol-rounds", type=int, default=3)
    ap.add_argument("--smol-iterations", type=int, default=2)
    ap.add_argument("--smol-dim", type=int, default=50)
    ap.add_argument("--smol-tokens", type=int, default=5)
    ap.add_argument("--smol-seeds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--workers", type=int, default=2, help="jobs run at once, one process each")
    ap.add_argument("--ablations", action="store_true", help="also FedBPT with r_p = 0 and with the ratio "
                    "uploaded, non-IID, all seeds (after everything else)")
    ap.add_argument("--methods", default=None, help="only these methods (comma-separated), e.g. to add the "
                    "ablations to an earlier --runs-dir")
    ap.add_argument("--runs-dir", default=None)
    ap.add_argument("--no-rss", action="store_true", help="skip the RSS probes (reuse RUNS_DIR/rss.json if there)")
    ap.add_argument("--rss-probe", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sequential", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--render", default=None, metavar="RUNS_DIR",
                    help="rewrite the results file from the finished run directories of an earlier (cut) run")
    ap.add_argument("--render-minutes", type=float, default=None, help="wall time of that run, for the report")
    return ap


def _defaults():
    return _parser().parse_args([])


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.rss_probe:
        model, method = args.rss_probe.split(":")
        print(json.dumps(rss_probe(args, model, method, not args.sequential)))
        return
    if args.render:
        done = jobs_in(Path(args.render))
        finished = {tuple(sorted((k, r[k]) for k in ("model", "task", "part", "seed", "method"))) for r in done}
        skipped = [j for j in plan(args) if tuple(sorted(j.items())) not in finished]
        rss = probes(args, Path(args.render))
        write_report(args, done, skipped, rss, time.time() - 60 * (args.render_minutes or 0), final=True)
        print(f"wrote {RESULTS} from {len(done)} runs")
        return
    started = time.time()
    deadline = started + 60 * args.budget_min
    runs = Path(args.runs_dir or tempfile.mkdtemp(prefix="fedbpt-bench-"))
    rss = probes(args, runs)
    done, skipped = [], []
    write_report(args, done, skipped, rss, started, final=False)

    def finished(res: dict) -> None:
        done.append(res)
        print(f"[{(time.time() - started) / 60:5.1f} min] {res['model']}/{res['task']}/{res['part']}/"
              f"s{res['seed']}/{res['method']} acc={res['acc']:.3f} ({res['seconds']:.0f}s)", flush=True)
        write_report(args, done, skipped, rss, started, final=False)

    reused = run_pool(args, plan(args), runs, deadline, finished, skipped)
    args.reused = reused
    write_report(args, done, skipped, rss, started, final=True)
    (runs / "results.json").write_text(json.dumps({"done": done, "skipped": skipped, "rss": rss}, indent=1))
    print(f"wrote {RESULTS} ({len(done)} runs, {len(skipped)} skipped); runs in {runs}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
