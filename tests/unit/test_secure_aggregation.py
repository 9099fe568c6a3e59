"""Secure aggregation (SecAgg+ by Flower's own workflow and mod): the unmasked mean equals the plain weighted mean
within the quantization bound, dropped clients are unmasked through the threshold, too many drops halt the round,
and nothing a client sends carries its update in the clear."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedpeft.comm.codec import Message, decode, encode
from fedpeft.config import SecureAggregationConfig

flwr = pytest.importorskip("flwr")

from fedpeft.runtime.secure.inprocess import grid_class, task_identity  # noqa: E402
from fedpeft.runtime.secure.protocol import node_handler, node_id, secure_round  # noqa: E402

CLIENTS = [0, 1, 2, 3, 4]
WEIGHTS = {0: 10, 1: 20, 2: 30, 3: 40, 4: 50}


def _update(c: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(c)
    return {"a": torch.randn(30, 40, generator=g) * 0.1, "b": torch.randn(5, generator=g)}


def _run_node(settings, payloads):
    """Each client of the node trains: its reply is its fixed update, weight and loss."""
    for payload in payloads.values():
        assert decode(payload).scalars["round"] == 1
    return {c: encode(Message(_update(c), {"num_examples": WEIGHTS[c], "train_loss": 0.5 + c})) for c in payloads}, {}


def _handlers():
    return {node_id(c): node_handler(_run_node, node_id(c)) for c in CLIENTS}


def _groups():
    return {node_id(c): {c: encode(Message(scalars={"round": 1}))} for c in CLIENTS}


def _run(cfg=None, drop=None, seed=0):
    cfg = cfg or SecureAggregationConfig(num_shares=5, reconstruction_threshold=3)
    grid = grid_class()(_handlers(), drop)
    with task_identity():
        outcome = secure_round(cfg, seed, 1, _groups(), grid)
    return outcome, grid


def _plain(clients):
    total = sum(WEIGHTS[c] for c in clients)
    return {k: sum(WEIGHTS[c] * _update(c)[k].double() for c in clients) / total for k in ("a", "b")}


def test_the_unmasked_mean_is_the_weighted_mean_within_the_quantization_bound():
    cfg = SecureAggregationConfig(num_shares=5, reconstruction_threshold=3)
    outcome, grid = _run(cfg)
    want = _plain(CLIENTS)
    # one client's value is rounded to a step of 2c / Q after scaling by n_k / max_weight: |error| <= step / ratio
    step = 2 * cfg.clipping_range / cfg.quantization_range
    bound = max(step * cfg.max_weight / WEIGHTS[c] for c in CLIENTS)
    for k in want:
        err = np.abs(outcome.mean[k] - want[k].numpy()).max()
        assert 0 < err <= bound, (k, err, bound)
    assert outcome.weight == sum(WEIGHTS.values())
    assert {c: s["train_loss"] for c, s in outcome.scalars.items()} == {c: 0.5 + c for c in CLIENTS}
    assert all(grid.bytes_up[node_id(c)] > 0 and grid.bytes_down[node_id(c)] > 0 for c in CLIENTS)


def test_the_server_learns_the_share_of_the_weight_whose_upload_was_clipped():
    """Flower's mod scales a node's average by n_k / max_weight before it clips to [-c, c], so a value v is clipped
    when |v| > c · max_weight / n_k. The masked vector says for which share of the weight (nothing about which
    client), so the run can warn that the mean is off by more than the rounding."""
    assert _run()[0].clipped == 0.0
    cfg = SecureAggregationConfig(num_shares=5, reconstruction_threshold=3, clipping_range=2.0, max_weight=50.0)
    outcome, _ = _run(cfg)
    peak = {c: max(float(t.abs().max()) for t in _update(c).values()) for c in CLIENTS}
    over = [c for c in CLIENTS if peak[c] * WEIGHTS[c] / cfg.max_weight > cfg.clipping_range]
    unscaled_only = [c for c in CLIENTS if peak[c] > cfg.clipping_range and c not in over]
    assert over and unscaled_only  # a value beyond c that the scaling brings inside is not clipped, nor counted
    assert outcome.clipped == pytest.approx(sum(WEIGHTS[c] for c in over) / sum(WEIGHTS.values()), abs=1e-4)
    assert "fedpeft.clipped" not in outcome.mean


def test_a_node_heavier_than_max_weight_refuses_to_upload_and_the_round_says_why():
    outcome, grid = _run(SecureAggregationConfig(num_shares=5, reconstruction_threshold=3, max_weight=35.0))
    assert set(outcome.scalars) == {0, 1, 2} and outcome.mean is not None  # 10, 20, 30 examples: within it
    assert all("exceeds secure_aggregation.max_weight 35" in grid.errors[node_id(c)] for c in (3, 4))


def test_a_field_too_small_for_the_sum_is_refused_before_anything_is_sent():
    from fedpeft.resolve import load_config

    small = {"num_shares": 3, "reconstruction_threshold": 2, "modulus_range": 8388608}
    with pytest.raises(ValueError, match="modulus_range: 8388608 cannot hold the sum of 5 clients"):
        load_config(None, ["federation.num_clients=5", f"federation.secure_aggregation={small}".replace("'", "")])
    outcome, grid = _run(SecureAggregationConfig(num_shares=5, reconstruction_threshold=3, modulus_range=8388608))
    assert outcome.mean is None and "would wrap modulus_range" in outcome.halted and not grid.bytes_down


def test_the_same_seed_gives_the_same_mean_bit_for_bit():
    a, _ = _run(seed=3)
    b, _ = _run(seed=3)
    c, _ = _run(seed=4)
    assert all(np.array_equal(a.mean[k], b.mean[k]) for k in a.mean)
    assert any(not np.array_equal(a.mean[k], c.mean[k]) for k in a.mean)  # only the rounding differs


def test_a_client_that_drops_after_sharing_its_keys_is_unmasked_and_left_out():
    outcome, grid = _run(drop=lambda node, stage: node == node_id(2) and stage == "collect_masked_vectors")
    assert outcome.mean is not None and set(outcome.scalars) == {0, 1, 3, 4}
    want = _plain([0, 1, 3, 4])
    for k in want:
        assert np.abs(outcome.mean[k] - want[k].numpy()).max() < 1e-3


@pytest.mark.parametrize("stage", ["setup", "share_keys", "collect_masked_vectors"])
def test_a_client_that_drops_at_any_stage_before_its_upload_is_left_out_and_the_round_completes(stage):
    """Bell et al. exclude a client gone before it shared its keys: Flower 1.41 asks its neighbours for shares they
    never received (KeyError), and the round halted."""
    outcome, grid = _run(drop=lambda node, s: node == node_id(2) and s == stage)
    assert outcome.halted is None and set(outcome.scalars) == {0, 1, 3, 4} and grid.dropped_at == {node_id(2): stage}
    want = _plain([0, 1, 3, 4])
    assert all(np.abs(outcome.mean[k] - want[k].numpy()).max() < 1e-3 for k in want)


def test_a_client_that_drops_after_its_upload_is_still_in_the_mean():
    outcome, _ = _run(drop=lambda node, s: node == node_id(2) and s == "unmask")
    want = _plain(CLIENTS)
    assert set(outcome.scalars) == set(CLIENTS) and all(np.abs(outcome.mean[k] - want[k].numpy()).max() < 1e-3
                                                        for k in want)


def test_a_node_with_several_clients_masks_their_weighted_mean_together():
    """A deployed SuperNode owning clients 0 and 1 is one party: the server's mean is still every client's."""
    groups = {1: {0: encode(Message(scalars={"round": 1})), 1: encode(Message(scalars={"round": 1}))}}
    groups |= {node_id(c): {c: encode(Message(scalars={"round": 1}))} for c in (2, 3, 4)}
    handlers = {n: node_handler(_run_node, n) for n in groups}
    with task_identity():
        outcome = secure_round(SecureAggregationConfig(num_shares=4, reconstruction_threshold=2), 0, 1, groups,
                               grid_class()(handlers))
    want = _plain(CLIENTS)
    assert set(outcome.scalars) == set(CLIENTS) and outcome.weight == sum(WEIGHTS.values())
    assert all(np.abs(outcome.mean[k] - want[k].numpy()).max() < 1e-3 for k in want)


def test_uniform_weights_mask_weight_one_per_client():
    """For an aggregator that weighs clients alike the unmasked mean is the plain average, whatever n_k."""
    with task_identity():
        outcome = secure_round(SecureAggregationConfig(num_shares=5, reconstruction_threshold=3), 0, 1, _groups(),
                               grid_class()(_handlers()), uniform=True)
    want = {k: sum(_update(c)[k].double() for c in CLIENTS) / len(CLIENTS) for k in ("a", "b")}
    assert outcome.weight == len(CLIENTS)
    assert all(np.abs(outcome.mean[k] - want[k].numpy()).max() < 1e-3 for k in want)


def test_too_many_dropouts_halt_the_round_with_nothing_applied():
    outcome, _ = _run(drop=lambda node, stage: node in (node_id(1), node_id(2), node_id(3))
                      and stage == "collect_masked_vectors")
    assert outcome.mean is None and not outcome.scalars


def test_no_masked_reply_carries_a_clients_update():
    """What each client uploads in the masked stage is uniform noise mod 2^32 to the server: uncorrelated with the
    client's own values (which its quantized, unmasked vector follows exactly)."""
    from flwr.common import bytes_to_ndarray

    seen = []

    cfg = SecureAggregationConfig(num_shares=5, reconstruction_threshold=3)
    handlers = {}
    for c in CLIENTS:
        inner = _handlers()[node_id(c)]

        def handler(msg, inner=inner, c=c):
            reply = inner(msg)
            cfgs = reply.content.config_records["secaggplus_configs"]
            if "masked_params" in cfgs:
                seen.append((c, [bytes_to_ndarray(b) for b in cfgs["masked_params"]]))
            return reply
        handlers[node_id(c)] = handler
    with task_identity():
        secure_round(cfg, 0, 1, _groups(), grid_class()(handlers))
    assert len(seen) == len(CLIENTS)
    for c, arrays in seen:
        # the mod's vector is [weight factor, a, b, clipped flag]; each entry in [0, 2^32), the masks uniform over it
        masked = np.concatenate([a.ravel() for a in arrays[1:3]]).astype(np.float64)
        mine = np.concatenate([_update(c)[k].numpy().ravel() for k in ("a", "b")]).astype(np.float64)
        assert masked.min() >= 0 and masked.max() < cfg.modulus_range
        assert abs(np.corrcoef(masked, mine)[0, 1]) < 0.15
        assert masked.std() > 0.2 * cfg.modulus_range  # spread over the whole field, not around the values


