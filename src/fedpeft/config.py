"""Experiment configuration: pydantic models, YAML in, validated and resolved YAML out.

Errors name the offending field (``federation.partition.alpha``) and, for names looked up in a
registry, the allowed values. ``method.name`` selects a preset whose defaults are merged under the
user's own ``method`` keys before validation, so the saved ``config.yaml`` is fully resolved.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A configuration problem, with the dotted path of the field in the message."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TaskConfig(_Strict):
    name: str = "bbc"
    path: str | None = Field(None, description="data folder or file; defaults to ../shared/data/<dir>")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="held-out share for tasks without a test split")
    max_train: int | None = Field(None, gt=0, description="cap on training examples (seeded stratified sample)")
    max_test: int | None = Field(None, gt=0, description="cap on test examples (seeded stratified sample)")
    few_shot: int | None = Field(None, gt=0, description="k training examples per class, drawn before partitioning")
    max_length: int = Field(128, ge=8, description="tokens per input, prompt excluded")
    num_examples: int = Field(600, gt=0, description="size of synthetic tasks")


class ModelConfig(_Strict):
    name: str = "minilm"
    readout: Literal["auto", "similarity", "verbalizer", "linear"] = "auto"
    similarity_scale: float = Field(20.0, gt=0, description="logit scale of cosine similarities")


class PartitionConfig(_Strict):
    scheme: Literal["iid", "dirichlet", "dirichlet_quantity"] = "iid"
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration")
    min_size: int = Field(2, ge=1, description="minimum examples per client (Dirichlet schemes redraw below it)")


class FederationConfig(_Strict):
    num_clients: int = Field(10, ge=1)
    clients_per_round: int | None = Field(None, ge=1, description="default: all clients")
    rounds: int = Field(5, ge=1)
    min_clients: int = Field(1, ge=1, description="fewest valid replies that still complete a round")
    partition: PartitionConfig = PartitionConfig()

    @model_validator(mode="after")
    def _check_counts(self) -> FederationConfig:
        if self.clients_per_round is not None and self.clients_per_round > self.num_clients:
            raise ValueError(
                f"clients_per_round ({self.clients_per_round}) exceeds num_clients ({self.num_clients})"
            )
        per_round = self.clients_per_round or self.num_clients
        if self.min_clients > per_round:
            raise ValueError(f"min_clients ({self.min_clients}) exceeds clients per round ({per_round})")
        return self


class Component(BaseModel):
    """One axis of a method (adapter, trainer, aggregator): ``name`` picks a registered component and
    the other keys are that component's own settings, validated by the pydantic model it registered
    (``fedpeft.components.settings_of``). Resolution fills in the component's defaults."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)
    name: str

    def settings(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class CodecConfig(_Strict):
    dtype: Literal["float32", "float16"] = "float32"


class MethodConfig(_Strict):
    name: str = "fedprompt"
    adapter: Component = Component(name="soft_prompt")
    trainer: Component = Component(name="adam")
    aggregator: Component = Component(name="fedavg")
    codec: CodecConfig = CodecConfig()
    options: dict[str, Any] = Field(default_factory=dict, description="method-level settings of the preset")


class EvaluationConfig(_Strict):
    batch_size: int = Field(64, ge=1)
    local: bool = Field(True, description="also evaluate on each client's local test shard")


class RuntimeConfig(_Strict):
    name: str = "embedded"
    threads: int | None = Field(None, ge=1, description="torch threads; default: all cores")
    progress: bool = True
    checkpoint_every: int = Field(1, ge=1)


class ExperimentConfig(_Strict):
    seed: int = 0
    name: str | None = None
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    method: MethodConfig = MethodConfig()
    federation: FederationConfig = FederationConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    runtime: RuntimeConfig = RuntimeConfig()

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, v: int) -> int:
        if not 0 <= v < 2**63:
            raise ValueError("seed must be in [0, 2**63)")
        return v


# ---------------------------------------------------------------- loading and overrides


def _parse_scalar(text: str) -> Any:
    return yaml.safe_load(text) if text != "" else ""


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML) to a nested dict, returning a copy."""
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got '{item}'")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {key}: '{p}' is not a section")
            node = nxt
        node[parts[-1]] = _parse_scalar(value)
    return out


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        lines.append(f"{loc}: {msg}")
    return "invalid config:\n  " + "\n  ".join(lines)


def resolve(raw: dict[str, Any]) -> ExperimentConfig:
    """Merge the method preset under the user's keys, then validate; raises ConfigError naming the field."""
    from fedpeft.methods import PRESETS  # late import: presets import the axes

    raw = copy.deepcopy(raw or {})
    method = raw.get("method") or {}
    if not isinstance(method, dict):
        raise ConfigError("method: must be a mapping")
    name = method.get("name", MethodConfig().name)
    try:
        preset = PRESETS.get(name)
    except KeyError as e:
        raise ConfigError(f"method.name: {e}") from None
    defaults = preset.defaults()
    for axis in ("adapter", "trainer", "aggregator"):  # another component than the preset's: its keys only
        user = method.get(axis)
        if isinstance(user, dict) and "name" in user and user["name"] != defaults.get(axis, {}).get("name"):
            defaults.pop(axis, None)
    raw["method"] = _deep_merge(defaults, method) | {"name": name}
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e)) from None
    _resolve_components(cfg, preset)
    try:
        preset.check(cfg)
    except ValueError as e:
        raise ConfigError(f"invalid config:\n  {e}") from None
    return cfg


def _resolve_components(cfg: ExperimentConfig, preset: Any) -> None:
    """Validate each axis section (and ``method.options``) with its component's settings model."""
    from fedpeft.components import component_registries
    from fedpeft.runtime.registry import RUNTIMES

    for axis, registry in component_registries().items():
        section: Component = getattr(cfg.method, axis)
        try:
            entry = registry.entry(section.name)
        except KeyError as e:
            raise ConfigError(f"invalid config:\n  method.{axis}.name: {e}") from None
        typed = _validate_section(entry.settings, section.settings(), f"method.{axis}")
        setattr(cfg.method, axis, Component(name=section.name, **typed))
    cfg.method.options = _validate_section(preset.options, cfg.method.options, "method.options")
    try:
        RUNTIMES.entry(cfg.runtime.name)
    except KeyError as e:
        raise ConfigError(f"invalid config:\n  runtime.name: {e}") from None


def _validate_section(model: type[BaseModel] | None, values: dict[str, Any], where: str) -> dict[str, Any]:
    if model is None:
        if values:
            raise ConfigError(f"invalid config:\n  {where}: unknown field(s) {sorted(values)}")
        return {}
    try:
        return model.model_validate(values).model_dump(mode="json")
    except ValidationError as e:
        msg = _format_validation_error(e).replace("invalid config:\n  ", "")
        lines = [f"{where}.{line.strip()}" for line in msg.splitlines()]
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from None


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> ExperimentConfig:
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
    return resolve(apply_overrides(raw, overrides or []))


def dump_config(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
