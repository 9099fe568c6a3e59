"""The SuperLink fedpeft starts: Flower's own, with its Control and Runtime APIs answered only from trusted addresses.

Flower 1.41 serves the Fleet API (SuperNodes), the Control API (``flwr run``, ``flwr ls``, ``flwr supernode
register``) and the Runtime API (the ServerApp process) on one HTTP address (``--host``/``--port``); its open-source
edition authenticates no caller of the Control API. A SuperLink that SuperNodes on other machines can reach would
therefore run the app of anyone who can reach its port (the ServerApp runs on the SuperLink host). Nothing in Flower
splits the Control API onto its own address any more (``--control-api-address`` is deprecated and ignored), so
fedpeft adds one ASGI middleware through Flower's own extension hook (``flwr.superlink.extensions.get_middleware``,
outermost): a request under ``/v1/control`` or ``/v1/runtime`` whose peer is not a trusted address is answered 403
before any Flower code sees it, and logged. Trusted by default: loopback, and the address the SuperLink binds to when
that is one host (the SuperLink's own ServerApp process connects from there). Users on other machines submit through
an SSH tunnel to the SuperLink's loopback (``ssh -L 9093:127.0.0.1:9093 superlink-host``), or are named with
``--control-from``. ``--i-understand-anyone-can-submit`` turns the guard off.

Run as ``python -m fedpeft.runtime.flower.superlink --control-from SPEC [flower-superlink's arguments]``: SPEC is
comma-separated addresses or CIDR networks, or ``any``.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

log = logging.getLogger("fedpeft.superlink")

CONTROL_FROM = "--control-from"
GUARDED = ("/v1/control", "/v1/runtime")  # Flower 1.41's Control and Runtime API routes (the Fleet API: /v1/fleet)
LOOPBACK = ("127.0.0.0/8", "::1/128")
ANY = "any"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def networks(spec: Iterable[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The trusted networks named by addresses or CIDR networks (``ValueError`` naming a malformed one)."""
    out = []
    for item in spec:
        try:
            out.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError as e:
            raise ValueError(f"--control-from: {item!r} is not an IP address or network ({e})") from None
    return out


def trusted_networks(host: str, control_from: Iterable[str] = ()) -> list[str]:
    """Loopback, the bound ``host`` when it is one address (not every interface), and ``control_from``."""
    extra = []
    try:
        ip = ipaddress.ip_address(host)
        if not ip.is_unspecified and not ip.is_loopback:
            extra.append(str(ip))
    except ValueError:  # a host name: only loopback and what the user names
        pass
    return [*LOOPBACK, *extra, *control_from]


def is_trusted(peer: str | None, allowed: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    """Whether a peer address lies in one of the trusted networks (an IPv4-mapped IPv6 peer as its IPv4)."""
    if peer is None:
        return False
    try:
        ip = ipaddress.ip_address(peer.split("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == n.version and ip in n for n in allowed)


class ControlFromTrustedOnly:
    """ASGI middleware: requests to the Control and Runtime APIs from an untrusted peer get 403, logged; every
    other request (the Fleet API the SuperNodes use, health) passes to the app unchanged."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], allowed: Iterable[str]) -> None:
        self.app, self.allowed = app, networks(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope.get("type") not in ("http", "websocket") or not path.startswith(GUARDED):
            await self.app(scope, receive, send)
            return
        peer = (scope.get("client") or (None,))[0]
        if is_trusted(peer, self.allowed):
            await self.app(scope, receive, send)
            return
        log.warning("refused %s %s from %s: the Control and Runtime APIs answer only %s (fedpeft flower superlink "
                    "--control-from)", scope.get("method", "WS"), path, peer, ", ".join(map(str, self.allowed)))
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"detail": f"fedpeft: the SuperLink's Control API does not answer {peer}; submit from the "
                                     "SuperLink's machine or through an SSH tunnel to it"}).encode()
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def install(allowed: Iterable[str] | None) -> None:
    """Put the guard outermost in every SuperLink app Flower creates in this process (``None``: no guard)."""
    from starlette.middleware import Middleware

    import flwr.superlink.extensions as extensions

    if allowed is None:
        return
    allowed = list(allowed)
    networks(allowed)  # fail before Flower starts on a malformed network
    flower_middleware = extensions.get_middleware
    extensions.get_middleware = lambda: (Middleware(ControlFromTrustedOnly, allowed=allowed), *flower_middleware())


def main(argv: list[str] | None = None) -> None:
    """``flower-superlink`` with the guard: ``--control-from SPEC`` first, Flower's own arguments after it."""
    import sys

    from flwr.superlink.cli.flower_superlink import flower_superlink

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != CONTROL_FROM:
        raise SystemExit(f"usage: python -m fedpeft.runtime.flower.superlink {CONTROL_FROM} SPEC [flower-superlink "
                         "arguments]")
    spec = args[1]
    sys.argv = [sys.argv[0], *args[2:]]  # Flower parses sys.argv
    os.environ.pop("FLWR_INTERNAL_GRPC_CONTROL_API", None)  # Flower's unguarded gRPC Control API stays off
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s fedpeft: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    install(None if spec.strip() == ANY else [s for s in spec.split(",") if s.strip()])
    if spec.strip() == ANY:
        log.warning("the Control API answers every address that reaches this port: anyone can submit runs")
    flower_superlink()


if __name__ == "__main__":
    main()
