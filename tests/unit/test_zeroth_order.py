"""Seeded zeroth-order tuning (``zo_sgd``, ``seed_replay``, presets ``decomfl`` and ``fedkseed``) on small tensors and
tiny models: the estimator's equations, that it estimates the gradient, that the server's tensors are the replay of
its history bit for bit, that what travels is the scalars (bytes counted), that client order changes nothing, and
that secure aggregation and Flower give the same run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_overrides

from fedpeft.aggregators.seed_replay import replay_history
from fedpeft.build import build_method
from fedpeft.comm.codec import decode, encode
from fedpeft.experiment import build_experiment
from fedpeft.formats.seeds import COEF
from fedpeft.methods.state import ServerState
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS
from fedpeft.trainers.spsa import add_perturbation_, generator_seed, projected_gradients, replay_
from fedpeft.trainers.zo_sgd import ZOSettings, importance_probabilities, seed_pool

pytestmark = pytest.mark.usefixtures("one_thread")


def _params() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"b": torch.randn(2, 3, generator=g), "a": torch.randn(4, generator=g)}


def _z(params: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """z of one perturbation seed, drawn as the module docstring says: sorted names, one generator."""
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(params[k].shape, generator=g) for k in sorted(params)}


def _quadratic(params: dict[str, torch.Tensor]) -> float:
    return float((params["a"] ** 2).sum() + 3 * (params["b"] * params["b"].flip(0)).sum() + params["a"].sum())


def test_projected_gradients_are_the_finite_differences_and_restore_the_tensors() -> None:
    p, mu, seeds = _params(), 1e-2, [generator_seed(11, i) for i in range(3)]
    before = {k: v.clone() for k, v in p.items()}
    names = sorted(p)
    forward, base = projected_gradients(p, names, lambda: _quadratic(p), seeds, mu, central=False)
    assert base == pytest.approx(_quadratic(before))
    for g, s in zip(forward, seeds):
        z = _z(before, s)
        plus = _quadratic({k: before[k] + mu * z[k] for k in before})
        assert g == pytest.approx((plus - _quadratic(before)) / mu, rel=1e-4)
    central, _ = projected_gradients(p, names, lambda: _quadratic(p), seeds, mu, central=True)
    for g, s in zip(central, seeds):
        z = _z(before, s)
        plus, minus = (_quadratic({k: before[k] + e * mu * z[k] for k in before}) for e in (1, -1))
        assert g == pytest.approx((plus - minus) / (2 * mu), rel=1e-4)
    for k in p:  # θ + μz - μz: restored up to float rounding
        torch.testing.assert_close(p[k], before[k], atol=1e-6, rtol=0)
    assert generator_seed(11, 2) == 11 * 19 + 2  # DeComFL's get_rng


def test_the_estimator_averages_to_the_gradient() -> None:
    p = _params()
    names = sorted(p)
    want = {k: v.clone().requires_grad_(True) for k, v in p.items()}
    ((want["a"] ** 2).sum() + 3 * (want["b"] * want["b"].flip(0)).sum() + want["a"].sum()).backward()
    true = torch.cat([want[k].grad.flatten() for k in names])
    seeds = list(range(4000))
    grads, _ = projected_gradients(p, names, lambda: _quadratic(p), seeds, 1e-3, central=True)
    est = sum(g * torch.cat([_z(p, s)[k].flatten() for k in names]) for g, s in zip(grads, seeds)) / len(seeds)
    cosine = float(est @ true / (est.norm() * true.norm()))
    assert cosine > 0.95  # E[(zᵀ∇L) z] = ∇L: a random direction would give ~0


def test_replay_is_the_update_and_skips_zero_scalars() -> None:
    p, lr = _params(), 0.1
    out = {k: v.clone() for k, v in p.items()}
    grads = torch.tensor([[2.0, 0.0], [-1.0, 4.0]])
    replay_(out, sorted(p), [5, 9], grads, lr)
    want = {k: v.clone() for k, v in p.items()}
    for t, s in enumerate([5, 9]):
        for i in range(2):
            z = _z(p, generator_seed(s, i))
            want = {k: want[k] - lr * float(grads[t, i]) / 2 * z[k] for k in want}
    for k in p:
        torch.testing.assert_close(out[k], want[k])
    again = {k: v.clone() for k, v in p.items()}
    add_perturbation_(again, sorted(p), 123, 0.0)
    assert all(torch.equal(again[k], p[k]) for k in p)


def _cfg(preset: str, **extra):
    over = {"method.name": preset, "method.adapter.num_tokens": None, "method.trainer.max_steps": None,
            "method.trainer.batch_size": 8, "federation.rounds": 3, "task.num_examples": 120} | extra
    return load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in over.items()}))


def _run(cfg, path: Path) -> list[dict]:
    run_embedded(cfg, path)
    return RunDir(path).read_metrics()


def _strip(recs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS + ("flower_record_bytes", "model_loads")}
            for r in recs]


PRO = {"method.trainer.local_steps": 6, "method.trainer.pool_size": 64, "method.trainer.sampling": "importance"}


@pytest.mark.parametrize("preset, extra", [("decomfl", {}),
                                           ("fedkseed", {"method.trainer.local_steps": 6,
                                                         "method.trainer.pool_size": 256}),
                                           ("fedkseed", PRO)])
def test_the_global_model_is_its_history_replayed_bit_for_bit(tmp_path: Path, preset: str, extra: dict) -> None:
    cfg = _cfg(preset, **extra)
    recs = _run(cfg, tmp_path / "run")
    assert [r["num_ok"] for r in recs] == [3, 3, 3]
    _, server, _, _ = RunDir(tmp_path / "run").load_checkpoint()
    st = ServerState.from_message(server)
    settings = ZOSettings(**cfg.method.trainer.typed_settings.model_dump())
    initial = build_method(cfg, build_experiment(cfg)).initial_params()
    rebuilt = replay_history(initial, st.agg, settings, cfg.seed)
    assert rebuilt.keys() == st.glob.keys()
    assert all(torch.equal(rebuilt[k], st.glob[k]) for k in st.glob)
    moved = [k for k in st.glob if not torch.equal(st.glob[k], initial[k])]
    assert len(moved) == len(st.glob)  # every weight of the full model moved
    assert st.agg.tensors["history.coef"].shape[0] == 3


@pytest.mark.parametrize("task", ["generation", "linear"])
def test_lora_on_a_generation_task_and_a_linear_readout_train_from_forward_passes(tmp_path: Path, task) -> None:
    """zo_sgd on an adapter's tensors (LoRA on a causal LM writing responses; the linear readout's head on an
    encoder): the server's tensors are still the replay of the history, and only the adapter moved."""
    from conformance.test_adapters import _generation_task

    over = ({"model.name": "tiny-llama", "method.adapter.name": "lora", **_generation_task(tmp_path)}
            if task == "generation" else {"model.readout": "linear", "method.adapter.name": "soft_prompt",
                                          "method.adapter.num_tokens": 3})
    cfg = _cfg("decomfl", **over, **{"federation.rounds": 2})
    recs = _run(cfg, tmp_path / "run")
    assert [r["num_ok"] for r in recs] == [3, 3] and all(r["loss"] == r["loss"] for r in recs)  # finite
    _, server, _, _ = RunDir(tmp_path / "run").load_checkpoint()
    st = ServerState.from_message(server)
    initial = build_method(cfg, build_experiment(cfg)).initial_params()
    rebuilt = replay_history(initial, st.agg, ZOSettings(**cfg.method.trainer.typed_settings.model_dump()), cfg.seed)
    assert all(torch.equal(rebuilt[k], st.glob[k]) for k in st.glob)
    assert any(not torch.equal(st.glob[k], initial[k]) for k in st.glob)


