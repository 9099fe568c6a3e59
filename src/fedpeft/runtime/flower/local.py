"""Start and stop a Flower SuperLink and SuperNodes as separate OS processes (tests, benchmarks, CLI).

Every process is started in its own session (process group), so ``stop`` ends it together with
the children Flower spawns (SuperExec, ``flwr-serverapp``, ``flwr-clientapp``) and nothing else.
All addresses are explicit; tests pass ``host="127.0.0.1"`` and ports from ``free_port``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedpeft.runtime.flower.security import Certificates
from fedpeft.runtime.node_policy import NodePolicy

BIN = Path(sys.executable).parent


def flower_env() -> dict[str, str]:
    """Environment for Flower processes: this venv's bin first on PATH (Flower spawns ``flower-superexec``,
    ``flwr-serverapp``, ``flwr-clientapp`` by name), no update check (offline), unbuffered logs."""
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return os.environ | {"PATH": path, "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1"}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_port(host: str, port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f} s")


@dataclass
class Proc:
    """One started process (and its process group); ``log`` receives stdout and stderr."""

    name: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        """Signal this process group, wait, then SIGKILL the group if it is still there."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:  # children (SuperExec, app processes) may outlive the leader; they share its group
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.popen.poll() is None:
            self.popen.wait(5)


def start(name: str, cmd: list[str], log: Path, cwd: Path | None = None) -> Proc:
    log.parent.mkdir(parents=True, exist_ok=True)
    f = log.open("ab")
    popen = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=flower_env(), cwd=cwd,
                             start_new_session=True)
    f.close()
    return Proc(name, popen, log)


def superlink_cmd(host: str, port: int, certs: Certificates | None = None, node_auth: bool = False,
                  control_from: Sequence[str] | None = ()) -> list[str]:
    """Flower's SuperLink on ``host:port`` behind fedpeft's Control API guard (``runtime.flower.superlink``): TLS
    with ``certs`` (else ``--insecure``), admitting only registered SuperNodes with ``node_auth``; the Control and
    Runtime APIs answer loopback, the bound host and ``control_from`` only (``None``: every address). The app's
    dependencies are not installed at run time (fedpeft is installed on the machine: ``runtime.flower.app_bundle``)."""
    from fedpeft.runtime.flower.superlink import ANY, CONTROL_FROM, trusted_networks

    tls = (["--ssl-ca-certfile", str(certs.ca_cert), "--ssl-certfile", str(certs.server_cert),
            "--ssl-keyfile", str(certs.server_key)] if certs is not None else ["--insecure"])
    trusted = ANY if control_from is None else ",".join(trusted_networks(host, control_from))
    return [sys.executable, "-m", "fedpeft.runtime.flower.superlink", CONTROL_FROM, trusted, *tls,
            *(["--enable-supernode-auth"] if node_auth else []), "--disable-runtime-dependency-installation",
            "--host", host, "--port", str(port)]


def node_config(partition_ids: list[int], state_dir: str | Path | None = None,
                data_dir: str | Path | None = None, worker: bool = True, policy: NodePolicy | None = None) -> str:
    """The ``--node-config`` string of a SuperNode owning ``partition_ids``, serving its messages from one
    long-lived worker process (``worker``, see ``node_worker``) or a model load per message, holding the server to
    its ``policy`` (``runtime.node_policy``)."""
    parts = [f"partition-ids='{','.join(str(i) for i in partition_ids)}'", f"node-worker='{str(worker).lower()}'"]
    if state_dir is not None:
        parts.append(f"state-dir='{Path(state_dir).resolve()}'")
    if data_dir is not None:
        parts.append(f"data-dir='{Path(data_dir).resolve()}'")
    if policy is not None and policy.node_config():
        parts.append(policy.node_config())
    return " ".join(parts)


