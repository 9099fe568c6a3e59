"""A SuperNode's long-lived worker: one process per node that keeps the frozen backbone for the whole run.

Flower 1.41 runs every message in a fresh ``flwr-clientapp`` process (``--isolation subprocess``; ``process``
isolation also runs one task per process), so a ClientApp that loaded the model itself would load it once per
round. With ``node-worker='true'`` in the node config (``fedpeft flower supernode`` and ``LocalFederation`` set it)
the ClientApp hands each message to this worker over a local socket instead, starting it on first use and again if
it died (a message cut by its death is retried once: the client states on disk make the retry the same work). The
worker runs ``node_service.serve``, so it loads the backbone once per run; the ``pid`` and ``backbone_loads`` of
every reply show it in metrics.jsonl.

Connection: a Unix socket (``multiprocessing.connection`` with an HMAC challenge on a random key kept in a 0600 file
beside it) carrying a JSON header and the raw codec bytes; nothing is pickled. The worker serves one message at a
time (a node's messages come one after another) and exits when the process that started it on behalf of its
SuperNode is gone, or after ``worker-idle-s`` seconds without a message (default 1800).

Node settings: ``node-worker`` (true/false), ``worker-socket`` (path; default a per-user temporary folder, keyed
by the node's state dir and clients), ``worker-idle-s``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import AuthenticationError, Client, Connection, Listener
from pathlib import Path
from typing import Any

from fedpeft.runtime.flower.records import Reply

log = logging.getLogger("fedpeft.flower.worker")

DEFAULT_IDLE_S = 1800.0
START_TIMEOUT_S = 300.0
_UNREACHABLE = (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, AuthenticationError, EOFError)


def uses_worker(node_config: dict[str, Any]) -> bool:
    return str(node_config.get("node-worker", "false")).lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class WorkerAddress:
    """Where a node's worker listens (``socket``), its key file and its log."""

    socket: Path

    @classmethod
    def for_node(cls, node_config: dict[str, Any]) -> WorkerAddress:
        if node_config.get("worker-socket"):
            return cls(Path(str(node_config["worker-socket"])))
        # Unix socket paths are limited to ~100 bytes: a short name in a per-user folder, keyed by the node
        ident = f"{node_config.get('state-dir', '')}|{node_config.get('partition-ids', '')}"
        folder = Path(tempfile.gettempdir()) / f"fedpeft-{os.getuid()}"
        return cls(folder / f"node-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.sock")

    @property
    def key_file(self) -> Path:
        return self.socket.with_suffix(".key")

    @property
    def log_file(self) -> Path:
        return self.socket.with_suffix(".log")


# ---------------------------------------------------------------- wire: a JSON header, then raw bytes per client


def _send(conn: Connection, header: dict[str, Any], payloads: dict[int, bytes]) -> None:
    conn.send_bytes(json.dumps({**header, "clients": sorted(payloads)}).encode())
    for cid in sorted(payloads):
        conn.send_bytes(payloads[cid])


def _receive(conn: Connection) -> tuple[dict[str, Any], dict[int, bytes]]:
    header = json.loads(conn.recv_bytes())
    if not isinstance(header, dict) or not isinstance(header.get("clients"), list):
        raise ValueError("malformed node-worker header")
    return header, {int(cid): conn.recv_bytes() for cid in header["clients"]}


# ---------------------------------------------------------------- the ClientApp's side


def request(node_config: dict[str, Any], settings: dict[str, Any], payloads: dict[int, bytes],
            train: bool) -> Reply:
    """Have the node's worker serve one message (starting the worker if none answers); its Reply."""
    addr = WorkerAddress.for_node(node_config)
    header = {"op": "train" if train else "evaluate", "settings": settings, "node_config": node_config}
    try:
        head, out = _exchange(addr, node_config, header, payloads)
    except (EOFError, ConnectionError) as e:
        log.warning("the node worker at %s went away during the message (%s); starting it again", addr.socket,
                    type(e).__name__)
        try:
            head, out = _exchange(addr, node_config, header, payloads)
        except (EOFError, ConnectionError) as again:
            raise RuntimeError(f"the node worker at {addr.socket} died twice during one message "
                               f"(see {addr.log_file})") from again
    if "error" in head:
        raise RuntimeError(f"node worker: {head['error']}")
    return Reply(out, {int(k): str(v) for k, v in head["errors"].items()}, dict(head["node"]))


def _exchange(addr: WorkerAddress, node_config: dict[str, Any], header: dict[str, Any],
              payloads: dict[int, bytes]) -> tuple[dict[str, Any], dict[int, bytes]]:
    with _connect(addr, node_config) as conn:
        _send(conn, header, payloads)
        return _receive(conn)


def stop_worker(node_config: dict[str, Any]) -> bool:
    """Ask the node's worker to exit; False if none was running."""
    addr = WorkerAddress.for_node(node_config)
    try:
        with Client(str(addr.socket), family="AF_UNIX", authkey=addr.key_file.read_bytes()) as conn:
            _send(conn, {"op": "stop"}, {})
            _receive(conn)
    except _UNREACHABLE:
        return False
    return True


