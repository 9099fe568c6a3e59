import pytest

from fedpeft.config import ConfigError, dump_config
from fedpeft.resolve import apply_overrides, load_config


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
    ("method.aggregator.name=medoid", "method.aggregator.name"),
    ("method.selector.name=best", "method.selector.name"),
    ("method.sharing.name=heads", "method.sharing.name"),
    ("method.wrappers=[{name: clip}]", "method.wrappers.0.max_norm"),
    ("method.transforms=[{name: noise}]", "method.transforms.0.name"),
    ("runtime.device=tpu", "runtime.device"),
    ("runtime.name=mpi", "runtime.name"),
])
def test_errors_name_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert field in str(e.value)


def test_switching_a_component_from_the_command_line_drops_the_old_ones_settings(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("method:\n  name: fedbpt\n  aggregator: {name: server_cmaes, sigma_rule: eq17}\n")
    cfg = load_config(f, ["method.aggregator.name=fedavg"])
    assert cfg.method.aggregator.name == "fedavg" and cfg.method.aggregator.settings() == {}
    cfg = load_config(f, ["method.aggregator.sigma_rule=code"])
    assert cfg.method.aggregator.settings()["sigma_rule"] == "code"


def test_readme_compositions_resolve():
    for example, over in [("examples/bbc_fedprompt.yaml", ["method.aggregator.name=fedadam"]),
                          ("examples/sst2_fedpeptao.yaml", ["method.aggregator.name=median",
                                                            "method.trainer.prox_mu=0.01"]),
                          ("examples/sst2_fedbpt.yaml", ["method.aggregator.name=fedavg",
                                                         "method.selector.name=all"]),
                          ("examples/bbc_fedprompt.yaml", ["method.aggregator={name: trimmed_mean, beta: 0.1}",
                                                           "method.wrappers=[{name: clip, max_norm: 0.5}]"])]:
        load_config(example, over)


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
    for bad in ("[]", "{}", "{a: 1}"):  # found by the fuzzed-config test: not even hashable
        with pytest.raises(ConfigError, match="method.name: must be the name of a method preset"):
            load_config(None, [f"method.name={bad}"])
    for axis in ("trainer", "aggregator", "adapter", "selector"):
        with pytest.raises(ConfigError, match=f"method.{axis}.name"):
            load_config(None, [f"method.{axis}.name=[]"])


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="clients_per_round"):
        load_config(None, ["federation.num_clients=3", "federation.clients_per_round=5"])
    # combinations that cannot work fail before anything is loaded, naming the field and saying why
    with pytest.raises(ConfigError, match="method.aggregator.name: 'krum' combines trained tensors; trainer 'cmaes' "
                                         "uploads a CMA-ES search distribution"):
        load_config(None, ["method.name=fedbpt", "method.aggregator.name=krum"])
    with pytest.raises(ConfigError, match="method.trainer.name: 'cmaes' trains projected_prompt"):
        load_config(None, ["method.name=fedprompt", "method.trainer.name=cmaes"])
    with pytest.raises(ConfigError, match="method.aggregator.name: 'server_cmaes' combines a CMA-ES"):
        load_config(None, ["method.name=fedprompt", "method.aggregator.name=server_cmaes"])
    with pytest.raises(ConfigError, match="method.wrappers.0.name: 'clip' combines trained tensors"):
        load_config(None, ["method.name=fedavg-bbt", "method.wrappers=[{name: clip, max_norm: 1.0}]"])
    with pytest.raises(ConfigError, match="method.transforms.0.name: 'scale_delta' transforms trained tensors"):
        load_config(None, ["method.name=fedbpt", "method.transforms=[{name: scale_delta, factor: 2}]"])
    # ... and combinations no paper ran resolve
    assert load_config(None, ["method.name=fedprompt", "method.adapter.name=full"]).method.adapter.name == "full"
    assert load_config(None, ["method.name=fedbpt", "method.aggregator.name=fedavg"]).method.aggregator.name == "fedavg"


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: 1\nfederation:\n  rounds: [2\n")
    with pytest.raises(ConfigError, match="bad.yaml:4"):
        load_config(bad)


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["federation.rounds"])


def test_component_settings_are_validated_once():
    from fedpeft.trainers import TRAINERS

    cfg = load_config(None, ["method.trainer.lr=0.2"])
    assert TRAINERS.settings_of(cfg.method.trainer) is cfg.method.trainer.typed_settings
    assert cfg.method.trainer.typed_settings.lr == 0.2


def _models_below(model, seen):
    """``model`` and every pydantic model its fields hold (nested config sections)."""
    from pydantic import BaseModel

    if model in seen:
        return
    seen.add(model)
    for info in model.model_fields.values():
        for t in (info.annotation, *getattr(info.annotation, "__args__", ())):
            if isinstance(t, type) and issubclass(t, BaseModel):
                _models_below(t, seen)


def test_every_setting_has_a_description():
    """The reference documentation is generated from these: the config and every registered component's settings."""
    from fedpeft.components import AXIS_REGISTRIES, LIST_REGISTRIES
    from fedpeft.config import ExperimentConfig

    models: set = set()
    _models_below(ExperimentConfig, models)
    for registry in (*AXIS_REGISTRIES.values(), *LIST_REGISTRIES.values()):
        for entry in registry.entries():
            if entry.settings is not None:
                _models_below(entry.settings, models)
    assert len(models) > 30
    missing = [f"{m.__name__}.{name}" for m in models for name, info in m.model_fields.items() if not info.description]
    assert not missing, f"settings without a description: {sorted(missing)}"


def test_gradient_checkpointing_is_refused_for_an_adapter_that_does_not_declare_it_safe():
    from fedpeft.adapters import ADAPTERS

    able = [e.name for e in ADAPTERS.entries() if e.obj.checkpointable]
    assert {"lora", "soft_prompt", "full"} <= set(able) and "deep_prompt" not in able
    load_config(None, ["method.name=fedit", "task.name=webnlg", "model.name=smollm2",
                       "runtime.gradient_checkpointing=true"])
    with pytest.raises(ConfigError, match=r"runtime.gradient_checkpointing: adapter 'deep_prompt' does not declare"):
        load_config(None, ["method.name=fedpeptao", "runtime.gradient_checkpointing=true"])


def test_tiers_name_their_clients_or_give_shares_never_both():
    from fedpeft.data.participants import profile_of_clients

    base = ["model.name=tiny-bert", "method.name=flexlora", "federation.num_clients=3"]
    named = load_config(None, [*base, 'federation.client_profiles=[{name: a, rank: 2, clients: [0, 2]}, '
                                      '{name: b, rank: 4, clients: [1]}]'])
    tiers = profile_of_clients(named.federation.client_profiles, 3, seed=0)
    assert [p.name for p in tiers] == ["a", "b", "a"]
    for bad, why in (('[{name: a, share: 1.0, clients: [0, 1, 2]}]', "its share or its clients"),
                     ('[{name: a, share: 0.5}, {name: b, clients: [0, 1, 2]}]', "every tier gives its clients"),
                     ('[{name: a, clients: [0, 1]}, {name: b, clients: [1]}]', r"each once \(num_clients\)")):
        with pytest.raises(ConfigError, match=why):
            load_config(None, [*base, f"federation.client_profiles={bad}"])
