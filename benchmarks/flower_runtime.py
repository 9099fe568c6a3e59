"""Wall time and model loads per process: the same run on embedded, flower-sim and Flower deployment.

Usage (one run at a time; nice'd; ~10-20 min on 2 cores):
    nice -n 10 .venv/bin/python -m benchmarks.flower_runtime examples/bbc_fedprompt.yaml \\
        --set federation.rounds=2 --set task.max_train=600 --nodes 2
Writes ``benchmarks/results/flower_runtime.md`` (and the run directories under ``--work``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded
from fedpeft.runtime.flower.deployment import run_flower
from fedpeft.runtime.flower.local import LocalFederation
from fedpeft.runtime.flower.simulation import run_flower_sim
from fedpeft.tracking.rundir import RunDir


def _row(name: str, seconds: float, summary: dict, run_dir: Path) -> dict:
    recs = RunDir(run_dir).read_metrics()
    procs = summary.get("flower", {}).get("processes", {})
    return {"runtime": name, "wall_s": round(seconds, 1), "accuracy": [r["accuracy"] for r in recs],
            "bytes_up": summary["bytes_up_total"], "bytes_down": summary["bytes_down_total"],
            "flower_record_bytes": [r.get("flower_record_bytes") for r in recs],
            "client_processes": len(procs) if procs else 1,
            "max_loads_per_process": max((p["backbone_loads"] for p in procs.values()), default=1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--nodes", type=int, default=2, help="SuperNodes in the deployment run")
    ap.add_argument("--work", default="/tmp/fedpeft-flower-bench")
    ap.add_argument("--out", default="benchmarks/results/flower_runtime.md")
    ap.add_argument("--only", default="embedded,flower-sim,flower")
    args = ap.parse_args()
    overrides = args.set + ["runtime.progress=false", "runtime.threads=1"]
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    rows = []
    for name in args.only.split(","):
        cfg = load_config(args.config, overrides + [f"runtime.name={name}"])
        out = work / name
        t0 = time.perf_counter()
        if name == "embedded":
            s = run_embedded(cfg, out)
        elif name == "flower-sim":
            s = run_flower_sim(cfg, out)
        else:
            n = cfg.federation.num_clients
            with LocalFederation(work / "federation") as fed:
                fed.start_superlink()
                for k in range(args.nodes):
                    fed.start_node(f"node{k}", list(range(k, n, args.nodes)))
                t0 = time.perf_counter()  # from submission, SuperLink/SuperNodes already up
                s = run_flower(cfg, out, superlink=fed.address, insecure=True)
        rows.append(_row(name, time.perf_counter() - t0, s, out))
        print(json.dumps(rows[-1]), flush=True)
    cmd = " ".join(["python -m benchmarks.flower_runtime", args.config, *[f"--set {x}" for x in args.set],
                    f"--nodes {args.nodes}"])
    lines = ["# Flower runtime vs embedded: wall time, bytes, model loads", "",
             f"Command: `nice -n 10 {cmd}` (runtime.threads=1; 2-core shared machine, CPU only).", "",
             "| runtime | wall s | accuracy per round | fedpeft bytes up / down | client processes | "
             "max backbone loads per process |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['runtime']} | {r['wall_s']} | {', '.join(f'{a:.4f}' for a in r['accuracy'])} | "
                     f"{r['bytes_up']:,} / {r['bytes_down']:,} | {r['client_processes']} | "
                     f"{r['max_loads_per_process']} |")
    lines += ["", "Flower `count_bytes()` of the records per round (train/evaluate, down/up):", ""]
    lines += [f"- {r['runtime']}: {r['flower_record_bytes']}" for r in rows if r["runtime"] != "embedded"]
    lines += ["", "Deployment: Flower 1.41 starts a fresh `flwr-clientapp` process per message (subprocess "
              "isolation), so each SuperNode loads the backbone once per message (one message per node per "
              "round carries all its clients); in simulation each Ray actor loads it once for the whole run."]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(Path(args.out).read_text())


if __name__ == "__main__":
    main()