# ---------------------------------------------------------------- whole runs


def _cfg(**extra):
    from conftest import tiny_overrides

    from fedpeft.resolve import load_config

    over = {"method.name": "fedprompt", "federation.num_clients": 5, "federation.rounds": 2,
            "federation.secure_aggregation": {"num_shares": 5, "reconstruction_threshold": 3}} | extra
    return load_config(None, tiny_overrides(**{k.replace(".", "__"): v for k, v in over.items()}))


@pytest.mark.parametrize("stage", ["setup", "share_keys", "collect_masked_vectors", "unmask"])
def test_faults_drop_clients_at_each_protocol_stage_of_a_whole_run(stage, tmp_path, one_thread):
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    run_embedded(_cfg(**{"faults.fail_clients": [1], "faults.rounds": [1], "faults.secure_stage": stage}),
                 tmp_path / "run")
    first, second = RunDir(tmp_path / "run").read_metrics()[-2:]
    status = {c["client"]: c["status"] for c in first["clients"]}
    assert status[1] == ("ok" if stage == "unmask" else "failed") and first["num_ok"] == (5 if stage == "unmask" else 4)
    assert second["num_ok"] == 5  # the next round has every client again


def test_a_secure_run_learns_what_the_plain_run_learns_and_counts_the_protocols_bytes(tmp_path, one_thread):
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    secure = _cfg()
    plain = _cfg(**{"federation.secure_aggregation": None})
    run_embedded(secure, tmp_path / "secure")
    run_embedded(plain, tmp_path / "plain")
    s, p = RunDir(tmp_path / "secure").read_metrics(), RunDir(tmp_path / "plain").read_metrics()
    assert [r["num_ok"] for r in s] == [5, 5] and [r["secure_clipped_share"] for r in s] == [0.0, 0.0]
    # the same training, the mean off by the quantization error only
    assert abs(s[-1]["loss"] - p[-1]["loss"]) < 1e-3
    a = RunDir(tmp_path / "secure").load_checkpoint()[1].tensors["prompt"]
    b = RunDir(tmp_path / "plain").load_checkpoint()[1].tensors["prompt"]
    assert 0 < float((a - b).abs().max()) < 1e-3
    # every stage's messages counted: more than the plain exchange, both ways
    assert s[0]["bytes_up"] > p[0]["bytes_up"] and s[0]["bytes_down"] > p[0]["bytes_down"]
    assert [c["train_loss"] for c in s[0]["clients"]] == [c["train_loss"] for c in p[0]["clients"]]