def test_decomfl_uploads_its_scalars_under_a_kilobyte_and_fedkseed_one_per_candidate(tmp_path: Path) -> None:
    dec = _run(_cfg("decomfl", **{"federation.rounds": 1}), tmp_path / "d")[0]
    per_client = [c["bytes_up"] for c in dec["clients"]]
    assert max(per_client) <= 1024 and dec["clients"][0]["forward_passes"] == 6  # P + 1 of one step
    ks = _run(_cfg("fedkseed", **{"federation.rounds": 1, "method.trainer.local_steps": 2}), tmp_path / "k")[0]
    assert min(c["bytes_up"] for c in ks["clients"]) > 4096 * 4  # [K] float32 scalars
    assert ks["clients"][0]["forward_passes"] == 4  # central difference: 2 per step


def test_client_order_changes_nothing_and_the_seeds_travel_down() -> None:
    cfg = _cfg("decomfl", **{"method.trainer.local_steps": 2})
    exp = build_experiment(cfg)
    method = build_method(cfg, exp)
    sent = method.configure_round(method.server_init(), 1, [0, 1, 2])
    seeds = {tuple(decode(encode(m, method.wire)).tensors["zo.seeds"].tolist()) for m in sent.values()}
    assert len(seeds) == 1 and len(next(iter(seeds))) == 2  # the same step seeds for every client

    def replies(order: list[int]) -> dict[int, bytes]:
        return {c: encode(method.client_update(decode(encode(sent[c], method.wire)), exp.client(c)), method.wire)
                for c in order}

    forward, backward = replies([0, 1, 2]), replies([2, 1, 0])
    assert forward == backward
    assert set(decode(forward[0]).tensors) == {COEF}  # the model never travels up


