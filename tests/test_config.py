import pytest

from fedpeft.config import ConfigError, apply_overrides, dump_config, load_config


def test_defaults_resolve_with_preset(tiny_cfg):
    cfg = load_config(None, ["method.name=fedprompt"])
    assert cfg.method.adapter.name == "soft_prompt" and cfg.method.adapter.num_tokens == 20
    assert cfg.method.trainer.name == "adam"
    full = load_config(None, ["method.name=fedavg-full"])
    assert full.method.adapter.name == "full" and full.method.trainer.lr == 2e-5
    assert "soft_prompt" in dump_config(cfg)


def test_set_overrides_nested_keys_and_parse_yaml_values():
    raw = apply_overrides({}, ["federation.rounds=2", "federation.partition.alpha=0.1", "task.name=sst2"])
    assert raw == {"federation": {"rounds": 2, "partition": {"alpha": 0.1}}, "task": {"name": "sst2"}}


@pytest.mark.parametrize("override, field", [
    ("federation.partition.alpha=-1", "federation.partition.alpha"),
    ("federation.partition.scheme=zipf", "federation.partition.scheme"),
    ("federation.rounds=0", "federation.rounds"),
    ("method.trainer.lr=0", "method.trainer.lr"),
    ("task.bogus=1", "task.bogus"),
    ("method.adapter.num_tokens=0", "method.adapter.num_tokens"),
    ("method.adapter.position=middle", "method.adapter.position"),
    ("method.trainer.nesterov=1", "method.trainer.nesterov"),
    ("method.aggregator.name=median", "method.aggregator.name"),
    ("runtime.name=mpi", "runtime.name"),
])
def test_errors_name_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert field in str(e.value)


def test_component_settings_are_resolved_with_defaults():
    cfg = load_config(None, ["method.trainer.lr=0.1"])
    assert cfg.method.trainer.settings()["lr"] == 0.1
    assert cfg.method.trainer.settings()["batch_size"] == 16  # preset default kept
    other = load_config(None, ["method.name=fedprompt", "method.trainer.name=sgd", "method.trainer.momentum=0.9"])
    assert other.method.trainer.settings()["momentum"] == 0.9 and other.method.trainer.settings()["lr"] == 0.03


def test_allowed_values_are_listed():
    with pytest.raises(ConfigError, match="iid.*dirichlet"):
        load_config(None, ["federation.partition.scheme=zipf"])
    with pytest.raises(ConfigError, match="method.name: unknown method 'nope'; allowed: .*fedprompt"):
        load_config(None, ["method.name=nope"])


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="clients_per_round"):
        load_config(None, ["federation.num_clients=3", "federation.clients_per_round=5"])
    with pytest.raises(ConfigError, match="method.adapter.name"):
        load_config(None, ["method.name=fedprompt", "method.adapter.name=full"])


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["federation.rounds"])
