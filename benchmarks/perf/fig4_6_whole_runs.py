"""Figures 4, 6 and 6c: whole runs in fresh processes (scale in one process; Flower simulation, client
workers and a deployment against the embedded runtime)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


from fedpeft.resolve import load_config
from fedpeft.tracking.rundir import RunDir

from benchmarks.perf.common import Figure, clock, figure

SCALE_CHILD = """
import json, resource, sys, time
from fedpeft.build import build
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import InProcessTransport
from fedpeft.runtime.server import RoundDriver
from fedpeft.runtime.session import progress
from fedpeft.runtime.workers import encode_state
b = build(load_config(None, sys.argv[1:]))
driver = RoundDriver(b.plan.federation, b.method)
transport = InProcessTransport(b.plan, b.method, b.exp, progress(False), None)
state = b.method.server_init()
seconds = []
for rnd in (1, 2):
    t0 = time.perf_counter()
    plan = driver.plan_round(state, rnd)
    state, recs = driver.finish_round(state, plan, transport.train(rnd, plan.instructions))
    seconds.append(time.perf_counter() - t0)
states = sum(len(encode_state(m)) for m in transport.client_states().values())
try:  # this process's own peak (ru_maxrss would also count the parent's pages before exec)
    rss = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
except OSError:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"rss": rss, "states": states,
                  "round_s": seconds[-1], "clients": sum(r["status"] == "ok" for r in recs)}))
