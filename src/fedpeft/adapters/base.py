"""The adapter contract: initial trainable tensors, and how they enter the frozen forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from fedpeft.backbones.loading import Backbone
from fedpeft.lazy import lazy
from fedpeft.registry import Registry

torch = lazy("torch")

Params = dict[str, "torch.Tensor"]
# tensor name -> [(query heads it feeds (global ids layer·H + h), dim, start, end)]: the head-assignable slices
HeadSlices = dict[str, list[tuple[tuple[int, ...], int, int, int]]]


@dataclass
class FrozenText:
    """Text rows the backbone runs once, without any adapter tensor, to a key/value cache that ``repeats``
    candidates share (tiled candidate-major, as the population's batch); the rows of ``Prepared.embeds`` then
    follow it. ``keep``: how many such caches the process keeps for later forwards on the same rows."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    repeats: int
    keep: int


@dataclass
class Prepared:
    """Model inputs after the adapter: embeddings, mask, where (and how many) positions were inserted (one
    position for every row, or an [n] tensor of them), extra keyword arguments for the backbone call (e.g.
    ``past_key_values`` for deep prompts), and a frozen text to run first with a key/value cache, or None."""

    embeds: torch.Tensor
    attention_mask: torch.Tensor
    insert_at: int | torch.Tensor = 0
    inserted: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    text: FrozenText | None = None


@dataclass(frozen=True)
class AdapterContext:
    """What every process knows without communication: the run seed, the task, the resolved readout and the
    shared backbone (an adapter that changes its structure, like LoRA, does so here, once)."""

    seed: int
    task: Any
    readout: str
    backbone: Backbone | None = None


class Adapter(Protocol):
    """Trainable tensors around a frozen backbone.

    ``bind`` receives the run's shared context once (a projection seed, a demonstration pool); ``init``
    returns the initial tensors (plain data, exchanged by name); ``units`` groups tensor names into the
    units a method may share or prune separately (layers, heads); ``prepare`` turns a token batch into
    backbone inputs using them; ``overrides`` returns backbone weights to use instead of the frozen ones
    (full fine-tuning) through ``torch.func.functional_call``, or None.
    """

    name: str

    def bind(self, ctx: AdapterContext) -> None: ...

    def init(self, backbone: Backbone, generator: torch.Generator) -> Params: ...

    def units(self, params: Params) -> dict[str, str]: ...

    def prepare(self, backbone: Backbone, params: Params, input_ids: torch.Tensor,
                attention_mask: torch.Tensor, lead: int) -> Prepared: ...

    def overrides(self, params: Params) -> Params | None: ...


class AdapterBase:
    """Defaults: nothing to bind, every tensor its own unit, no backbone weight overridden."""

    name = ""
    # its forward can be recomputed by activation checkpointing (``runtime.gradient_checkpointing``): it feeds the
    # model no key/value cache, which a recomputed forward would extend twice
    checkpointable = False
    # its model inputs are the tokens' own embeddings, row by row (no inserted rows, no key/value cache), so a
    # batch's rows can be packed into one sequence without padding (``runtime.padding_free``)
    packable = False
    # it has float tensors a gradient trainer can train (a template alone or token ids have none)
    differentiable = True

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = cfg

    def bind(self, ctx: AdapterContext) -> None:
        pass

    def units(self, params: Params) -> dict[str, str]:
        return {k: k for k in params}

    def head_slices(self, backbone: Backbone) -> HeadSlices:
        """Slices of the tensors that feed one attention head (empty: nothing is head-assignable)."""
        return {}

    def initialise(self, objective: Any, params: Params, generator: torch.Generator) -> Params:
        """The initial tensors after the objective drew its own (a readout head): where an adapter's initialisation
        reads a few training examples through the objective (LoRA-SB's approximated first step), else ``params``."""
        return params

    def fixed(self, params: Params) -> list[str]:
        """Tensors of ``params`` that belong to the adapter's state but are never trained (LoRA-SB's B and A)."""
        return []

    def overrides(self, params: Params) -> Params | None:
        return None

    def to_peft(self, backbone: Backbone, params: Params, task_type: str) -> tuple[Any, Params]:
        """HF PEFT's config and its state dict of ``params`` (what ``PeftModel.from_pretrained`` loads; ``task_type``
        e.g. ``CAUSAL_LM``); adapters without a PEFT format refuse."""
        able = sorted(n for n in ADAPTERS.names() if "to_peft" in vars(ADAPTERS.get(n)))
        raise ValueError(f"method.adapter.name: '{self.name}' has no PEFT format (adapters that export: "
                         f"{', '.join(able)})")


def insert_rows(embeds: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor,
                at: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Splice ``rows`` ([n, m, d]) into every sequence at position ``at`` (one for all, or an [n] tensor with
    one per sequence); the mask gets m ones there. Pure copies: the values are those of ``cat``."""
    n, t, d = embeds.shape
    m = rows.shape[1]
    at = torch.as_tensor(at, device=embeds.device).expand(n).unsqueeze(1)  # [n, 1]
    j = torch.arange(t + m, device=embeds.device).unsqueeze(0)            # output positions [1, t + m]
    inside = (j >= at) & (j < at + m)
    src = torch.where(j < at, j, j - m).clamp(0, t - 1)                    # the input position of a text slot
    text = embeds.gather(1, src.unsqueeze(-1).expand(-1, -1, d))
    rows = rows.to(embeds.device, embeds.dtype)
    prompt = rows.gather(1, (j - at).clamp(0, m - 1).unsqueeze(-1).expand(-1, -1, d))
    mask = torch.where(inside, torch.ones_like(src), attention_mask.gather(1, src)).to(attention_mask.dtype)
    return torch.where(inside.unsqueeze(-1), prompt, text), mask


def text_mask(attention_mask: torch.Tensor, insert_at: int | torch.Tensor, inserted: int) -> torch.Tensor:
    """``attention_mask`` with the ``inserted`` adapter positions from ``insert_at`` (one, or one per row) zeroed:
    the text positions only."""
    j = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    at = torch.as_tensor(insert_at, device=attention_mask.device).reshape(-1, 1)
    return attention_mask * ~((j >= at) & (j < at + inserted))


ADAPTERS: Registry[type] = Registry("adapter")  # class taking its settings object (or None)
