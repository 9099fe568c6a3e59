"""fedpeft's SecAgg+ masks: ChaCha20 under SHA-256 of the whole seed, where Flower 1.41 folds the seed to 32 bits."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedpeft.runtime.secure.masks import prg  # noqa: E402

M = 2**32
DIMS = [(1,), (40, 25)]


def _colliding_seeds() -> tuple[bytes, bytes]:
    """Two different 32-byte seeds whose 32-bit words XOR to the same value (Flower's fold)."""
    a = bytes(range(32))
    flip = (0xDEADBEEF).to_bytes(4, "little")
    b = bytes(x ^ y for x, y in zip(a[:4], flip)) + bytes(x ^ y for x, y in zip(a[4:8], flip)) + a[8:]
    return a, b


def test_flowers_generator_gives_two_different_seeds_the_same_mask():
    """Upstream flwrlabs/flower#7522, reproduced: the reason fedpeft brings its own generator."""
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen as flower_prg

    a, b = _colliding_seeds()
    assert a != b
    assert all(np.array_equal(x, y) for x, y in zip(flower_prg(a, M, DIMS), flower_prg(b, M, DIMS)))


def test_different_seeds_give_independent_masks_and_the_same_seed_the_same():
    a, b = _colliding_seeds()
    ma, mb, ma2 = prg(a, M, DIMS), prg(b, M, DIMS), prg(a, M, DIMS)
    assert all(np.array_equal(x, y) for x, y in zip(ma, ma2))
    assert [x.shape for x in ma] == DIMS and all(x.dtype == np.int64 for x in ma)
    assert np.mean(ma[1] == mb[1]) < 0.01  # no more agreement than chance (2^-32 a value)
    diff = (ma[1].ravel() - mb[1].ravel()) % M
    assert abs(np.corrcoef(ma[1].ravel(), mb[1].ravel())[0, 1]) < 0.2 and diff.std() > M / 5


def test_masks_are_uniform_over_the_field():
    values = prg(b"\x01" * 32, 2**16, [(64_000,)])[0]
    assert values.min() >= 0 and values.max() < 2**16
    counts = np.bincount(values >> 12, minlength=16)  # 16 bins of 4,096 residues
    chi2 = (((counts - 4000) ** 2) / 4000).sum()
    assert chi2 < 37.7  # chi-square, 15 degrees of freedom, p = 0.001


def test_a_field_that_is_not_a_power_of_two_is_refused():
    with pytest.raises(ValueError, match="power of two"):
        prg(b"\x00" * 32, 3 * 2**20, DIMS)


def test_the_protocol_masks_with_fedpefts_generator_on_both_sides():
    from importlib import import_module

    from fedpeft.runtime.secure.masks import use_strong_masks

    use_strong_masks()
    node_side = import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    server_side = import_module("flwr.server.workflow.secure_aggregation.secaggplus_workflow")
    assert node_side.pseudo_rand_gen is prg and server_side.pseudo_rand_gen is prg


def test_a_node_refuses_a_round_masked_with_another_generator():
    from fedpeft.comm.codec import Message, encode
    from fedpeft.config import SecureAggregationConfig
    from fedpeft.runtime.secure.inprocess import grid_class, task_identity
    from fedpeft.runtime.secure.protocol import node_handler, secure_round

    def run_node(settings, payloads):
        return {c: encode(Message({"w": __import__("torch").ones(3)}, {"num_examples": 1})) for c in payloads}, {}

    def older_server(handler):
        """A server naming another generator in the masked stage's settings."""
        def deliver(msg):
            config = msg.content.config_records.get("fitins.config")
            if config is not None and "fedpeft.setting.masks" in config:
                config["fedpeft.setting.masks"] = "flower-numpy-32"
            return handler(msg)
        return deliver

    groups = {n: {n - 1: encode(Message(scalars={"round": 1}))} for n in (1, 2, 3)}
    grid = grid_class()({n: older_server(node_handler(run_node, n)) for n in groups})
    with task_identity():
        out = secure_round(SecureAggregationConfig(), 0, 1, groups, grid)
    assert out.mean is None and all("masks with 'flower-numpy-32'" in e for e in grid.errors.values())