def test_dropped_clients_are_left_out_and_too_many_fail_the_round(tmp_path, one_thread):
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.runtime.server import RoundFailed
    from fedpeft.tracking.rundir import RunDir

    run_embedded(_cfg(**{"faults.fail_clients": [2]}), tmp_path / "one")
    rec = RunDir(tmp_path / "one").read_metrics()[0]
    assert {c["client"]: c["status"] for c in rec["clients"]} == {0: "ok", 1: "ok", 2: "failed", 3: "ok", 4: "ok"}
    assert "InjectedFault" in next(c["error"] for c in rec["clients"] if c["client"] == 2)
    with pytest.raises(RoundFailed, match="secure aggregation halted .fewer surviving clients"):
        run_embedded(_cfg(**{"faults.fail_clients": [1, 2, 3]}), tmp_path / "three")
    run_embedded(_cfg(**{"faults.fail_clients": [1, 2, 3], "faults.rounds": [1],
                         "federation.on_round_failure": "skip"}), tmp_path / "skip")
    recs = RunDir(tmp_path / "skip").read_metrics()
    assert "round_failed" in recs[0] and "round_failed" not in recs[1]


def test_a_secure_run_resumes_to_the_uninterrupted_records(tmp_path, one_thread):
    from fedpeft.runtime.embedded import StopAfterRound, run_embedded
    from fedpeft.tracking.rundir import RunDir
    from fedpeft.tracking.summary import TIMING_FIELDS

    cfg = _cfg()
    run_embedded(cfg, tmp_path / "full")
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "cut", stop_after_round=1)
    run_embedded(cfg, tmp_path / "cut", resume=True)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]  # noqa: E731
    assert strip(RunDir(tmp_path / "cut").read_metrics()) == strip(RunDir(tmp_path / "full").read_metrics())


