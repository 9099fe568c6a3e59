"""From YAML and ``--set`` overrides to a validated, fully resolved ``ExperimentConfig``.

``method.name`` picks a preset whose defaults are merged under the user's own ``method`` keys; then every
component section is validated once, by the settings model its component registered, and the
combination is checked against what each component declares it can work with (a CMA-ES distribution
cannot go into Krum). Errors name the field and the allowed values. Entry points import this module (and
the resume check, to read an older config.yaml).
"""

from __future__ import annotations

import copy
import difflib
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from fedpeft.components import AXIS_REGISTRIES, LIST_REGISTRIES
from fedpeft.config import AXES, Component, ConfigError, ExperimentConfig, MethodConfig, read_yaml
from fedpeft.methods import PRESETS, check_combination
from fedpeft.runtime.registry import RUNTIMES
from fedpeft.tracking.sinks import SINKS


def _parse_scalar(text: str) -> Any:
    return read_yaml(text) if text != "" else ""


def _model_at(model: type[BaseModel] | None, path: list[str] | tuple) -> type[BaseModel] | None:
    """The settings model of the nested section ``path`` of ``model`` (None where the path leaves the schema)."""
    for part in path:
        info = model.model_fields.get(str(part)) if model is not None else None
        if info is None:
            return None
        kinds = set(typing.get_args(info.annotation)) or {info.annotation}
        model = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
    return model


def _is_text_field(parts: list[str]) -> bool:
    """Whether the dotted key names a template of the schema (``task.prompt_template``, ``task.template``, ...): its
    ``--set`` value is the text as typed, braces and all, not YAML (other settings, components' own among them,
    stay YAML)."""
    if not parts[-1].endswith("template"):
        return False
    parent = _model_at(ExperimentConfig, parts[:-1])
    info = parent.model_fields.get(parts[-1]) if parent is not None else None
    return info is not None and (set(typing.get_args(info.annotation)) - {type(None)} or {info.annotation}) == {str}


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML) to a nested dict, returning a copy.

    Switching a component (``method.aggregator.name=fedadam`` where the file names another aggregator)
    drops the file's settings of the old component; later overrides may set the new one's.
    """
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got '{item}'")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(p.strip() for p in parts):
            raise ConfigError(f"--set expects key=value with a dotted key like federation.rounds, got '{item}'")
        node = out
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {key}: '{p}' is not a section")
            node = nxt
        try:
            new = _parse_scalar(value)
        except yaml.YAMLError as e:
            if not _is_text_field(parts):
                raise ConfigError(f"--set {key}: the value is not valid YAML ({getattr(e, 'problem', e)})") from None
            new = value
        if not isinstance(new, str) and new is not None and _is_text_field(parts):
            new = value  # a text setting takes the text as given ({instruction} is not a YAML mapping here)
        if len(parts) == 3 and parts[0] == "method" and parts[1] in AXES and parts[2] == "name" \
                and node.get("name", new) != new:
            node.clear()
        node[parts[-1]] = new
    return out


def _format_validation_error(err: ValidationError, model: type[BaseModel] = ExperimentConfig) -> str:
    """One line per problem, ``dotted.key: message``; an unknown key gets the closest known ones of its section."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            section = _model_at(model, e["loc"][:-1])
            known = list(section.model_fields) if section is not None else []
            close = difflib.get_close_matches(str(e["loc"][-1]), known, n=3, cutoff=0.6)
            msg = "unknown field" + (f"; did you mean {' or '.join(close)}?" if close else "")
        lines.append(f"{loc}: {msg}")
    return "invalid config:\n  " + "\n  ".join(lines)


def generation_task(task: dict[str, Any]) -> bool:
    """Whether a task section (as a mapping) names a generation task."""
    from fedpeft.data.tasks.generation import GENERATION_TASKS

    return task.get("kind") == "generation" or bool(task.get("response_column")) or task.get("name") in GENERATION_TASKS


# keys added after runs were saved, whose behaviour before they existed is not their default: (section, key, what
# the code did before, the configs it applies to). A config.yaml that fedpeft wrote before the key existed holds
# every other key of its section, and is read with the old behaviour, so that resuming or using such a run changes
# nothing.
ADDED_SINCE = (("task", "truncation", "keep_end", generation_task),)