"""


def figure_4(args) -> list[Figure]:
    """One process simulating 10, 100 and 1,000 FedPrompt clients on MiniLM, each with the same work (4 synthetic
    examples, one Adam step) and its Adam moments kept as persistent state: peak RSS beyond the clients' states,
    and seconds per client-round of the second round (plan, train, validate, aggregate), against 10 clients (each
    size in a fresh process)."""
    import json as _json
    import subprocess

    sizes, got = (10, 100, args.scale_clients), {}
    for n in sizes:
        over = ["task.name=synthetic-sentiment", f"task.num_examples={5 * n}", "task.max_length=64",
                "model.name=minilm", f"federation.num_clients={n}", "method.name=fedprompt",
                "method.trainer.reset_optimizer=false", "method.trainer.max_steps=1", "method.trainer.batch_size=4",
                "runtime.threads=1", "runtime.progress=false"]
        res = subprocess.run([sys.executable, "-c", SCALE_CHILD, *over], capture_output=True, text=True, check=True)
        got[n] = _json.loads(res.stdout.strip().splitlines()[-1])
        print(f"[4] {n} clients: {got[n]}", flush=True)
    beyond = {n: g["rss"] - g["states"] for n, g in got.items()}
    per_client = {n: g["round_s"] / g["clients"] for n, g in got.items()}
    rss = ", ".join(f"{n}: {g['rss'] / 2**20:.0f} MiB" for n, g in got.items())
    states = ", ".join(f"{n}: {g['states'] / 2**20:.1f} MiB" for n, g in got.items())
    note = (f"peak RSS {rss}; client states {states}, kept in memory as tensors (not spilled to disk); freed "
            "heap pages returned to the OS between clients (`runtime/heap.py`)")
    big, small = sizes[-1], sizes[0]
    return [figure("4a", f"scale: peak RSS beyond the client states, {big:,} / {small} clients in one process",
                   (f"{big} clients MiB", f"{small} clients MiB"), [beyond[big] / 2**20], [beyond[small] / 2**20],
                   "< 1.10x", lambda x: x < 1.10, note),
            figure("4b", f"scale: seconds per client-round, {big:,} / {small} clients (4 examples, one step each)",
                   (f"{big} clients", f"{small} clients"), [per_client[big]], [per_client[small]],
                   "~1x (flat)", lambda x: x <= 1.10, f"100 clients: {per_client[100] / per_client[small]:.2f}x")]


def figure_6(args) -> list[Figure]:
    """Embedded with one client worker per core against Flower's simulation (one Ray actor per core) and against
    the single-process embedded run, on the same many-client BBC workload; whole runs, records must agree."""
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.runtime.flower.simulation import run_flower_sim

    cores = os.cpu_count() or 1
    base = ["task.name=bbc", f"task.max_train={args.dist_train}", f"federation.num_clients={args.dist_clients}",
            f"federation.rounds={args.dist_rounds}", "method.name=fedprompt", "runtime.threads=1",
            "runtime.progress=false", "evaluation.report=false"]
    arms = {"flower-sim": lambda out: run_flower_sim(load_config(None, base), out),
            f"embedded x{cores}": lambda out: run_embedded(load_config(None, base + [
                f"runtime.client_workers={cores}"]), out),
            "embedded x1": lambda out: run_embedded(load_config(None, base), out)}
    with tempfile.TemporaryDirectory() as tmp:
        seconds = {name: [] for name in arms}
        for r in range(args.dist_reps):
            for name in (list(arms) if r % 2 == 0 else list(reversed(arms))):
                seconds[name].append(clock(lambda: arms[name](Path(tmp) / f"{name}-{r}"))[0])
        accs = {name: [x["accuracy"] for x in RunDir(Path(tmp) / f"{name}-0").read_metrics()] for name in arms}
    same = len({tuple(a) for a in accs.values()}) == 1
    note = (f"{args.dist_clients} clients, {args.dist_rounds} rounds, {args.dist_train} BBC examples; "
            f"accuracies per round identical across the three: {'yes' if same else 'NO'}")
    emb = f"embedded x{cores}"
    return [figure("6a", f"distributed: Flower simulation ({cores} Ray actors) / embedded with {cores} client "
                         "workers", ("flower-sim", emb), seconds["flower-sim"], seconds[emb], ">= 1.0x",
                   lambda x: x >= 1.0, note, level_at=1.0),
            figure("6b", f"embedded: one process / {cores} client workers (`runtime.client_workers`)",
                   ("embedded x1", emb), seconds["embedded x1"], seconds[emb], "> 1x", lambda x: x > 1.0, note,
                   level_at=1.0)]


def figure_6c(args) -> list[Figure]:
    """A Flower deployment on this machine, with and without the per-node worker; whole runs, loads counted."""
    from fedpeft.runtime.flower.deployment import run_flower
    from fedpeft.runtime.flower.local import LocalFederation

    cfg = load_config(None, ["task.name=bbc", f"task.max_train={args.dist_train // 3}", "federation.num_clients=4",
                             f"federation.rounds={args.dist_rounds}", "method.name=fedprompt", "runtime.threads=1",
                             "runtime.progress=false", "evaluation.report=false"])
    seconds: dict[bool, list[float]] = {True: [], False: []}
    loads: dict[bool, int] = {}
    accs: dict[bool, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.dist_reps):
            for worker in ((False, True) if r % 2 == 0 else (True, False)):
                root = Path(tmp) / f"{worker}-{r}"
                with LocalFederation(root / "fed") as fed:
                    fed.start_superlink()
                    for i in range(2):
                        fed.start_node(f"node{i}", [2 * i, 2 * i + 1], worker=worker)
                    sec, summary = clock(lambda: run_flower(cfg, root / "run", superlink=fed.address, insecure=True,
                                                            timeout=3600))
                seconds[worker].append(sec)
                loads[worker] = sum(p["backbone_loads"] for p in summary["flower"]["processes"].values())
                accs[worker] = [x["accuracy"] for x in RunDir(root / "run").read_metrics()]
    note = (f"2 SuperNodes x 2 clients, {cfg.federation.rounds} rounds, {cfg.task.max_train} BBC examples; "
            f"backbone loads per run: {loads[False]} with a load per message, {loads[True]} with the worker; "
            f"accuracies per round identical: {'yes' if accs[True] == accs[False] else 'NO'}")
    return [figure("6c", "Flower deployment: a model load per message / one long-lived worker per node",
                   ("per message", "worker"), seconds[False], seconds[True], "1 load per node per run",
                   lambda x: loads[True] == 2, note)]