def test_the_seed_history_download_gives_the_dense_run_and_clients_catch_up(tmp_path: Path) -> None:
    over = {"federation.rounds": 4, "federation.clients_per_round": 1}  # each client misses rounds
    history = _run(_cfg("decomfl", **over), tmp_path / "history")
    dense = _run(_cfg("decomfl", **over, **{"method.downlink.name": "dense"}), tmp_path / "dense")
    assert [(r["accuracy"], r["loss"]) for r in history] == [(r["accuracy"], r["loss"]) for r in dense]
    first = {}
    for r in history:
        for c in r["clients"]:
            first.setdefault(c["client"], r["round"])
    assert max(first.values()) >= 2  # a client whose first round replays the rounds before it
    down = [c["bytes_down"] for r in history for c in r["clients"]]
    assert max(down) < 2048 < min(c["bytes_down"] for r in dense for c in r["clients"])


def test_importance_probabilities_are_fedkseed_pro_s() -> None:
    """FedKSeed-Pro's ``calculate_probabilities`` (its server.py) on per-seed histories, written out as there."""
    import numpy as np

    initial, clip = 0.5, 3.0
    history = [[initial, 1.0, -2.0], [initial], [initial, 10.0], [initial, -0.25, 0.25, 0.5]]
    psi = np.array([np.mean(np.abs(np.clip(h, -clip, clip))) for h in history])
    norm = (psi - psi.min()) / (psi.max() + 1e-10 - psi.min())
    theirs = np.exp(norm - norm.max()) / np.exp(norm - norm.max()).sum()
    abs_sum = torch.tensor([sum(min(abs(g), clip) for g in h[1:]) for h in history])
    hits = torch.tensor([len(h) - 1 for h in history], dtype=torch.float64)
    ours = importance_probabilities(abs_sum, hits, initial, clip)
    assert np.allclose(ours.numpy(), theirs, rtol=1e-12) and float(ours.sum()) == pytest.approx(1.0)
    uniform = importance_probabilities(torch.zeros(5), torch.zeros(5), 0.0, clip)
    assert torch.allclose(uniform, torch.full((5,), 0.2, dtype=torch.float64))