def _saved_before_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with ``ADDED_SINCE``'s old behaviours where it is a saved config from before those keys."""
    models = {"task": ExperimentConfig.model_fields["task"].annotation}
    for section, key, old, applies in ADDED_SINCE:
        node = raw.get(section)
        added = {k for s, k, *_ in ADDED_SINCE if s == section}
        if isinstance(node, dict) and key not in node and set(node) >= set(models[section].model_fields) - added \
                and applies(node):
            node[key] = old
    return raw


def resolve(raw: dict[str, Any]) -> ExperimentConfig:
    """Merge the method preset under the user's keys, then validate; raises ConfigError naming the field. A run's
    config.yaml from before a key of ``ADDED_SINCE`` existed is read with the behaviour it ran with."""
    raw = _saved_before_keys(copy.deepcopy(raw or {}))
    method = raw.get("method") or {}
    if not isinstance(method, dict):
        raise ConfigError("method: must be a mapping")
    name = method.get("name", MethodConfig().name)
    if not isinstance(name, str):  # looked up before validation: a list or mapping would not even hash
        raise ConfigError(f"method.name: must be the name of a method preset, got {name!r}")
    try:
        preset = PRESETS.get(name)
    except KeyError as e:
        raise ConfigError(f"method.name: {e}") from None
    defaults = preset.defaults()
    method = _exchange_sugar(method, defaults)
    for axis in AXIS_REGISTRIES:  # another component than the preset's: its own keys only
        user = method.get(axis)
        if isinstance(user, dict) and "name" in user and user["name"] != defaults.get(axis, {}).get("name"):
            defaults.pop(axis, None)
    raw["method"] = _deep_merge(defaults, method) | {"name": name}
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e)) from None
    _resolve_components(cfg)
    try:
        RUNTIMES.entry(cfg.runtime.name)
    except KeyError as e:
        raise ConfigError(f"invalid config:\n  runtime.name: {e}") from None
    try:
        check_combination(cfg)
    except ValueError as e:
        raise ConfigError(f"invalid config:\n  {e}") from None
    return cfg


