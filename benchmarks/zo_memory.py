"""Peak memory of a zeroth-order client round against an inference pass on the same batch (issue 74):
benchmarks/results/zo_memory.md.

SmolLM2-135M-Instruct, every weight trained (the ``full`` adapter), one client of ``decomfl`` on SST-2 with
DeComFL's prompt, one local step of 32 examples, P = 5. Each arm runs in a fresh process that builds the run, holds
the client's instruction as bytes, and records its resident memory before and, sampled every millisecond by a
thread, during the measured work:

- inference: decode the instruction (the client's copy of every weight) and one forward pass of the batch the
  client trains on, no gradient;
- zo-sgd: the whole client round (``handle_train``: decode, P + 1 forward passes with the perturbations in place,
  the update, the encoded reply), the weights sent in the instruction (``method.downlink.name: dense``);
- zo-sgd, seed_history: the same with DeComFL's download (the preset's): the client rebuilds the weights it holds
  (here its first round: the initial weights, derived from the run seed) and trains a second copy;
- first-order: ``fedavg-full``'s client on the same batch (AdamW, one step), for scale.

    python -m benchmarks.zo_memory [--reps 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.runner import RESULTS, write_results

ARMS = ("inference", "zo-sgd", "zo-sgd, seed_history", "first-order")
BASE = ["task.name=sst2", "task.max_train=96", "task.max_test=8", "task.max_length=64",
        "task.causal_template={text_a} It was", "task.label_words=[bad, good]", "model.name=smollm2",
        "model.readout=verbalizer", "federation.num_clients=3", "federation.clients_per_round=1",
        "runtime.threads=1", "runtime.progress=false"]
DENSE = ["method.name=decomfl", "method.downlink.name=dense"]  # the weights in the instruction
METHOD = {"inference": DENSE, "zo-sgd": DENSE, "zo-sgd, seed_history": ["method.name=decomfl"],
          "first-order": ["method.name=fedavg-full", "method.trainer.max_steps=1", "method.trainer.batch_size=32"]}


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


class Peak:
    """The largest resident size seen while the block runs (a thread samples it every millisecond)."""

    def __enter__(self) -> Peak:
        self.peak, self._stop = _rss(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def measure(arm: str) -> dict:
    """One arm in this process: resident bytes before the work and at its peak."""
    import torch

    from fedpeft.build import build
    from fedpeft.comm.codec import decode
    from fedpeft.resolve import load_config
    from fedpeft.rng import torch_rng
    from fedpeft.runtime.client import handle_train
    from fedpeft.runtime.server import RoundDriver

    torch.set_num_threads(1)
    b = build(load_config(None, BASE + METHOD[arm]))
    state = b.method.server_init()
    plan = RoundDriver(b.plan.federation, b.method).plan_round(state, 1)
    cid = min(plan.instructions)
    payload, client = plan.instructions[cid], b.exp.client(cid)
    rows = torch.randperm(len(client.train), generator=torch_rng(client.seed, 1, cid, "local-train"))[:32].tolist()
    del state
    gc.collect()
    before = _rss()
    with Peak() as p:
        if arm == "inference":
            params = b.method.format.start(decode(payload))
            with torch.no_grad():
                b.exp.objective.outputs(params, b.exp.objective.batch(client.train, rows))
        else:
            handle_train(b.method, payload, client)
    return {"arm": arm, "before": before, "peak": p.peak, "payload_bytes": len(payload)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="fresh processes per arm, alternating")
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # a child process: print one measurement
    ap.add_argument("--results", default=str(RESULTS / "zo_memory.md"))
    args = ap.parse_args(argv)
    if args.arm:
        print(json.dumps(measure(args.arm)))
        return
    runs: dict[str, list[dict]] = {a: [] for a in ARMS}
    for _ in range(args.reps):
        for arm in ARMS:
            out = subprocess.run([sys.executable, "-m", "benchmarks.zo_memory", "--arm", arm], check=True,
                                 capture_output=True, text=True).stdout.strip().splitlines()[-1]
            runs[arm].append(json.loads(out))
    gib = lambda x: x / 2**30  # noqa: E731
    peak = {a: statistics.median(r["peak"] for r in runs[a]) for a in ARMS}
    before = {a: statistics.median(r["before"] for r in runs[a]) for a in ARMS}
    lines = ["# Peak memory of a zeroth-order client round", "", __doc__.split("\n\n", 1)[1].split("\n\n    python")[0],
             "", f"Command: `python -m benchmarks.zo_memory --reps {args.reps}`; medians of {args.reps} fresh "
             "processes per arm, alternating; resident set size (RSS) in GiB; CPU, one thread.", "",
             "| arm | RSS before the work | peak RSS during it | peak − before | peak / inference's peak |",
             "|---|---|---|---|---|"]
    for a in ARMS:
        lines.append(f"| {a} | {gib(before[a]):.2f} | {gib(peak[a]):.2f} | {gib(peak[a] - before[a]):.2f} | "
                     f"{peak[a] / peak['inference']:.2f}× |")
    lines += ["", "Every run: " + "; ".join(f"{a} " + ", ".join(f"{gib(r['peak']):.2f}" for r in runs[a])
                                            for a in ARMS) + " GiB peak."]
    print(f"wrote {write_results(Path(args.results), lines)}")


if __name__ == "__main__":
    main()
