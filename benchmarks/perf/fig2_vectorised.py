"""Figure 2 (and 2s): vectorised clients, one after another against their model calls together."""

from __future__ import annotations

import os

import torch

from fedpeft.build import build, run_plan
from fedpeft.comm.codec import decode
from fedpeft.resolve import load_config
from fedpeft.runtime.server import RoundDriver
from fedpeft.runtime.session import progress

from benchmarks.perf.common import Figure, alternate, figure


VECTOR_PRESETS = {  # label -> the preset's overrides at this figure's size (the benchmarks' CPU scale)
    "FedBPT (CMA-ES, lambda = 5)": ["method.name=fedbpt", "method.adapter.num_tokens=10",
                                    "method.adapter.intrinsic_dim=50", "method.trainer.iterations=2"],
    "discrete prompt search (K = 5)": ["method.name=discrete-prompt", "method.adapter.num_tokens=10",
                                       "method.trainer.steps=4"],
    "FedPrompt soft prompt (Adam, 4 steps)": ["method.name=fedprompt", "method.trainer.max_steps=4"],
}
VECTOR_SIZES = {  # figure -> (examples per client, gradient batch) for 2a-2c; the "s" rows: few-shot sizes
    "2": (16, 16),  # FedBPT / discrete search: 5 x 16 = 80 rows per client and call; soft prompt: batches of 16
    "2s": (8, 4),   # FedBPT's few-shot clients (8 examples: 40 rows per call); soft prompt batches of 4
}


def figure_2(args, key: str = "2") -> list[Figure]:
    """A round's clients, one after another (``runtime.client_batch: 1``) against ``--vector-clients`` of them with
    their model calls together: forward-only methods' forwards in one backbone call (a, b), a gradient method's
    steps in one forward and one backward (c); same replies required (up to float rounding). Figure 2 runs one
    torch thread at the benchmarks' sizes; 2s the few-shot sizes with a thread per core (both arms)."""
    from fedpeft.runtime.embedded import InProcessTransport

    k, rows = args.vector_clients, []
    examples, batch = VECTOR_SIZES[key]
    threads = torch.get_num_threads()
    if key == "2s":
        torch.set_num_threads(os.cpu_count() or 1)
    for (label, over), sub in zip(VECTOR_PRESETS.items(), "abc"):
        per_client = 4 * batch if sub == "c" else examples  # a gradient client takes 4 minibatches
        base = ["task.name=sst2", f"task.max_train={per_client * k}", "task.max_test=40", "task.max_length=40",
                f"federation.num_clients={k}", "runtime.progress=false", *over,
                *([f"method.trainer.batch_size={batch}"] if sub == "c" else [])]  # a and b score all examples
        b = build(load_config(None, base))
        vec = run_plan(load_config(None, base + [f"runtime.client_batch={k}", f"runtime.client_batch_passes={k}"]))
        state = b.method.server_init()
        plan = RoundDriver(b.plan.federation, b.method).plan_round(state, 1)
        arms = {n: InProcessTransport(c, b.method, b.exp, progress(False), None)
                for n, c in (("sequential", b.plan), ("together", vec))}
        replies = {}

        def run(name):
            replies[name] = arms[name].train(1, dict(plan.instructions))

        ta, tb = alternate(lambda: run("sequential"), lambda: run("together"), args.reps)
        seq = {c: decode(r).tensors for c, r in replies["sequential"].items()}
        tog = {c: decode(r).tensors for c, r in replies["together"].items()}
        diff = max(float((seq[c][n].double() - tog[c][n].double()).abs().max()) for c in seq for n in seq[c])
        shared = arms["together"].shared
        size = f"batches of {batch}" if sub == "c" else f"{examples} examples each"
        rows.append(figure(key + sub, f"{label}: {k} clients' local work (MiniLM, SST-2, {size}, "
                                      f"{torch.get_num_threads()} thread(s)), one after another / model calls "
                                      "together (`runtime.client_batch`)",
                           ("sequential", "together"), ta, tb, "speedup, equal results", lambda x: x > 1.0,
                           f"max abs difference of the uploads {diff:.1e}; {shared['forward_requests']} model calls in "
                           f"{shared['backbone_calls']} group calls of {k} length-sorted passes each", level_at=1.0))
    torch.set_num_threads(threads)
    return rows
