"""``runtime.name: flower-sim``: Flower's Simulation Runtime (Ray backend), one virtual SuperNode per client.

The ServerApp runs in a thread of this process (``serve`` with this config and run directory); the
ClientApps run in Ray actor processes, each caching one backbone for the whole run. Node ``i`` owns
fedpeft client ``i`` (Flower's ``partition-id``). Uses ``flwr.simulation.run_simulation``, which is
deprecated in favour of ``flwr run`` but is the in-process API that lets ``fedpeft run`` drive it.

Each ClientApp computes with the run's torch thread count (``runtime/threads.py``: ``runtime.threads``, unset the
cores the embedded runtime would use), so the numbers are the embedded runtime's. Ray reserves that many CPUs per
client, so as many actors run at once as the usable cores hold at that count, at most one per client: one at a
time by default (each client gets every core, as in the embedded runtime), one per core with
``runtime.threads: 1``; never more threads than cores.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedpeft.config import ExperimentConfig
from fedpeft.runtime.session import StopAfterRound
from fedpeft.runtime.threads import run_threads, usable_cores
from fedpeft.tracking.rundir import RunDir

log = logging.getLogger("fedpeft.flower")


@contextlib.contextmanager
def flower_logging(quiet: bool) -> Iterator[None]:
    """Flower's lines once (its own handler, not also ours), and with ``runtime.progress: false`` only its errors:
    no deprecation notices, no actor chatter (Ray's worker output is not forwarded either)."""
    flwr = logging.getLogger("flwr")
    old = flwr.level, flwr.propagate
    flwr.propagate = False
    if quiet:
        flwr.setLevel(logging.ERROR)
    try:
        yield
    finally:
        flwr.setLevel(old[0])
        flwr.propagate = old[1]


def run_flower_sim(cfg: ExperimentConfig, out_dir: str | Path, resume: bool = False,
                   stop_after_round: int | None = None, num_actors: int | None = None, client_app: Any = None,
                   experiment: Any = None) -> dict[str, Any]:
    """Run (or resume) ``cfg`` in Flower's simulation runtime; returns the summary (as summary.json). ``num_actors``:
    the Ray actors that run at once (default: as many as the usable cores hold at the run's thread count).
    ``client_app`` and ``experiment``: the nodes' ClientApp and the server's experiment in place of fedpeft's own
    (``integrations.transformers``: the user's trainers)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise RuntimeError("runtime.name: 'flower-sim' needs Flower's simulation engine (Ray): "
                           "pip install 'fedpeft[flower]' (make installs it)")
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from fedpeft.runtime.flower.client_app import client_app as fedpeft_client_app
    from fedpeft.runtime.flower.server_app import serve

    cfg = cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"name": "flower-sim"})})
    out: dict[str, Any] = {}
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        out["summary"] = serve(grid, cfg, out_dir, resume=resume, stop_after_round=stop_after_round,
                               join_timeout=120.0, experiment=experiment)

    threads, _ = run_threads(cfg.runtime, RunDir(out_dir), resume)  # what ``serve`` resolves too, in this process
    actors = num_actors or max(1, min(cfg.federation.num_clients, usable_cores() // threads))
    quiet = not cfg.runtime.progress
    backend = {"client_resources": {"num_cpus": threads, "num_gpus": 0.0},
               "init_args": {"num_cpus": actors * threads, "include_dashboard": False} | (
                   {"log_to_driver": False} if quiet else {})}
    with warnings.catch_warnings(), flower_logging(quiet):
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning, module="ray")  # Ray's advice on GPU env vars
        try:
            run_simulation(server_app=server, client_app=client_app or fedpeft_client_app,
                           num_supernodes=cfg.federation.num_clients,
                           backend_config=backend)
        except StopAfterRound:
            raise
        except RuntimeError as e:  # Flower wraps ServerApp exceptions; surface ours unchanged
            cause = e.__cause__ or e.__context__
            if isinstance(cause, StopAfterRound):
                raise cause from None
            raise
    if "summary" not in out:
        raise RuntimeError(f"the Flower simulation ended without a summary; see {Path(out_dir) / 'run.log'}")
    return out["summary"]
