"""SecAgg+'s masks from a cryptographic generator keyed by the whole secret: ChaCha20 (the ``cryptography`` package).

Flower 1.41 expands every mask seed (a node's 32-byte private-mask seed, each pair's 32-byte shared key) with
``numpy.random.RandomState`` seeded by the XOR of the seed's 32-bit words (``secaggplus_utils.pseudo_rand_gen``;
upstream issue flwrlabs/flower#7522, the fix open as #7570). Two seeds with the same XOR give the same mask, and
since the weight factor travels inside the masked vector, a curious server can test each of the 2^32 candidate
seeds against a masked vector exactly. Here the mask is the ChaCha20 keystream under the key SHA-256(seed) (the
full 256 bits), read as unsigned 64-bit integers reduced modulo the field (a power of two, so every residue is
equally likely).

fedpeft runs both sides of the protocol (its ServerApp and its ClientApp, or both in the embedded runtime), so
``use_strong_masks`` puts this generator in place of Flower's in its two SecAgg+ modules, once per process; every
fedpeft process that runs the protocol calls it first. The server names the generator in each round's settings
(``MASKS``) and a node refuses a round that names another, so two fedpeft versions that would mask differently
never sum garbage.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

MASKS = "chacha20-sha256-v1"  # the generator's name, sent by the server and checked by every node
_LOCK = threading.Lock()


def prg(seed: bytes, num_range: int, dimensions_list: list[tuple[int, ...]]) -> list[np.ndarray]:
    """Masks of the given shapes, uniform in [0, num_range) (a power of two), from the ChaCha20 keystream under
    SHA-256(seed); the same seed gives the same masks, any other seed independent ones. The signature is Flower's
    ``pseudo_rand_gen``'s."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    if num_range <= 0 or num_range & (num_range - 1) or num_range > 2**63:
        raise ValueError(f"the mask field must be a power of two up to 2^63, not {num_range}")
    sizes = [int(np.prod(d, dtype=np.int64)) for d in dimensions_list]
    key = hashlib.sha256(seed).digest()
    stream = Cipher(algorithms.ChaCha20(key, b"\0" * 16), mode=None).encryptor().update(b"\0" * (8 * sum(sizes)))
    values = (np.frombuffer(stream, dtype="<u8") & np.uint64(num_range - 1)).astype(np.int64)
    out, start = [], 0
    for dims, n in zip(dimensions_list, sizes, strict=True):
        out.append(values[start:start + n].reshape(dims))
        start += n
    return out


def use_strong_masks() -> None:
    """Flower's SecAgg+ client mod and server workflow draw their masks from ``prg`` in this process (idempotent)."""
    from importlib import import_module

    # by module path: the package re-exports a function under the node-side module's name
    node_side = import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    server_side = import_module("flwr.server.workflow.secure_aggregation.secaggplus_workflow")
    with _LOCK:
        node_side.pseudo_rand_gen = prg
        server_side.pseudo_rand_gen = prg
