"""The pure algorithm contract every method implements, and presets: named points on the four axes.

A method is four functions over plain data (``Message`` = named tensors + JSON scalars):
``server_init``, ``configure_round`` (which also selects the clients), ``client_update`` and ``aggregate``
(plus the evaluation pair). The embedded runner, the Flower adapter, checkpointing and the tests all call
these same functions; nothing in them knows which runtime delivered the message. There is one
implementation, ``methods.composed.ComposedMethod``; a preset only names its components and defaults.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from typing import Any, Protocol

from fedpeft.clients import ClientContext
from fedpeft.comm.codec import Message, WireSpec
from fedpeft.comm.update import ReplySchema
from fedpeft.registry import Registry

__all__ = ["PRESETS", "ClientContext", "Method", "Preset", "ReplySchema"]


class Method(Protocol):
    name: str
    wire: WireSpec

    def server_init(self) -> Message: ...

    def configure_round(self, state: Message, round: int, clients: list[int]) -> dict[int, Message]: ...

    def client_update(self, instruction: Message, client: ClientContext) -> Message: ...

    def reply_schema(self, state: Message) -> ReplySchema: ...

    def aggregate(self, state: Message, round: int, replies: dict[int, Message]) -> Message: ...

    def configure_evaluate(self, state: Message, round: int, clients: list[int]) -> dict[int, Message]: ...

    def client_evaluate(self, instruction: Message, client: ClientContext) -> Message: ...

    def evaluate_global(self, state: Message) -> dict[str, Any]: ...

    def evaluate_on(self, state: Message, data: Any) -> dict[str, Any]:
        """The global tensors' metrics on other labelled encoded data (the validation split of ``keep_best``)."""
        ...

    def evaluate_once(self, state: Message, round: int,
                      clients: list[int]) -> tuple[dict[str, float], dict[int, dict[str, float]]] | None:
        """``evaluate_global`` and each client's ``client_evaluate`` metrics from one pass over the test set, or
        None where the clients must evaluate themselves (personal tensors, post-tuning, a lossy download)."""
        ...

    def trainable_params(self, state: Message) -> int: ...

    def diagnostics(self, state: Message) -> dict[str, float]: ...

    def reply_record(self, reply: Message) -> dict[str, Any]:
        """Fields an accepted reply adds to its client's round record beyond its numeric scalars (e.g. which
        heads it kept)."""
        ...

    # optional: ``vectors(state) -> dict[str, list[float]]``, per-round vectors for the report's heatmaps


@dataclass(frozen=True)
class Preset:
    """A named method: defaults for the ``method`` config section (one entry per component)."""

    name: str
    description: str
    method_defaults: dict[str, Any]
    module: str = ""  # the module that registered it, whose docstring names the paper (a model card cites it)

    def defaults(self) -> dict[str, Any]:
        return copy.deepcopy(self.method_defaults)


PRESETS: Registry[Preset] = Registry("method")


DEFAULTS = {"selector": {"name": "uniform"}, "sharing": {"name": "all"}, "downlink": {"name": "dense"},
            "post_tuning": {"name": "none"}, "codec": {"dtype": "float32"}}


def preset(name: str, description: str, **components: Any) -> None:
    """Register a preset: ``components`` are the ``method`` sections (adapter=..., trainer=..., ...); selector,
    sharing policy, download codec, post-tuning and wire dtype default to uniform selection, everything shared,
    the tensors as they are, none, float32. The calling module is recorded (``Preset.module``): its docstring's first
    paragraph names the paper the preset follows."""
    module = sys._getframe(1).f_globals.get("__name__", "")  # the caller: fedpeft.methods.<paper>, or a plugin's
    PRESETS.add(name, Preset(name, description, copy.deepcopy(DEFAULTS) | components, module))
