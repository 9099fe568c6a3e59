"""``runtime.name: flower``: submit the fedpeft ServerApp/ClientApp to a running SuperLink with ``flwr run``.

The Flower app (FAB format v1, ``runtime.flower.app_bundle``) is written into ``<run dir>/flower-app/``: its run
config holds the experiment and this run's keys (the run directory, ``resume``, the timeouts), so ``flwr run
<run dir>/flower-app fedpeft`` alone submits the same run again. The SuperLink connection is written to
``<run dir>/flower-app/.flwr/config.toml`` (``FLWR_HOME`` for the ``flwr`` CLI only; never part of the FAB). The
ServerApp writes the run directory itself. Every machine needs fedpeft installed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from fedpeft.config import ExperimentConfig
from fedpeft.runtime.flower.app_bundle import write_app
from fedpeft.runtime.flower.local import BIN, flower_env, flwr_home
from fedpeft.runtime.flower.node_registry import owners

SUPERLINK_ENV = "FEDPEFT_SUPERLINK"
ROOT_CERT_ENV = "FEDPEFT_ROOT_CERTIFICATES"
INSECURE_ENV = "FEDPEFT_INSECURE"
DEFAULT_SUPERLINK = "127.0.0.1:9093"


def run_flower(cfg: ExperimentConfig, out_dir: str | Path, resume: bool = False, superlink: str | None = None,
               round_timeout: float | None = None, join_timeout: float = 300.0, rejoin_wait: float = 0.0,
               timeout: float | None = None, root_cert: str | Path | None = None,
               insecure: bool = False, registry: str | Path | None = None) -> dict[str, Any]:
    """Submit the run to the SuperLink at ``superlink`` (default ``$FEDPEFT_SUPERLINK``) and wait for it: over TLS
    verified against ``root_cert`` (default ``$FEDPEFT_ROOT_CERTIFICATES``), or in plain text only when asked
    (``insecure``, or ``$FEDPEFT_INSECURE=1``); with ``registry`` (a node registry on the SuperLink's machine,
    ``runtime.flower.node_registry``) each client is served only by the node registered for it."""
    import json

    cfg = cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"name": "flower"})})
    superlink = superlink or os.environ.get(SUPERLINK_ENV, DEFAULT_SUPERLINK)
    root_cert = root_cert or os.environ.get(ROOT_CERT_ENV) or None
    insecure = insecure or os.environ.get(INSECURE_ENV) == "1"
    if root_cert is None and not insecure:
        raise ValueError(f"the connection to the SuperLink {superlink} needs TLS: give its CA certificate "
                         f"(--root-certificates or ${ROOT_CERT_ENV}), or --insecure (${INSECURE_ENV}=1) to send the "
                         "run in plain text")
    if root_cert is not None and not Path(root_cert).is_file():
        raise FileNotFoundError(f"--root-certificates: no such file {root_cert}")
    if registry is not None:
        registry = Path(registry).expanduser().resolve()
        owners(registry)  # a missing or malformed registry fails here, not in the ServerApp
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not resume and (out / "metrics.jsonl").exists():
        raise FileExistsError(f"{out} already holds a run; use --resume or another --out")
    summary = out / "summary.json"
    summary.unlink(missing_ok=True)  # success is judged by the ServerApp writing it anew
    app = write_app(out / "flower-app", cfg, {"out": str(out), "resume": resume,
                                              "round-timeout": float(round_timeout or 0),
                                              "join-timeout": float(join_timeout), "rejoin-wait": float(rejoin_wait),
                                              "node-registry": str(registry or "")})
    home = flwr_home(app / ".flwr", superlink, root_cert)
    cmd = [str(BIN / "flwr"), "run", str(app), "fedpeft", "--stream"]
    with (out / "flwr_run.log").open("ab") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=flower_env() | {"FLWR_HOME": str(home)},
                              timeout=timeout, check=False)
    if proc.returncode != 0 or not summary.exists():
        raise RuntimeError(f"`flwr run` exited with {proc.returncode} and no summary.json in {out}; "
                           f"see {out / 'flwr_run.log'} and {out / 'run.log'}")
    return json.loads(summary.read_text())