@pytest.mark.parametrize("over, match", [
    ({"method.aggregator.name": "median"}, "method.aggregator.name: 'median' needs each client's update"),
    ({"method.aggregator.name": "krum"}, "'krum' needs each client's update"),
    ({"method.wrappers": [{"name": "clip", "max_norm": 1.0}]}, "method.wrappers.0.name: 'clip'"),
    ({"method.aggregator.name": "uniform", "method.wrappers": [{"name": "dp_fedavg", "clip": 1.0,
                                                               "noise_multiplier": 0.5}]},
     "method.wrappers.0.name: 'dp_fedavg' with these settings"),
    ({"method.aggregator.name": "uniform", "method.wrappers": [{"name": "dp_fedavg", "clip": 1.0,
                                                               "noise_multiplier": 0.5, "clipping": "client"}]},
     "method.wrappers.0.clipping: 'client' needs the clients to clip"),
    ({"method.name": "headprune", "method.adapter.num_tokens": None}, "'head_weighted' needs each client's update"),
    ({"method.name": "fedavg-lora", "method.adapter.num_tokens": None}, "method.sharing.name: 'head_pruning'"),
    ({"method.name": "fedbpt", "method.trainer.max_steps": None, "method.trainer.batch_size": None},
     "'server_cmaes' needs each client's update"),
    ({"method.selector.name": "loss_difference"}, "method.selector.name: 'loss_difference'"),
])
def test_what_needs_individual_updates_is_refused_before_loading(over, match):
    from fedpeft.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match=match):
        _cfg(**over)


