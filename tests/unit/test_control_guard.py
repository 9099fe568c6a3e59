"""fedpeft's SuperLink guard: the Control and Runtime APIs answer trusted addresses only, the Fleet API everyone."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from starlette.applications import Starlette  # noqa: E402
from starlette.responses import PlainTextResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from fedpeft.runtime.flower.superlink import (  # noqa: E402
    ControlFromTrustedOnly,
    install,
    is_trusted,
    networks,
    trusted_networks,
)


def _app(allowed):
    ok = lambda request: PlainTextResponse("flower")  # noqa: E731
    app = Starlette(routes=[Route(p, ok, methods=["POST"]) for p in
                            ("/v1/control/start-run", "/v1/runtime/pull-messages", "/v1/fleet/pull-messages")])
    return ControlFromTrustedOnly(app, allowed)


@pytest.mark.parametrize("peer, path, status", [
    ("203.0.113.7", "/v1/control/start-run", 403),   # a stranger submitting a run
    ("203.0.113.7", "/v1/runtime/pull-messages", 403),
    ("203.0.113.7", "/v1/fleet/pull-messages", 200),  # a SuperNode from anywhere
    ("127.0.0.1", "/v1/control/start-run", 200),
    ("127.8.0.1", "/v1/control/start-run", 200),
    ("::1", "/v1/control/start-run", 200),
    ("10.1.2.3", "/v1/control/start-run", 200),       # in --control-from 10.1.0.0/16
    ("10.2.0.1", "/v1/control/start-run", 403),
    ("testclient", "/v1/control/start-run", 403),     # not an address at all
])
def test_control_and_runtime_apis_answer_trusted_peers_only(peer, path, status):
    client = TestClient(_app(trusted_networks("0.0.0.0", ["10.1.0.0/16"])), client=(peer, 40000))
    res = client.post(path)
    assert res.status_code == status
    if status == 403:
        assert "does not answer" in res.json()["detail"]


def test_trusted_networks_add_the_bound_host_only_when_it_is_one_address():
    assert trusted_networks("0.0.0.0") == ["127.0.0.0/8", "::1/128"]
    assert trusted_networks("::") == ["127.0.0.0/8", "::1/128"]
    assert trusted_networks("192.0.2.9")[-1] == "192.0.2.9"
    assert trusted_networks("superlink.example") == ["127.0.0.0/8", "::1/128"]
    allowed = networks(trusted_networks("0.0.0.0"))
    assert is_trusted("::ffff:127.0.0.1", allowed) and not is_trusted("::ffff:192.0.2.9", allowed)
    assert not is_trusted(None, allowed)


def test_a_malformed_network_is_refused_before_flower_starts():
    with pytest.raises(ValueError, match="--control-from: '10.0.0.0/33'"):
        networks(["10.0.0.0/33"])


def test_install_puts_the_guard_outermost_in_flowers_superlink(monkeypatch):
    import flwr.superlink.extensions as extensions
    from flwr.superlink.main import _get_middleware

    monkeypatch.setattr(extensions, "get_middleware", extensions.get_middleware)
    install(["127.0.0.0/8"])
    assert _get_middleware()[0].cls is ControlFromTrustedOnly


def test_the_node_registry_binds_each_client_to_one_node(tmp_path):
    from fedpeft.runtime.flower.node_registry import owners, record

    key = tmp_path / "n.pub"
    key.write_text("ecdsa-sha2-nistp384 AAAA test\n")
    path = tmp_path / "reg" / "nodes.json"
    record(path, 11, key, [0, 1])
    record(path, 12, key, [2])
    record(path, 11, key, [0, 1, 3])  # a node re-registered with more clients
    assert owners(path) == {0: 11, 1: 11, 2: 12, 3: 11}
    with pytest.raises(ValueError, match=r"clients \[2\] are registered to node 12 already"):
        record(path, 13, key, [2, 4])
    with pytest.raises(FileNotFoundError, match="--registry: no node registry"):
        owners(tmp_path / "missing.json")
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a node registry"):
        owners(path)


def test_superlink_admits_only_registered_nodes_under_tls_unless_told_otherwise(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import fedpeft.cli.flower as flower_cli
    from fedpeft.cli import app

    started = []
    monkeypatch.setattr(flower_cli, "_exec", started.append)
    files = []
    for name in ("server.pem", "server.key", "ca.crt"):
        (tmp_path / name).write_text("x")
        files.append(tmp_path / name)
    tls = ["--ssl-certfile", str(files[0]), "--ssl-keyfile", str(files[1]), "--ssl-ca-certfile", str(files[2])]
    runner = CliRunner()
    assert runner.invoke(app, ["flower", "superlink", *tls]).exit_code == 0
    assert "--enable-supernode-auth" in started[-1]
    res = runner.invoke(app, ["flower", "superlink", *tls, "--insecure-no-node-auth"])
    assert res.exit_code == 0 and "--enable-supernode-auth" not in started[-1] and "claim clients" in res.output
    assert runner.invoke(app, ["flower", "superlink", "--insecure"]).exit_code == 0
    assert "--enable-supernode-auth" not in started[-1]  # Flower's node authentication needs TLS