def _try_connect(addr: WorkerAddress) -> Connection | None:
    try:
        return Client(str(addr.socket), family="AF_UNIX", authkey=addr.key_file.read_bytes())
    except _UNREACHABLE:
        return None


def private_folder(folder: Path) -> None:
    """Make ``folder`` (mode 0700) or check the one there: a real directory (not a link), owned by this user, that
    no one else may enter (``PermissionError`` otherwise). The worker's socket and key live in it, under a name
    anyone can predict in the shared temp dir, so a folder made by someone else would let them stand in for it."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        found = "a link" if stat.S_ISLNK(st.st_mode) else f"uid {st.st_uid}, mode {st.st_mode & 0o777:o}"
        raise PermissionError(f"{folder} must be a directory of user {os.getuid()} with mode 0700, not {found}: "
                              "refusing to put the node worker's socket and key there (remove it, or set "
                              "worker-socket)")


@contextlib.contextmanager
def _start_lock(addr: WorkerAddress) -> Iterator[None]:
    with open(addr.socket.with_suffix(".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # two ClientApps of one node never start two workers
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _connect(addr: WorkerAddress, node_config: dict[str, Any]) -> Connection:
    conn = _try_connect(addr)
    if conn is not None:
        return conn
    private_folder(addr.socket.parent)
    with _start_lock(addr):
        conn = _try_connect(addr)  # another ClientApp may have started it meanwhile
        if conn is not None:
            return conn
        proc = _start(addr, float(node_config.get("worker-idle-s", DEFAULT_IDLE_S)))
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            conn = _try_connect(addr)
            if conn is not None:
                return conn
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    raise RuntimeError(f"the node worker did not start (exit code {proc.poll()}); see {addr.log_file}")


def _start(addr: WorkerAddress, idle_s: float) -> subprocess.Popen:
    addr.socket.unlink(missing_ok=True)  # a dead worker's socket
    fd = os.open(addr.key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    cmd = [sys.executable, "-m", "fedpeft.runtime.flower.node_worker", "--socket", str(addr.socket),
           "--parent-pid", str(os.getppid()), "--idle-s", str(idle_s)]
    with addr.log_file.open("ab") as out:
        # same process group as the SuperNode, so stopping the node's group stops its worker too
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------- the worker process


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Worker:
    def __init__(self, addr: WorkerAddress, parent_pid: int, idle_s: float) -> None:
        self.addr, self.parent_pid, self.idle_s = addr, parent_pid, idle_s
        self.last = time.monotonic()
        self.busy = False

    def watch(self) -> None:
        """Exit when the node is gone, or idle too long (a thread: ``accept`` blocks)."""
        while True:
            time.sleep(1.0)
            gone = not _pid_alive(self.parent_pid)
            if gone or (not self.busy and time.monotonic() - self.last > self.idle_s):
                log.info("node worker %d exits (%s)", os.getpid(), "its node is gone" if gone else "idle")
                self.cleanup()
                os._exit(0)

    def cleanup(self) -> None:
        self.addr.socket.unlink(missing_ok=True)
        self.addr.key_file.unlink(missing_ok=True)

    def handle(self, conn: Connection) -> bool:
        """Serve one message; False when asked to stop."""
        from fedpeft.runtime.flower.node_service import process_info, serve

        header, payloads = _receive(conn)
        if header.get("op") == "stop":
            _send(conn, {}, {})
            return False
        try:
            reply = serve(header["settings"], payloads, header["node_config"], train=header["op"] == "train")
        except Exception as e:  # noqa: BLE001 - reported to the ClientApp, which fails the message
            log.exception("node worker: the message could not be served")
            _send(conn, {"error": f"{type(e).__name__}: {e}", "node": process_info()}, {})
            return True
        _send(conn, {"errors": {str(k): v for k, v in reply.errors.items()}, "node": reply.node}, reply.payloads)
        return True

    def serve_forever(self) -> None:
        listener = Listener(str(self.addr.socket), family="AF_UNIX", authkey=self.addr.key_file.read_bytes())
        threading.Thread(target=self.watch, daemon=True).start()
        log.info("node worker %d listens on %s", os.getpid(), self.addr.socket)
        try:
            while True:
                try:
                    conn = listener.accept()
                except (AuthenticationError, OSError, EOFError) as e:
                    log.warning("node worker: refused a connection (%s: %s)", type(e).__name__, e)
                    continue
                self.busy = True
                try:
                    with conn:
                        if not self.handle(conn):
                            return
                except (EOFError, OSError, ValueError) as e:  # the ClientApp went away (e.g. round timeout)
                    log.warning("node worker: message dropped (%s: %s)", type(e).__name__, e)
                finally:
                    self.busy = False
                    self.last = time.monotonic()
        finally:
            listener.close()
            self.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fedpeft node worker (started by the ClientApp)")
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--parent-pid", required=True, type=int)
    parser.add_argument("--idle-s", type=float, default=DEFAULT_IDLE_S)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _Worker(WorkerAddress(args.socket), args.parent_pid, args.idle_s).serve_forever()


if __name__ == "__main__":
    main()
