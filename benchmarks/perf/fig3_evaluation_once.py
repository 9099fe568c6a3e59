"""Figure 3: evaluation done once against every client scoring its own shard."""

from __future__ import annotations

from fedpeft.runtime.embedded import InProcessTransport
from fedpeft.runtime.server import RoundDriver
from fedpeft.runtime.session import progress

from benchmarks.perf.common import Figure, alternate, figure, local_work


def figure_3(args) -> list[Figure]:
    b = local_work(args, "soft prompt", f"task.max_test={args.eval_examples}")
    driver = RoundDriver(b.plan.federation, b.method)
    transport = InProcessTransport(b.plan, b.method, b.exp, progress(False), None)
    state, rnd = b.method.server_init(), 1

    got = {}

    def twice():
        msgs = driver.plan_evaluate(state, rnd)
        got["twice"] = b.method.evaluate_global(state), driver.finish_evaluate(rnd, transport.evaluate(rnd, msgs))

    def once():
        msgs = driver.plan_evaluate(state, rnd)
        got["once"] = driver.evaluate_once(state, rnd, sorted(msgs))

    ta, tb = alternate(twice, once, args.reps)
    same = got["twice"] == got["once"]
    n = len(b.exp.test_encoded)
    return [figure("3", f"evaluation of the global state: global test set ({n}) + {args.clients} client shards / "
                   "one pass sliced", ("two passes", "one pass"), ta, tb, "> 1×, metrics identical",
                   lambda r: r > 1 and same,
                   f"global and local metrics and eval bytes identical: {'yes' if same else 'NO'}", level_at=1.0)]