def test_importance_sampling_keeps_every_draw_and_sends_its_probabilities(tmp_path: Path) -> None:
    """FedKSeed-Pro: the server's history counts every draw of every client (3 rounds x 3 clients x 6 steps), its
    amplitude sums are the clipped |g| the clients reported, the probabilities travel down (K floats, counted) and
    stop being uniform after round 1; plain pool sampling sends none."""
    recs = _run(_cfg("fedkseed", **PRO), tmp_path / "pro")
    _, server, _, _ = RunDir(tmp_path / "pro").load_checkpoint()
    st = ServerState.from_message(server)
    hits, amp = st.agg.tensors["importance.hits"], st.agg.tensors["importance.abs_sum"]
    assert float(hits.sum()) == pytest.approx(3 * 3 * 6, rel=1e-5) and float(amp.min()) >= 0
    assert hits.shape == (64,) and int((hits > 0.5).sum()) > 1
    probs = importance_probabilities(amp, hits, 0.0, 1000.0)
    assert float(probs.max() / probs.min()) > 1.01  # not uniform any more
    plain = _run(_cfg("fedkseed", **(PRO | {"method.trainer.sampling": "uniform"})), tmp_path / "plain")
    for pro_round, plain_round in zip(recs, plain):  # + K float32 probabilities down, + 2K floats up
        assert min(c["bytes_down"] - q["bytes_down"] for c, q in zip(pro_round["clients"], plain_round["clients"])) \
            >= 64 * 4
        assert min(c["bytes_up"] - q["bytes_up"] for c, q in zip(pro_round["clients"], plain_round["clients"])) \
            >= 2 * 64 * 2
    with pytest.raises(ValueError, match="sampling: importance draws among the K candidate seeds"):
        _cfg("decomfl", **{"method.trainer.sampling": "importance"})
    with pytest.raises(ValueError, match="set method.aggregator.weighting: examples"):
        _run(_cfg("fedkseed", **PRO, **{"method.aggregator.weighting": "uniform"}), tmp_path / "uniform")


def test_dp_seeds_releases_the_clipped_mean_scalars_plus_noise_of_std_z_s_over_m() -> None:
    """DP-FedAvg on the scalars: the inner seed_replay replays the uniform mean of the clipped vectors plus
    N(0, (zS/m)^2) from the round's stream; epsilon from the accountant."""
    from fedpeft.aggregators.base import AGGREGATORS, WRAPPERS, AggregatorContext
    from fedpeft.aggregators.dp_seeds import DpSeedsSettings
    from fedpeft.aggregators.seed_replay import SeedReplaySettings
    from fedpeft.comm.update import Update
    from fedpeft.privacy import gaussian_epsilon
    from fedpeft.rng import SHARED, torch_rng

    zo = ZOSettings(local_steps=1, perturbations=2)
    ctx = AggregatorContext(num_clients=4, seed=3, sampling_rate=0.5, trainer=zo)
    inner = AGGREGATORS.get("seed_replay")(SeedReplaySettings(weighting="uniform"), ctx)
    agg = WRAPPERS.get("dp_seeds")(DpSeedsSettings(clip=1.0, noise_multiplier=0.8), ctx, inner)
    glob = _params()
    ups = [Update(0, {COEF: torch.tensor([3.0, 4.0])}, 50), Update(1, {COEF: torch.tensor([0.3, -0.4])}, 1)]
    new, state = agg.aggregate(glob, ups, agg.init(glob), 2)
    std = 0.8 * 1.0 / 2
    noise = std * torch.randn(2, generator=torch_rng(3, 2, SHARED, "dp-seeds"), dtype=torch.float64)
    expect = (torch.tensor([0.6 + 0.3, 0.8 - 0.4], dtype=torch.float64) / 2 + noise).float()  # weights ignored
    assert torch.allclose(state.tensors["history.coef"][-1], expect, atol=1e-6)
    plain_new, _ = inner.aggregate(glob, [Update(0, {COEF: state.tensors["history.coef"][-1]}, 1)],
                                   inner.init(glob), 2)
    assert all(torch.equal(new[k], plain_new[k]) for k in glob)  # the model is the replay of the noised mean
    assert state.scalars["clipped"] == 1 and state.scalars["dp_noise_std"] == pytest.approx(std)
    assert state.scalars["epsilon"] == pytest.approx(gaussian_epsilon(2, 0.8, 0.5, 1e-5))
    with pytest.raises(ValueError, match="weighting: uniform"):
        WRAPPERS.get("dp_seeds")(DpSeedsSettings(clip=1.0, noise_multiplier=0.8), ctx,
                                 AGGREGATORS.get("seed_replay")(SeedReplaySettings(), ctx))


