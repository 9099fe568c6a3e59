"""What fedpeft offers, read from the registries and the settings models: every component with its settings (name,
type, default, description), every config key, and the config's JSON schema with each component's own keys. The
command line (``fedpeft components NAME``, ``fedpeft config --schema``) and the documentation's reference pages are
both written from here, so neither can drift from the code."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fedpeft.components import AXIS_REGISTRIES, LIST_REGISTRIES
from fedpeft.config import ExperimentConfig
from fedpeft.registry import Entry, Registry


def sections() -> dict[str, Registry[Any]]:
    """Config section (where a component's name goes) -> its registry, in the order the reference lists them."""
    from fedpeft.model import OBJECTIVES
    from fedpeft.model.readouts import READOUTS
    from fedpeft.tracking.sinks import SINKS

    return ({f"method.{axis}": reg for axis, reg in AXIS_REGISTRIES.items()}
            | {f"method.{field}[]": reg for field, reg in LIST_REGISTRIES.items()}
            | {"model.readout": READOUTS, "task.kind (objective)": OBJECTIVES, "tracking[]": SINKS})


@dataclass(frozen=True)
class Setting:
    """One key of a settings model, as the reference shows it."""

    key: str
    type: str
    default: str
    description: str
    bounds: str = ""


def _type(field: FieldInfo) -> str:
    text = str(field.annotation).replace("typing.", "")
    for noise in ("<class '", "'>", "fedpeft.config.", "pydantic.main."):
        text = text.replace(noise, "")
    return text


def _default(field: FieldInfo) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return "(section)"
    return json.dumps(value, default=str)


def _bounds(field: FieldInfo) -> str:
    out = []
    for meta in field.metadata:
        for name, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(meta, name, None) is not None:
                out.append(f"{sign} {getattr(meta, name)}")
    return ", ".join(out)


def settings_of(model: type[BaseModel] | None) -> list[Setting]:
    """The keys of one settings model (none for a component without settings)."""
    if model is None:
        return []
    return [Setting(name, _type(f), _default(f), f.description or "", _bounds(f))
            for name, f in model.model_fields.items()]


def config_keys(model: type[BaseModel] = ExperimentConfig, prefix: str = "") -> list[Setting]:
    """Every key of the experiment config, dotted, sections first-level in schema order (a component section is
    one key: its own keys are listed with the component)."""
    out = []
    for name, field in model.model_fields.items():
        inner = field.annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel) and inner.__name__ != "Component":
            out += config_keys(inner, f"{prefix}{name}.")
        else:
            out.append(Setting(f"{prefix}{name}", _type(field), _default(field), field.description or "",
                               _bounds(field)))
    return out


def find(name: str) -> list[tuple[str, Entry[Any]]]:
    """``(section, entry)`` of every component called ``name`` (one name may serve two axes)."""
    return [(section, reg.entry(name)) for section, reg in sections().items() if name in reg]


def undocumented() -> list[str]:
    """Config keys and component settings without a description (a test keeps this empty)."""
    missing = [f"config key {s.key}" for s in config_keys() if not s.description]
    for section, reg in sections().items():
        for entry in reg.entries():
            missing += [f"{section} {entry.name}: {s.key}" for s in settings_of(entry.settings) if not s.description]
    return missing


def json_schema() -> dict[str, Any]:
    """The config's JSON schema, with every component section spelled out: ``name`` one of the registered
    components, and each component's own keys (for editors' YAML completion and checking)."""
    schema = ExperimentConfig.model_json_schema(ref_template="#/$defs/{model}")
    defs = schema.setdefault("$defs", {})
    for section, reg in sections().items():
        if "(" in section or section == "model.readout":  # chosen by the task kind / a plain string field
            continue
        variants = []
        for entry in reg.entries():
            props: dict[str, Any] = {"name": {"const": entry.name, "description": entry.description}}
            if entry.settings is not None:
                sub = entry.settings.model_json_schema(ref_template="#/$defs/{model}")
                defs.update(sub.pop("$defs", {}))
                props |= sub.get("properties", {})
            variants.append({"type": "object", "properties": props, "required": ["name"],
                             "additionalProperties": False, "title": entry.name})
        title = section.rstrip("[]").replace(".", "_") + "_component"
        defs[title] = {"anyOf": variants, "title": section}
        _point(schema, section, title)
    return schema


def _point(schema: dict[str, Any], section: str, title: str) -> None:
    """Make ``section``'s property refer to the ``title`` definition (an item of it for a list section)."""
    parent, _, key = section.rstrip("[]").rpartition(".")
    node = schema if not parent else schema["$defs"][_def_of(schema, parent)]
    ref = {"$ref": f"#/$defs/{title}"}
    prop = node["properties"][key]
    description = prop.get("description")
    node["properties"][key] = ({"type": "array", "items": ref} if section.endswith("[]") else dict(ref)) \
        | ({"description": description} if description else {})


def _def_of(schema: dict[str, Any], section: str) -> str:
    """The ``$defs`` name of a top-level section's model (``method`` -> ``MethodConfig``)."""
    return schema["properties"][section]["$ref"].rsplit("/", 1)[-1]
