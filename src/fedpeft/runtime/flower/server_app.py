"""The Flower ServerApp: fedpeft's shared round loop (``runtime.session.run_rounds``) over a ``Grid``.

``serve`` is what both Flower runtimes call: it opens the run directory (same contract as the
embedded runtime), builds the experiment on the server (the global test set and the backbone for
``evaluate_global``), and runs the rounds with a ``FlowerTransport``. ``server_app`` is the
deployment entry point loaded by ``flwr run``: the experiment and its run keys (``out``, ``resume``,
``round-timeout``, ``rejoin-wait``, ``join-timeout``, ``node-registry``) come from the run config of the app
(``runtime.flower.app_bundle``).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedpeft.build import build, run_plan
from fedpeft.config import ExperimentConfig, dump_config
from fedpeft.runtime.flower.app_bundle import experiment_of
from fedpeft.runtime.flower.node_registry import owners
from fedpeft.runtime.flower.transport import FlowerTransport
from fedpeft.runtime.session import log_to, open_run, progress, run_rounds
from fedpeft.runtime.threads import for_run

log = logging.getLogger("fedpeft.flower")


def run_key(config_yaml: str, out_dir: Path) -> str:
    """Names this run's folder in every node's state dir; stable across --resume of the same run."""
    return hashlib.sha256(f"{out_dir.resolve()}\n{config_yaml}".encode()).hexdigest()[:16]


def serve(grid: Grid, cfg: ExperimentConfig, out_dir: str | Path, resume: bool = False,
          stop_after_round: int | None = None, round_timeout: float | None = None, join_timeout: float = 300.0,
          rejoin_wait: float = 0.0, registry: str | Path | None = None, experiment: Any = None) -> dict[str, Any]:
    """Run (or resume) the experiment with clients reached through ``grid``; returns the summary.
    ``round_timeout`` (seconds) overrides ``federation.round_timeout``. The run's torch thread count
    (``runtime.threads``, else resolved here) goes to every ClientApp with each message. ``registry``: the node
    registry (``runtime.flower.node_registry``) whose bindings of clients to nodes discovery enforces.
    ``experiment``: the server's experiment, built already (``integrations.transformers``), in place of the config's."""
    config_yaml, plan = dump_config(cfg), run_plan(cfg)
    with open_run(plan, out_dir, resume) as run, log_to(run.root / "run.log"), \
            progress(plan.runtime.progress) as bar, for_run(plan.runtime, run, resume) as threads:
        settings = {"config_yaml": config_yaml, "run_key": run_key(config_yaml, run.root),
                    "state_dir": str((run.root / "client_state").resolve()), "checkpointed_round": 0,
                    "threads": threads}
        b = build(cfg, experiment)
        transport = FlowerTransport(grid, settings, plan.federation.num_clients,
                                    round_timeout=round_timeout or plan.federation.round_timeout,
                                    join_timeout=join_timeout, rejoin_wait=rejoin_wait,
                                    secure=plan.federation.secure_aggregation, seed=plan.seed,
                                    uniform=b.method.aggregator.uniform_weights,
                                    registered=owners(registry) if registry else None)
        return run_rounds(plan, run, b.exp, b.method, transport, resume, stop_after_round, bar, threads)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """Deployment entry point (``flwr run``): the experiment and the run's arguments come from the run config."""
    rc = dict(context.run_config)
    if not rc.get("out"):
        raise ValueError("the run config needs out='<run dir on the SuperLink machine>' (flwr run APP --run-config "
                         "\"out='/path/run'\"; `fedpeft flower run` and `fedpeft flower app --run-dir` set it)")
    logging.getLogger("fedpeft").setLevel(logging.INFO)
    cfg = experiment_of(rc)
    timeout = float(rc.get("round-timeout", 0) or 0)
    serve(grid, cfg, str(rc["out"]), resume=bool(rc.get("resume", False)),
          round_timeout=timeout or None, join_timeout=float(rc.get("join-timeout", 300)),
          rejoin_wait=float(rc.get("rejoin-wait", 0)), registry=str(rc.get("node-registry", "")) or None)
