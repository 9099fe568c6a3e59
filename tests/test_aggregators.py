import pytest
import torch

from fedpeft.aggregators import AGGREGATORS, AggregatorContext, uniform_mean, weighted_mean
from fedpeft.comm.codec import Message
from fedpeft.comm.update import Update
from fedpeft.registry import UnknownNameError


def fedavg(params, num_examples):
    """The registered ``fedavg`` aggregator on plain tensors."""
    agg = AGGREGATORS.get("fedavg")(None, AggregatorContext(num_clients=len(params), seed=0))
    updates = [Update(i, p, n) for i, (p, n) in enumerate(zip(params, num_examples))]
    return agg.aggregate(params[0] if params else {}, updates, Message(), 1)[0]


def test_fedavg_is_sample_weighted_mean_eq5():
    a = {"p": torch.tensor([[1.0, 2.0]])}
    b = {"p": torch.tensor([[3.0, -2.0]])}
    c = {"p": torch.tensor([[0.0, 4.0]])}
    out = fedavg([a, b, c], [1, 3, 4])
    expected = (1 * a["p"] + 3 * b["p"] + 4 * c["p"]) / 8
    assert torch.allclose(out["p"], expected, atol=1e-7)


def test_equal_sizes_give_plain_mean():
    ups = [{"p": torch.randn(3, 4)} for _ in range(5)]
    out = fedavg(ups, [7] * 5)
    assert torch.allclose(out["p"], torch.stack([u["p"] for u in ups]).mean(0), atol=1e-6)
    assert torch.allclose(uniform_mean(ups)["p"], out["p"], atol=1e-6)


def test_zero_weight_client_has_no_effect():
    a, b = {"p": torch.ones(2)}, {"p": torch.full((2,), 100.0)}
    assert torch.equal(weighted_mean([a, b], [1.0, 0.0])["p"], a["p"])


def test_invalid_weights_raise():
    with pytest.raises(ValueError, match="no updates"):
        fedavg([], [])
    with pytest.raises(ValueError, match="non-negative"):
        weighted_mean([{"p": torch.ones(1)}], [-1.0])


def test_registry_lists_allowed_names():
    with pytest.raises(UnknownNameError, match="unknown aggregator .krum2.; allowed: .*fedavg.*uniform"):
        AGGREGATORS.get("krum2")