def test_client_side_clipping_bounds_the_delta_and_leaves_small_ones():
    from fedpeft.transforms.clip_delta import ClipDelta, ClipDeltaSettings
    from fedpeft.comm.update import Update

    start = {"p": torch.zeros(3, 4), "q": torch.ones(2)}
    big = Update(0, {"p": torch.full((3, 4), 2.0), "q": torch.ones(2)}, 5)
    out = ClipDelta(ClipDeltaSettings(max_norm=1.0)).apply(big, start, 1, None)
    delta = torch.cat([(out.tensors["p"] - start["p"]).ravel(), (out.tensors["q"] - start["q"]).ravel()])
    assert float(delta.norm()) == pytest.approx(1.0) and bool((out.tensors["p"] > 0).all())  # same direction
    small = Update(0, {"p": torch.full((3, 4), 0.01), "q": torch.ones(2)}, 5)
    assert torch.equal(ClipDelta(ClipDeltaSettings(max_norm=1.0)).apply(small, start, 1, None).tensors["p"],
                       small.tensors["p"])


def test_dp_fedavg_with_client_side_clipping_runs_under_secure_aggregation(tmp_path, one_thread):
    """Central DP over the securely summed uniform mean: clients clip (clip_delta), the server adds N(0, (zS/m)²)
    with m the clients that survived the round."""
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    cfg = _cfg(**{"method.aggregator.name": "uniform", "faults.fail_clients": [2], "faults.rounds": [2],
                  "method.wrappers": [{"name": "dp_fedavg", "clip": 1.0, "noise_multiplier": 0.5,
                                       "clipping": "client"}],
                  "method.transforms": [{"name": "clip_delta", "max_norm": 1.0}]})
    run_embedded(cfg, tmp_path / "run")
    recs = RunDir(tmp_path / "run").read_metrics()
    assert [r["num_ok"] for r in recs] == [5, 4]
    assert [r["server"]["dp_noise_std"] for r in recs] == [pytest.approx(0.5 / 5), pytest.approx(0.5 / 4)]
    assert recs[1]["server"]["epsilon"] > recs[0]["server"]["epsilon"] > 0


@pytest.mark.parametrize("over", [
    {"method.name": "ffa-lora", "method.adapter.num_tokens": None},   # only B travels, and is summed
    {"method.aggregator.name": "fedadam"},                           # a server step on the mean's pseudo-gradient
    {"method.name": "fedsa-lora", "method.adapter.num_tokens": None},  # A summed, B kept on the clients
])
def test_methods_that_need_only_the_mean_run_securely(tmp_path, one_thread, over):
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    run_embedded(_cfg(**over, **{"federation.rounds": 1}), tmp_path / "run")
    rec = RunDir(tmp_path / "run").read_metrics()[-1]
    assert rec["num_ok"] == 5 and np.isfinite(rec["loss"])


def test_fedpeptao_selects_the_same_layers_from_the_securely_averaged_scores(tmp_path, one_thread):
    """FedPepTAO without control variates (MomS+AdamD): the layer scores of the selection round travel in the masked
    vector, and Eq. 4's weighted mean of them, the selected layers and the training match the plain run."""
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    over = {"method.name": "fedpeptao", "method.aggregator.control_variates": False, "federation.num_clients": 4,
            "federation.rounds": 2, "method.sharing.warmup_rounds": 1,
            "federation.secure_aggregation": {"num_shares": 3, "reconstruction_threshold": 2}}
    run_embedded(_cfg(**over), tmp_path / "secure")
    run_embedded(_cfg(**over | {"federation.secure_aggregation": None}), tmp_path / "plain")
    s, p = (RunDir(tmp_path / k).load_checkpoint()[1].scalars["sharing"] for k in ("secure", "plain"))
    assert s["selection_round"] == p["selection_round"] == 1 and s["selected"] == p["selected"]
    assert 0 < max(abs(a - b) for a, b in zip(s["layer_scores"], p["layer_scores"])) < 1e-4
    secure, plain = (RunDir(tmp_path / k).read_metrics() for k in ("secure", "plain"))
    assert abs(secure[-1]["loss"] - plain[-1]["loss"]) < 1e-3


