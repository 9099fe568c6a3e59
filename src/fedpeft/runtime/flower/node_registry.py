"""Which fedpeft clients each registered SuperNode may serve: client ids bound to the node's authentication key.

With SuperNode authentication (``--enable-supernode-auth``, the default of ``fedpeft flower superlink`` under TLS)
Flower gives each registered public key a node id, and only the holder of the private key connects as that node.
Without more, any admitted node could still claim any fedpeft client in discovery. ``fedpeft flower register
KEY.pub --clients 0,1`` records the node id Flower assigned to the key and the clients it serves in a registry file
on the SuperLink's machine (JSON: node id -> the key's SHA-256 and the client ids; a client belongs to one node);
``fedpeft flower run --registry FILE`` hands it to the ServerApp, whose discovery then accepts a node's claim only
for the clients registered to it (``runtime.flower.transport``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

def _read(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not a node registry ({e})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) and isinstance(v.get("clients"), list)
                                             for v in data.values()):
        raise ValueError(f"{path}: not a node registry (node id -> {{key, clients}})")
    return data


def record(path: str | Path, node_id: int, public_key: str | Path, clients: list[int]) -> None:
    """Bind ``clients`` to ``node_id`` (the key's node); ``ValueError`` if another node has one of them."""
    path = Path(path).expanduser()
    data = _read(path)
    for other, entry in data.items():
        taken = sorted(set(entry["clients"]) & set(clients))
        if taken and int(other) != node_id:
            raise ValueError(f"{path}: clients {taken} are registered to node {other} already")
    key = hashlib.sha256(Path(public_key).read_bytes().strip()).hexdigest()
    data[str(node_id)] = {"key": key, "clients": sorted(set(clients))}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def owners(path: str | Path) -> dict[int, int]:
    """client id -> the node id registered for it."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"--registry: no node registry at {path} (`fedpeft flower register --clients` "
                                "writes it)")
    return {int(c): int(node) for node, entry in _read(path).items() for c in entry["clients"]}