def _exchange_sugar(method: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``method`` with its ``exchange`` stages as sections (a bare name is ``{name: ...}``). When a chain is given,
    it replaces the preset's ``sharing``: a stage of the preset's sharing component keeps the preset's settings
    under the user's keys, and ``sharing`` mirrors the first stage: the user's ``method.sharing`` keys set it (a
    ``sharing`` of another component is an error: the two would disagree)."""
    stages = method.get("exchange")
    if not stages:
        return method
    if not isinstance(stages, list):
        raise ConfigError(f"invalid config:\n  method.exchange: a list of stages, e.g. [ranks, fedsa]; got {stages!r}")
    preset = defaults.pop("sharing", None) or {}
    out = []
    for i, st in enumerate(stages):
        st = {"name": st} if isinstance(st, str) else st
        if not isinstance(st, dict) or not isinstance(st.get("name"), str):
            raise ConfigError(f"invalid config:\n  method.exchange.{i}: a stage name or a mapping with 'name', "
                              f"got {st!r}")
        out.append(_deep_merge(preset, st) if st["name"] == preset.get("name") else dict(st))
    user = method.get("sharing")
    if isinstance(user, dict) and "name" in user and user["name"] != out[0]["name"]:
        raise ConfigError(f"invalid config:\n  method.sharing: '{user['name']}' beside method.exchange "
                          f"{[st['name'] for st in out]}; the chain decides the stages: set one of the two")
    if isinstance(user, dict):  # method.sharing.<key> (e.g. from --set) sets the first stage, which sharing mirrors
        out[0] = _deep_merge(out[0], user)
    return method | {"exchange": out, "sharing": copy.deepcopy(out[0])}


def _resolve_components(cfg: ExperimentConfig) -> None:
    """Validate every component section (and tracking sink) with its settings model, filling in defaults."""
    for axis, registry in AXIS_REGISTRIES.items():
        section: Component = getattr(cfg.method, axis)
        setattr(cfg.method, axis, _resolve_one(section, registry, f"method.{axis}"))
    cfg.method.exchange = [_resolve_one(s, AXIS_REGISTRIES["sharing"], f"method.exchange.{i}")
                           for i, s in enumerate(cfg.method.exchange)]
    for field, registry in LIST_REGISTRIES.items():
        sections = getattr(cfg.method, field)
        setattr(cfg.method, field, [_resolve_one(s, registry, f"method.{field}.{i}") for i, s in enumerate(sections)])
    names = [s.name for s in cfg.tracking]
    if len(set(names)) != len(names):
        raise ConfigError(f"invalid config:\n  tracking: each sink at most once, got {names}")
    cfg.tracking = [_resolve_one(s, SINKS, f"tracking.{i}") for i, s in enumerate(cfg.tracking)]


def _resolve_one(section: Component, registry: Any, where: str) -> Component:
    """The section with its component's defaults filled in, carrying the validated settings object."""
    try:
        entry = registry.entry(section.name)
    except KeyError as e:
        raise ConfigError(f"invalid config:\n  {where}.name: {e}") from None
    typed = _validate_section(entry.settings, section.settings(), where)
    values = typed.model_dump(mode="json") if typed is not None else {}
    return Component(name=section.name, **values).with_typed(typed)


def _validate_section(model: type[BaseModel] | None, values: dict[str, Any], where: str) -> BaseModel | None:
    if model is None:
        if values:
            raise ConfigError(f"invalid config:\n  {where}: unknown field(s) {sorted(values)}")
        return None
    try:
        return model.model_validate(values)
    except ValidationError as e:
        msg = _format_validation_error(e, model).replace("invalid config:\n  ", "")
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


def preset_differences(cfg: ExperimentConfig) -> dict[str, tuple[Any, Any]]:
    """The ``method`` sections of a resolved config that differ from its preset's (component or settings):
    ``{section: (the preset's, the config's)}``, each side a component's name and settings (lists for
    ``transforms``/``wrappers``)."""
    preset = PRESETS.get(cfg.method.name)
    defaults = preset.defaults()
    out: dict[str, tuple[Any, Any]] = {}
    for axis, registry in {**AXIS_REGISTRIES, **LIST_REGISTRIES}.items():
        mine = defaults.get(axis, [] if axis in LIST_REGISTRIES else {"name": getattr(MethodConfig(), axis).name})
        if isinstance(mine, list):
            want = [_resolve_one(Component(**m), registry, f"method.{axis}").model_dump() for m in mine]
            have = [c.model_dump() for c in getattr(cfg.method, axis)]
        else:
            want = _resolve_one(Component(**mine), registry, f"method.{axis}").model_dump()
            have = getattr(cfg.method, axis).model_dump()
        if want != have:
            out[axis] = (want, have)
    return out


def _switch_warning(raw: dict[str, Any], overrides: list[str], cfg: ExperimentConfig) -> str | None:
    """When ``--set method.name=...`` switches the preset, the file's own ``method`` sections still override the new
    preset's: the warning lists those that differ from it, and how to drop them."""
    if not any(o.split("=", 1)[0].strip() == "method.name" for o in overrides):
        return None
    given = raw.get("method") if isinstance(raw.get("method"), dict) else {}
    differ = {k: v for k, v in preset_differences(cfg).items() if k in given}
    if not differ:
        return None
    listed = "; ".join(f"method.{k} {_difference(want, have)}" for k, (want, have) in differ.items())
    return (f"method.name '{cfg.method.name}': the config file's own method sections still apply: {listed}. To use "
            "the preset's, delete them from the file (or set them with --set)")


def _difference(want: Any, have: Any) -> str:
    """``have`` against the preset's ``want``: other components by name, the same component by its differing keys."""
    if isinstance(want, list) or want["name"] != have["name"]:
        def names(x: Any) -> str:
            return "[" + ", ".join(c["name"] for c in x) + "]" if isinstance(x, list) else x["name"]
        return f"{names(have)} instead of the preset's {names(want)}"
    keys = [k for k in have if have[k] != want.get(k)]
    return (f"{have['name']} with {', '.join(f'{k}={have[k]}' for k in keys)} (the preset's: "
            f"{', '.join(f'{k}={want.get(k)}' for k in keys)})")


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read a YAML experiment (or start from defaults), apply overrides, resolve and validate. Warnings about the
    result (``ExperimentConfig.notes``) are for the entry point to show once."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = read_yaml(Path(path).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            raise ConfigError(f"{where}: invalid YAML: {getattr(e, 'problem', e)}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
    cfg = resolve(apply_overrides(raw, overrides or []))
    if (note := _switch_warning(raw, overrides or [], cfg)) is not None:
        cfg.notes.append(note)
    secure = cfg.federation.secure_aggregation
    if secure is not None and secure.minority_threshold():
        cfg.notes.append(f"federation.secure_aggregation: reconstruction_threshold {secure.reconstruction_threshold} "
                         f"of num_shares {secure.num_shares} is at most half the shares: a server that deviates from "
                         "the protocol can rebuild one client's secrets and read its update; a threshold above half "
                         "prevents it (nodes started with --require-secure-aggregation refuse it)")
    return cfg