@pytest.mark.parametrize("over, match", [
    ({"method.name": "fedpeptao"}, "'momentum_cv' needs each client's update with these settings"),
    ({"method.name": "fedpeptao", "method.aggregator.control_variates": False,
      "method.sharing.ratio_estimator": "hessian_gap"}, "method.sharing.name: 'layer_selection'"),
    ({"method.name": "discrete-prompt", "method.trainer.max_steps": None, "method.trainer.batch_size": None},
     "method.trainer.name: 'discrete_search' uploads tensors that are not summed"),
])
def test_the_settings_that_need_individual_updates_are_refused(over, match):
    from fedpeft.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match=match):
        _cfg(**over)


def test_the_discrete_search_uploads_rows_that_average_to_the_decoded_indices(tmp_path, one_thread):
    """``upload: rows`` sends the prompt the indices decode to (bit for bit), so the plain FedAvg is the same and
    the secure one differs by the quantization only."""
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.tracking.rundir import RunDir

    base = {"method.name": "discrete-prompt", "method.trainer.max_steps": None, "method.trainer.batch_size": None,
            "method.trainer.steps": 4, "federation.rounds": 1, "federation.secure_aggregation": None,
            "task.num_examples": 100, "evaluation.local": False}
    for name, extra in {"indices": {}, "rows": {"method.trainer.upload": "rows"},
                        "secure": {"method.trainer.upload": "rows", "federation.secure_aggregation":
                                   {"num_shares": 5, "reconstruction_threshold": 3}}}.items():
        run_embedded(_cfg(**base | extra), tmp_path / name)
    prompt = {k: RunDir(tmp_path / k).load_checkpoint()[1].tensors["prompt"] for k in ("indices", "rows", "secure")}
    assert torch.equal(prompt["indices"], prompt["rows"])
    assert 0 < float((prompt["secure"] - prompt["rows"]).abs().max()) < 1e-4
    up = {k: RunDir(tmp_path / k).read_metrics()[0]["bytes_up"] for k in ("indices", "rows")}
    assert up["rows"] > up["indices"]  # T x d floats against T uint16 ids


@pytest.mark.slow
def test_a_secure_run_on_flower_sim_equals_the_embedded_one(tmp_path):
    """Flower's workflow over the simulation's grid and its mod in the ClientApp give the embedded run's records:
    the same masked means (the quantization seeded alike), one dropout unmasked, the protocol's bytes per client up
    to the size of node ids."""
    from fedpeft.runtime.embedded import run_embedded
    from fedpeft.runtime.flower.simulation import run_flower_sim
    from fedpeft.tracking.rundir import RunDir
    from fedpeft.tracking.summary import TIMING_FIELDS

    cfg = _cfg(**{"faults.fail_clients": [3], "federation.rounds": 1, "runtime.threads": 1})
    run_embedded(cfg, tmp_path / "embedded")
    run_flower_sim(cfg, tmp_path / "sim")
    emb, sim = RunDir(tmp_path / "embedded").read_metrics(), RunDir(tmp_path / "sim").read_metrics()
    assert [r["num_ok"] for r in sim] == [4]
    # bytes differ only by how node ids encode: Flower's are random 64-bit integers, the embedded ones small
    bytes_keys = ("bytes_up", "bytes_down")
    for e, s in zip(emb, sim):
        for k in bytes_keys:
            assert abs(s[k] - e[k]) < 0.05 * e[k], (k, s[k], e[k])
    skip = TIMING_FIELDS + ("flower_record_bytes", "model_loads", *bytes_keys)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in skip}  # noqa: E731
                        | {"clients": [{k: v for k, v in c.items() if k not in bytes_keys and k != "error"}
                                       for c in r["clients"]]} for r in rs]
    assert strip(sim) == strip(emb)
    a = RunDir(tmp_path / "embedded").load_checkpoint()[1].tensors
    b = RunDir(tmp_path / "sim").load_checkpoint()[1].tensors
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _refused_aggregators():
    from fedpeft.aggregators import AGGREGATORS

    return [n for n in AGGREGATORS.names() if "params" in AGGREGATORS.get(n).accepts
            and not AGGREGATORS.get(n).secure_sum]


