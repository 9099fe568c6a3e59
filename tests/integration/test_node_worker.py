"""The SuperNode's long-lived worker (Flower deployment): one backbone load for many messages, the same replies as
serving in the ClientApp's own process, a restart when it died (also in the middle of a message), and no service
to a peer without the key."""

from __future__ import annotations

import os
import signal
import threading
import time
from multiprocessing.connection import AuthenticationError, Client

import pytest
from conftest import tiny_overrides

from fedpeft.build import build
from fedpeft.config import dump_config
from fedpeft.resolve import load_config
from fedpeft.runtime.flower import node_worker
from fedpeft.runtime.flower.node_service import serve
from fedpeft.runtime.server import RoundDriver


pytestmark = pytest.mark.usefixtures("one_thread")  # the worker process builds with runtime.threads=1 as well


def _message(tmp_path, **extra):
    """A tiny run's round-1 instructions and the settings a FlowerTransport would send with them (one torch
    thread in both processes: bit-equal replies need the same thread count)."""
    cfg = load_config(None, tiny_overrides(runtime__threads=1, **extra))
    b = build(cfg)
    driver = RoundDriver(cfg.federation, b.method)
    state = b.method.server_init()
    plan = driver.plan_round(state, 1)
    settings = {"config_yaml": dump_config(cfg), "run_key": "k", "state_dir": str(tmp_path / "unused"),
                "checkpointed_round": 0}
    return plan.instructions, settings


def _node(tmp_path, name: str) -> dict:
    return {"partition-ids": "0,1,2", "state-dir": str(tmp_path / name), "node-worker": "true"}


def _dead(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our child (the test started it): reap the zombie
                return True
        except ChildProcessError:
            pass
        time.sleep(0.1)
    return False


@pytest.fixture
def worker_node(tmp_path):
    node = _node(tmp_path, "node")
    yield node
    node_worker.stop_worker(node)


def test_worker_serves_rounds_with_one_load_and_restarts_after_it_died(tmp_path, worker_node):
    payloads, settings = _message(tmp_path)
    local = serve({**settings, "round": 1}, payloads, _node(tmp_path, "in-process"), train=True)

    r1 = node_worker.request(worker_node, {**settings, "round": 1}, payloads, train=True)
    assert r1.payloads == local.payloads and not r1.errors  # the same reply bytes as serving in-process
    assert r1.node["pid"] != os.getpid() and r1.node["backbone_loads"] == 1
    r2 = node_worker.request(worker_node, {**settings, "round": 2}, payloads, train=True)
    ev = node_worker.request(worker_node, {**settings, "round": 2}, payloads, train=False)
    assert r2.node["pid"] == ev.node["pid"] == r1.node["pid"]  # one process for the whole run
    assert ev.node["backbone_loads"] == 1 and ev.node["experiment_builds"] == 1 and ev.node["messages"] == 3
    assert (tmp_path / "node" / "k" / "client_0").is_dir()  # client state in the node's own state dir

    os.kill(int(r1.node["pid"]), signal.SIGKILL)
    assert _dead(int(r1.node["pid"]))
    again = node_worker.request(worker_node, {**settings, "round": 2}, payloads, train=False)
    assert again.node["pid"] != r1.node["pid"] and again.node["backbone_loads"] == 1
    assert again.payloads == ev.payloads  # evaluation of the stored round-2 states, unchanged by the restart


def test_a_message_cut_by_the_workers_death_is_served_by_a_new_worker(tmp_path, worker_node):
    payloads, settings = _message(tmp_path, faults__hang_clients="[0]", faults__hang_s=3.0)
    first = node_worker.request(worker_node, {**settings, "round": 1}, payloads, train=False)
    result = {}
    t = threading.Thread(target=lambda: result.update(
        r=node_worker.request(worker_node, {**settings, "round": 1}, payloads, train=True)))
    t.start()
    time.sleep(1.0)  # the worker is inside client 0's hang
    os.kill(int(first.node["pid"]), signal.SIGKILL)
    t.join(120)
    assert "r" in result and not result["r"].errors and sorted(result["r"].payloads) == [0, 1, 2]
    assert result["r"].node["pid"] != first.node["pid"]


def test_a_peer_without_the_key_is_refused_and_stop_ends_the_worker(tmp_path, worker_node):
    payloads, settings = _message(tmp_path)
    rep = node_worker.request(worker_node, {**settings, "round": 1}, payloads, train=False)
    addr = node_worker.WorkerAddress.for_node(worker_node)
    assert addr.key_file.stat().st_mode & 0o077 == 0  # the key is readable by its owner only
    with pytest.raises(AuthenticationError):
        Client(str(addr.socket), family="AF_UNIX", authkey=b"not the key")
    assert node_worker.request(worker_node, {**settings, "round": 1}, payloads, train=False).node["pid"] == \
        rep.node["pid"]  # still serving after the refused peer
    assert node_worker.stop_worker(worker_node)
    assert _dead(int(rep.node["pid"]))
    assert not node_worker.stop_worker(worker_node)


def test_node_worker_setting():
    assert node_worker.uses_worker({"node-worker": "true"}) and node_worker.uses_worker({"node-worker": True})
    assert not node_worker.uses_worker({"node-worker": "false"}) and not node_worker.uses_worker({})
    a = node_worker.WorkerAddress.for_node({"state-dir": "/x" * 200, "partition-ids": "0"})
    assert len(str(a.socket)) < 100  # Unix socket paths are short; a long state dir is hashed
    assert a != node_worker.WorkerAddress.for_node({"state-dir": "/x" * 200, "partition-ids": "1"})


def test_the_worker_folder_must_be_private_to_this_user(tmp_path):
    """The worker's folder has a name anyone can predict in the shared temp dir: one that others may enter, or a
    link planted there, is refused rather than used."""
    import os

    from fedpeft.runtime.flower.node_worker import private_folder

    private_folder(tmp_path / "mine")
    assert (os.stat(tmp_path / "mine").st_mode & 0o777) == 0o700
    (tmp_path / "open").mkdir(mode=0o777)
    os.chmod(tmp_path / "open", 0o777)
    with pytest.raises(PermissionError, match="mode 777"):
        private_folder(tmp_path / "open")
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    with pytest.raises(PermissionError, match="not a link"):
        private_folder(tmp_path / "link")