def test_dp_seeds_runs_decomfl_and_refuses_what_it_cannot_protect(tmp_path: Path) -> None:
    dp = {"method.wrappers": "[{name: dp_seeds, clip: 50.0, noise_multiplier: 0.5}]", "federation.rounds": 2}
    recs = _run(_cfg("decomfl", **dp), tmp_path / "dp")
    assert [r["num_ok"] for r in recs] == [3, 3]
    eps = [r["server"]["epsilon"] for r in recs]
    assert 0 < eps[0] < eps[1]
    _, server, _, _ = RunDir(tmp_path / "dp").load_checkpoint()
    st = ServerState.from_message(server)
    cfg = _cfg("decomfl", **dp)
    initial = build_method(cfg, build_experiment(cfg)).initial_params()
    rebuilt = replay_history(initial, st.agg, ZOSettings(**cfg.method.trainer.typed_settings.model_dump()), cfg.seed)
    assert all(torch.equal(rebuilt[k], st.glob[k]) for k in st.glob)  # post-processing of the noised history
    with pytest.raises(ValueError, match=r"'dp_seeds' combines \(seed, scalar\) pairs"):
        _cfg("fedavg-full", **{"method.wrappers": "[{name: dp_seeds, clip: 1.0, noise_multiplier: 0.5}]"})


def test_pool_is_the_run_seed_s_and_zo_refuses_plain_aggregators() -> None:
    a, b = seed_pool(7, 16), seed_pool(7, 16)
    assert (a == b).all() and a.min() >= 1 and len(set(a.tolist())) == 16
    with pytest.raises(ValueError, match="seed_replay"):
        _cfg("decomfl", **{"method.aggregator.name": "fedavg"})


def test_secure_aggregation_gives_the_plain_run(tmp_path: Path) -> None:
    over = {"federation.rounds": 2}
    plain = _run(_cfg("decomfl", **over), tmp_path / "plain")
    secagg = {"federation.secure_aggregation": "{num_shares: 3, reconstruction_threshold: 2, clipping_range: 256}"}
    secure = _run(_cfg("decomfl", **over, **secagg), tmp_path / "sec")
    for p, s in zip(plain, secure):
        assert s["loss"] == pytest.approx(p["loss"], abs=1e-6)
    # FedKSeed-Pro's draw counts and amplitudes are sums too: weight x the secure mean gives them back, within
    # SecAgg+'s quantization step times the total weight per candidate (here a few per cent of 36 draws)
    _run(_cfg("fedkseed", **PRO, **over, **secagg), tmp_path / "pro")
    _, server, _, _ = RunDir(tmp_path / "pro").load_checkpoint()
    assert float(ServerState.from_message(server).agg.tensors["importance.hits"].sum()) == \
        pytest.approx(2 * 3 * 6, rel=0.1)


@pytest.mark.slow
def test_decomfl_on_flower_sim_equals_embedded(tmp_path: Path) -> None:
    pytest.importorskip("flwr")
    from fedpeft.runtime.flower.simulation import run_flower_sim

    cfg = _cfg("decomfl", **{"federation.rounds": 2})
    run_embedded(cfg, tmp_path / "embedded")
    run_flower_sim(cfg, tmp_path / "sim")
    emb, sim = (RunDir(tmp_path / n).read_metrics() for n in ("embedded", "sim"))
    assert _strip(sim) == _strip(emb)