@pytest.mark.parametrize("name", _refused_aggregators())
def test_every_aggregator_that_reads_individual_updates_is_refused(name):
    """Registry-driven: any parameter aggregator registered now or later without ``secure_sum`` is refused under
    secure aggregation, by name, before anything loads (those that also read per-client values the method does not
    upload are refused for that first)."""
    from fedpeft.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match=f"method.aggregator.name: '{name}' (needs each client's "
                                                        "update|reads)"):
        _cfg(**{"method.aggregator.name": name})


def test_a_clipped_share_outside_zero_to_one_fails_the_round_as_a_wrap_around():
    """The clipped flag is a mean of 0s and 1s: a sum that wrapped around the field reads far outside [0, 1] (the
    review's run read LoRA weights near 166), and the round is refused with nothing applied."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_reliability import make_round_one

    from fedpeft.runtime.secure.protocol import SecureOutcome
    from fedpeft.runtime.server import RoundFailed

    driver, state, plan, valid, _, schema = make_round_one(
        federation__secure_aggregation={"num_shares": 3, "reconstruction_threshold": 2})
    mean = {k: np.zeros(v, dtype=np.float32) for k, v in schema.tensors.items()}
    scalars = {c: {"num_examples": driver.weights[c]} for c in plan.instructions}
    weight = float(sum(driver.weights[c] for c in scalars))
    ok = SecureOutcome(mean=dict(mean), weight=weight, scalars=dict(scalars), clipped=0.0)
    driver.finish_secure_round(state, plan, ok)
    wrapped = SecureOutcome(mean=dict(mean), weight=weight, scalars=dict(scalars), clipped=166.2)
    with pytest.raises(RoundFailed, match="wrapped around the field"):
        driver.finish_secure_round(state, plan, wrapped)
    lying = SecureOutcome(mean=dict(mean), weight=weight, scalars=dict(scalars) | {0: {"num_examples": 10**12}})
    with pytest.raises(RoundFailed, match="halted .client 0 claimed num_examples 1000000000000"):
        driver.finish_secure_round(state, plan, lying)


def test_a_masked_vector_of_other_shapes_is_left_out_as_a_drop(caplog):
    """A node whose masked vector has other shapes (numpy would broadcast it into the sum) is left out and unmasked
    through its neighbours' shares, as a dropped node: the mean is the other clients'."""
    from flwr.common import ndarray_to_bytes

    def shrink(handler):
        def deliver(msg):
            reply = handler(msg)
            cfgs = reply.content.config_records["secaggplus_configs"]
            if "masked_params" in cfgs:
                cfgs["masked_params"] = [ndarray_to_bytes(np.zeros(1, dtype=np.int64))] * len(cfgs["masked_params"])
            return reply
        return deliver

    handlers = _handlers()
    handlers[node_id(2)] = shrink(handlers[node_id(2)])
    with task_identity(), caplog.at_level("WARNING"):
        outcome = secure_round(SecureAggregationConfig(num_shares=5, reconstruction_threshold=3), 0, 1, _groups(),
                               grid_class()(handlers))
    want = _plain([0, 1, 3, 4])
    assert set(outcome.scalars) == {0, 1, 3, 4} and "node 3's masked vector" in caplog.text
    assert all(np.abs(outcome.mean[k] - want[k].numpy()).max() < 1e-3 for k in want)
