"""A malicious SecAgg+ server (``runtime.secure.adversary``) against honest fedpeft nodes: each deviation Bell et
al. (2020) list is refused by the nodes and yields no client's update, where Flower's ``secaggplus_mod`` alone gives
the update away; the node's policy refuses plain training and setups below its floor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedpeft.comm.codec import Message, encode
from fedpeft.config import SecureAggregationConfig

flwr = pytest.importorskip("flwr")

from fedpeft.runtime.node_policy import NodePolicy, PolicyError  # noqa: E402
from fedpeft.runtime.secure.adversary import run_attack  # noqa: E402
from fedpeft.runtime.secure.protocol import masked_train, node_handler, node_id  # noqa: E402

CLIENTS = [0, 1, 2, 3, 4]
TARGET = node_id(2)


def _update(c: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(c)
    return {"w": torch.randn(6, 7, generator=g) * 0.1}


def _run_node(settings, payloads):
    return {c: encode(Message(_update(c), {"num_examples": 100 + c})) for c in payloads}, {}


def _groups():
    return {node_id(c): {c: encode(Message(scalars={"round": 1}))} for c in CLIENTS}


def _flower_only_handler(node: int):
    """A node running Flower's ``secaggplus_mod`` without fedpeft's checks (what main did before)."""
    from flwr.app import Context, RecordDict
    from flwr.client.mod.secure_aggregation.secaggplus_mod import secaggplus_mod

    context = Context(run_id=0, node_id=node, node_config={}, state=RecordDict(), run_config={})
    return lambda msg: secaggplus_mod(msg, context, masked_train(_run_node))


def _attack(name, handler=None, cfg=None, node_config=None):
    cfg = cfg or SecureAggregationConfig(num_shares=5, reconstruction_threshold=3)
    handlers = {node_id(c): (handler(node_id(c)) if handler else node_handler(_run_node, node_id(c), node_config))
                for c in CLIENTS}
    return run_attack(name, TARGET, handlers, _groups(), cfg)


def _close_to_target(recovered) -> bool:
    return recovered is not None and np.abs(recovered[0] - _update(2)["w"].numpy()).max() < 1e-3


def test_the_simulator_recovers_a_clients_update_from_nodes_that_answer_any_request():
    """Naming the target both survivor and dropped: Flower's mod alone returns both of its secrets, and the server
    reads the target's update to the quantization's precision. (The simulator's attack is real.)"""
    out = _attack("both", handler=_flower_only_handler)
    assert not out.refused and out.seed_shares >= out.threshold and out.key_shares >= out.threshold
    assert _close_to_target(out.recovered)


def test_an_honest_round_is_answered_and_rebuilds_no_secret_key():
    out = _attack("honest")
    assert not out.refused and out.key_shares == 0 and out.recovered is None


@pytest.mark.parametrize("attack, why", [
    ("both", "both as survivors and as dropped"),
    ("stranger", "non-neighbours"),
    ("self_dropped", "among the survivors"),
    ("repeat", "twice"),
    ("too_few", "below the threshold"),
])
def test_fedpeft_nodes_refuse_each_deviating_unmask_request(attack, why):
    out = _attack(attack)
    assert out.refused and all(why in e for e in out.refused.values()), out.refused
    assert out.recovered is None
    assert out.key_shares < out.threshold or out.seed_shares < out.threshold


def test_a_split_view_yields_too_few_shares_of_one_secret_at_a_majority_threshold():
    """Each neighbour sees a consistent request, so none refuses; with the threshold above half the shares (3 of
    5) the two groups cannot both reach it."""
    out = _attack("split")
    assert out.recovered is None
    assert min(out.seed_shares, out.key_shares) < out.threshold


def test_a_split_view_below_a_majority_threshold_is_refused_at_setup_by_a_node_that_insists():
    """At 2 of 5 shares a split view could gather both secrets; a node requiring secure aggregation refuses the
    setup, so no key is ever shared."""
    cfg = SecureAggregationConfig(num_shares=5, reconstruction_threshold=2)
    out = _attack("split", cfg=cfg, node_config={"require-secure-aggregation": True})
    assert out.recovered is None and out.seed_shares == 0 and out.key_shares == 0


def test_a_node_that_requires_secure_aggregation_refuses_plain_training(caplog):
    from flwr.app import ConfigRecord, Context, Message as FlowerMessage, MessageType, RecordDict

    from fedpeft.runtime.secure.inprocess import task_identity
    from fedpeft.runtime.secure.protocol import secure_mod

    context = Context(run_id=0, node_id=1, node_config={"require-secure-aggregation": True}, state=RecordDict(),
                      run_config={})
    with task_identity():
        msg = FlowerMessage(RecordDict({"fitins.config": ConfigRecord({})}), dst_node_id=1,
                            message_type=MessageType.TRAIN)
        served = []
        with pytest.raises(PolicyError, match="without secure aggregation"):
            secure_mod(msg, context, lambda m, c: served.append(m))
        assert not served and "node policy: refused" in caplog.text
        evaluate = FlowerMessage(RecordDict(), dst_node_id=1, message_type=MessageType.EVALUATE)
        secure_mod(evaluate, context, lambda m, c: served.append(m))
        assert served == [evaluate]  # evaluation carries no update


@pytest.mark.parametrize("shares, threshold, why", [(2, 2, "2 shares"), (5, 1, "threshold 1"),
                                                   (4, 2, "at or below half")])
def test_the_node_floor_refuses_weak_secure_setups(shares, threshold, why):
    policy = NodePolicy(require_secure_aggregation=True, min_num_shares=3)
    with pytest.raises(PolicyError, match=why):
        policy.check_secure_setup(shares, threshold)
    policy.check_secure_setup(5, 3)
    NodePolicy().check_secure_setup(2, 1)  # a node that does not insist takes the server's protocol


def test_the_node_policy_refuses_remote_code_and_unlisted_models():
    from fedpeft.resolve import resolve

    cfg = resolve({"model": {"name": "some/hub-model", "trust_remote_code": True}})
    with pytest.raises(PolicyError, match="trust_remote_code"):
        NodePolicy().check_model(cfg.model)
    NodePolicy(trust_remote_code=True).check_model(cfg.model)
    with pytest.raises(PolicyError, match="not among the node's models"):
        NodePolicy(models=["minilm"]).check_model(resolve({"model": {"name": "smollm2"}}).model)


@pytest.mark.parametrize("key", ["../../etc", "a/b", "..", "", "x" * 65])
def test_the_servers_run_key_cannot_leave_the_nodes_state_dir(key, tmp_path):
    from fedpeft.runtime.node_policy import state_root

    with pytest.raises(PolicyError, match="one plain name"):
        state_root({"state-dir": str(tmp_path)}, {"run_key": key, "state_dir": "/elsewhere"})
    assert state_root({"state-dir": str(tmp_path)}, {"run_key": "0123abcd", "state_dir": "/x"}) == tmp_path / "0123abcd"


def test_the_policy_round_trips_through_a_flower_node_config(tmp_path):
    from flwr.common.config import parse_config_args

    from fedpeft.runtime.flower.local import node_config
    from fedpeft.runtime.node_policy import load_policy

    path = tmp_path / "policy.yaml"
    path.write_text("min_num_shares: 4\nmodels: [minilm, smollm2]\n")
    policy = load_policy(path, require_secure_aggregation=True)
    parsed = parse_config_args([node_config([0, 1], tmp_path, policy=policy)])
    assert NodePolicy.from_node_config(parsed) == policy
    path.write_text("min_shares: 4\n")
    with pytest.raises(ValueError, match="policy.yaml: min_shares: Extra inputs"):
        load_policy(path)


def test_without_the_nodes_floor_a_split_view_at_a_minority_threshold_recovers_the_update():
    """What the majority floor is for (the threat model says so): at 2 of 5 shares nodes that do not insist each
    answer a consistent request, and the server rebuilds both secrets of the target."""
    out = _attack("split", cfg=SecureAggregationConfig(num_shares=5, reconstruction_threshold=2))
    assert not out.refused and _close_to_target(out.recovered)


@pytest.mark.parametrize("secure, warned", [({"num_shares": 3, "reconstruction_threshold": 2}, False),
                                            ({"num_shares": 5, "reconstruction_threshold": 2}, True),
                                            ({"num_shares": 1.0, "reconstruction_threshold": 0.5}, True),
                                            ({"num_shares": 1.0, "reconstruction_threshold": 0.6}, False)])
def test_a_minority_threshold_is_warned_about_when_the_config_loads(secure, warned):
    from fedpeft.resolve import load_config

    cfg = load_config(None, [f"federation.secure_aggregation={secure}".replace("'", "")])
    assert any("at most half the shares" in n for n in cfg.notes) == warned


def test_a_missing_or_malformed_policy_file_is_named(tmp_path):
    from fedpeft.runtime.node_policy import load_policy

    with pytest.raises(ValueError, match="--policy: no such file"):
        load_policy(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("min_num_shares: [\n")
    with pytest.raises(ValueError, match="bad.yaml: invalid YAML"):
        load_policy(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ValueError, match="list.yaml: a node policy is a mapping"):
        load_policy(tmp_path / "list.yaml")
