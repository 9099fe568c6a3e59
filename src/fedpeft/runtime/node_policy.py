"""What a SuperNode insists on, whatever the server sends: its own policy, from its ``--node-config``.

A Flower deployment's server sends every node the experiment's config and run settings, and decides the protocol of
each round. A node's owner can hold the server to less: ``fedpeft flower supernode --require-secure-aggregation``
(or ``--policy node-policy.yaml``) writes these settings into the node's ``--node-config`` (``require-secure-
aggregation=true min-num-shares=3 ...``), and the node checks each message against them before it computes:

- a TRAIN message outside SecAgg+ is refused when the node requires secure aggregation (a curious server, or one
  plain message mid-run, would otherwise receive the node's update in clear), and so is a SecAgg+ setup below the
  node's floor (fewer shares, a lower reconstruction threshold, or a threshold at or below half the shares: a
  server that splits a node's neighbours into two groups could then rebuild both of its secrets);
- the config may not set ``model.trust_remote_code`` unless the node allows it, nor name a model outside the node's
  list when it has one;
- the run's state folder is the node's ``state-dir`` joined with a run key that is one plain name (no ``/``, no
  ``..``), never a path the server chose.

Every refusal raises ``PolicyError`` (the server sees the node's clients fail) and logs one line on the node.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedpeft.config import ModelConfig

log = logging.getLogger("fedpeft.flower.node")

RUN_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class PolicyError(PermissionError):
    """The server asked for something this node's policy refuses."""


class NodePolicy(BaseModel):
    """A SuperNode's own limits on what the server may ask of it (``--node-config`` keys in kebab case)."""

    model_config = ConfigDict(extra="forbid")

    require_secure_aggregation: bool = Field(
        False, description="refuse every TRAIN message outside SecAgg+, and SecAgg+ setups below the floor below")
    min_num_shares: int = Field(3, ge=2, description="with require_secure_aggregation: the fewest shares each "
                                                     "secret may be split into (the node's neighbours, itself "
                                                     "included)")
    min_reconstruction_threshold: int = Field(
        2, ge=1, description="with require_secure_aggregation: the fewest shares that may rebuild a secret")
    threshold_majority: bool = Field(
        True, description="with require_secure_aggregation: refuse a threshold at or below half the shares (then "
                          "no split of the node's neighbours gives the server both of its secrets)")
    trust_remote_code: bool = Field(
        False, description="let the server's config set model.trust_remote_code (run Python code shipped with a "
                           "model on this node)")
    models: list[str] | None = Field(None, description="the only model.name values the node loads (None: any)")

    @classmethod
    def from_node_config(cls, node_config: dict[str, Any]) -> NodePolicy:
        """The policy in a node's ``--node-config`` (the keys of this model in kebab case; others are ignored)."""
        names = {name.replace("_", "-"): name for name in cls.model_fields}
        values: dict[str, Any] = {names[k]: v for k, v in node_config.items() if k in names}
        if isinstance(values.get("models"), str):
            values["models"] = [m for m in values["models"].split(",") if m]
        try:
            return cls(**values)
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"--node-config {str(err['loc'][0]).replace('_', '-')}: {err['msg']}") from None

    def node_config(self) -> str:
        """This policy as ``--node-config`` text (only what differs from the defaults)."""
        parts = []
        for name, value in self.model_dump(exclude_defaults=True).items():
            text = ",".join(value) if isinstance(value, list) else value
            parts.append(f"{name.replace('_', '-')}={_toml(text)}")
        return " ".join(parts)

    def refuse(self, why: str) -> PolicyError:
        log.error("node policy: refused: %s", why)
        return PolicyError(f"this node's policy refuses it: {why}")

    def check_plain_train(self) -> None:
        """A TRAIN message outside SecAgg+."""
        if self.require_secure_aggregation:
            raise self.refuse("a training message without secure aggregation (the node requires SecAgg+: start "
                              "the run with federation.secure_aggregation)")

    def check_secure_setup(self, num_shares: int, threshold: int) -> None:
        """A SecAgg+ setup's share count and reconstruction threshold against the node's floor."""
        if not self.require_secure_aggregation:
            return
        if num_shares < self.min_num_shares:
            raise self.refuse(f"SecAgg+ with {num_shares} shares, below the node's minimum {self.min_num_shares}")
        if threshold < self.min_reconstruction_threshold:
            raise self.refuse(f"SecAgg+ with reconstruction threshold {threshold}, below the node's minimum "
                              f"{self.min_reconstruction_threshold}")
        if self.threshold_majority and 2 * threshold <= num_shares:
            raise self.refuse(f"SecAgg+ with reconstruction threshold {threshold} of {num_shares} shares: at or "
                              "below half, a server that splits the neighbours can rebuild both of a node's secrets")

    def check_model(self, model: ModelConfig) -> None:
        """The ``model`` section of the server's experiment config against what this node loads."""
        if model.trust_remote_code and not self.trust_remote_code:
            raise self.refuse(f"model.trust_remote_code for {model.name!r}: the node does not run code shipped "
                              "with a model (start it with trust-remote-code=true to allow it)")
        if self.models is not None and model.name not in self.models:
            raise self.refuse(f"model.name {model.name!r} is not among the node's models {self.models}")


def load_policy(path: str | Path | None, require_secure_aggregation: bool = False) -> NodePolicy:
    """A node's policy from its YAML file (``path``; none: the defaults), ``--require-secure-aggregation`` on top;
    an unknown or malformed key is a ``ValueError`` naming the file and the key."""
    import yaml

    data: dict[str, Any] = {}
    if path is not None:
        if not Path(path).is_file():
            raise ValueError(f"--policy: no such file {path} (resolved: {Path(path).resolve()})")
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: invalid YAML: {getattr(e, 'problem', e)}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a node policy is a mapping of settings, not {type(data).__name__}")
    if require_secure_aggregation:
        data["require_secure_aggregation"] = True
    try:
        return NodePolicy(**data)
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(f"{path}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def state_root(node_config: dict[str, Any], settings: dict[str, Any]) -> Path:
    """The run's client-state folder: the node's ``state-dir`` (else the server's, in simulation, where the server
    and the nodes share one machine and one run directory) joined with the server's run key, one plain name."""
    key = str(settings.get("run_key", ""))
    if not RUN_KEY.match(key):
        raise PolicyError(f"the server's run key {key!r} is not one plain name ([A-Za-z0-9_-], at most 64)")
    return Path(str(node_config.get("state-dir") or settings["state_dir"])) / key


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return f"'{value}'"