def supernode_cmd(superlink: str, partition_ids: list[int], runtime_port: int, host: str = "127.0.0.1",
                  state_dir: str | Path | None = None, data_dir: str | Path | None = None,
                  root_cert: str | Path | None = None, auth_key: str | Path | None = None,
                  worker: bool = True, policy: NodePolicy | None = None) -> list[str]:
    """``flower-supernode`` owning ``partition_ids``: verifying the SuperLink's certificate against ``root_cert``
    (else ``--insecure``), authenticating with the private key ``auth_key`` when the SuperLink asks for it; its
    messages served by one long-lived worker (``worker``); refusing what its ``policy`` refuses."""
    tls = ["--root-certificates", str(root_cert)] if root_cert is not None else ["--insecure"]
    auth = ["--auth-supernode-private-key", str(auth_key)] if auth_key is not None else []
    return [str(BIN / "flower-supernode"), *tls, *auth, "--superlink", superlink,
            "--node-config", node_config(partition_ids, state_dir, data_dir, worker, policy),
            "--host", host, "--port", str(runtime_port)]


def flwr_home(home: Path, superlink: str, root_cert: str | Path | None = None) -> Path:
    """A ``FLWR_HOME`` whose ``config.toml`` points the ``flwr`` CLI at ``superlink`` (TLS with ``root_cert``)."""
    home.mkdir(parents=True, exist_ok=True)
    tls = f'root-certificates = "{Path(root_cert).resolve()}"' if root_cert is not None else "insecure = true"
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "fedpeft"\n\n[superlink.fedpeft]\naddress = "{superlink}"\n{tls}\n')
    return home


def register_node(public_key: str | Path, superlink: str, home: Path, root_cert: str | Path | None = None) -> int:
    """Register a SuperNode's public key with the SuperLink (``flwr supernode register``); returns the node id
    Flower gives the key."""
    import json

    flwr_home(home, superlink, root_cert)
    res = subprocess.run([str(BIN / "flwr"), "supernode", "register", str(public_key), "fedpeft", "--format", "json"],
                         capture_output=True, text=True, env=flower_env() | {"FLWR_HOME": str(home)}, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"flwr supernode register {public_key} failed ({res.returncode}): "
                           f"{(res.stdout + res.stderr).strip()[-500:]}")
    start = res.stdout.find("{")
    try:
        return int(json.loads(res.stdout[start:])["node-id"])
    except (ValueError, KeyError) as e:
        raise RuntimeError(f"flwr supernode register {public_key}: no node id in its output "
                           f"({res.stdout.strip()[-300:]!r})") from e


@dataclass
class LocalFederation:
    """A SuperLink plus SuperNodes on one machine; use as a context manager so all are stopped."""

    root: Path
    host: str = "127.0.0.1"
    port: int = 0
    certs: Certificates | None = None  # TLS (else insecure)
    node_auth: bool = False  # admit only registered SuperNodes
    nodes: dict[str, Proc] = field(default_factory=dict)
    superlink: Proc | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start_superlink(self) -> None:
        self.port = self.port or free_port(self.host)
        self.superlink = start("superlink", superlink_cmd(self.host, self.port, self.certs, self.node_auth),
                               self.root / "superlink.log")
        wait_port(self.host, self.port)

    @property
    def root_cert(self) -> Path | None:
        return self.certs.ca_cert if self.certs is not None else None

    def start_node(self, name: str, partition_ids: list[int], state_dir: Path | None = None,
                   data_dir: Path | None = None, auth_key: Path | None = None, worker: bool = True,
                   policy: NodePolicy | None = None) -> Proc:
        state_dir = state_dir or self.root / "state" / name
        cmd = supernode_cmd(self.address, partition_ids, free_port(self.host), self.host, state_dir, data_dir,
                            self.root_cert, auth_key, worker, policy)
        self.nodes[name] = start(name, cmd, self.root / f"{name}.log")
        return self.nodes[name]

    def register(self, public_key: Path) -> int:
        return register_node(public_key, self.address, self.root / "flwr_home", self.root_cert)

    def stop(self) -> None:
        for p in list(self.nodes.values()):
            p.stop()
        if self.superlink is not None:
            self.superlink.stop()

    def __enter__(self) -> LocalFederation:
        self.root.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
