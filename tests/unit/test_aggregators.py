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


# ---------------------------------------------------------------- every registered parameter aggregator


def _build(name: str, num_clients: int):
    from fedpeft.trainers.gradient import GradientSettings

    entry = AGGREGATORS.entry(name)
    settings = entry.settings.model_validate({}) if entry.settings is not None else None
    slices = {"a": [((0,), 0, 0, 1), ((1, 2), 0, 1, 3)]}  # head-assignable rows of "a" (head_weighted)
    return entry.obj(settings, AggregatorContext(num_clients, 0, trainer=GradientSettings(lr=0.1),
                                                 head_slices=slices))


def _updates(glob, num_clients, seed):
    g = torch.Generator().manual_seed(seed)
    return [Update(c, {k: v + torch.randn(v.shape, generator=g) for k, v in glob.items()}, 3 + 2 * c,
                   {"head_alpha": torch.rand(3, generator=g)}, {"steps": 2, "train_loss": 0.5})
            for c in range(num_clients)]


PARAM_AGGREGATORS = [n for n in AGGREGATORS.names() if "params" in AGGREGATORS.get(n).accepts]


@pytest.mark.parametrize("name", PARAM_AGGREGATORS)
def test_every_parameter_aggregator_is_invariant_to_client_order(name):
    """Any aggregator registered now or later: same result for any order of the same updates, over two rounds."""
    glob = {"a": torch.randn(3, 2, generator=torch.Generator().manual_seed(0)), "b": torch.zeros(4)}
    results = []
    for perm in ([0, 1, 2, 3, 4, 5, 6], [6, 2, 4, 0, 1, 5, 3]):
        agg = _build(name, 7)
        g, state = dict(glob), agg.init(glob)
        for rnd in (1, 2):
            ups = _updates(g, 7, rnd)
            g, state = agg.aggregate(g, [ups[i] for i in perm], state, rnd)
        results.append(g)
    for k in glob:
        torch.testing.assert_close(results[0][k], results[1][k], rtol=1e-6, atol=1e-6)
        assert results[0][k].dtype == torch.float32 and torch.isfinite(results[0][k]).all()
