"""Turn instruction examples into token ids for a causal LM: prompt (instruction + input) then response.

The prompt is ``task.prompt_template`` with ``{instruction}`` and ``{input}`` when the user sets one, else the
tokenizer's chat template around one user turn (instruction, a blank line, the input) when the model has one
(SmolLM2-Instruct does), else the Alpaca template (``ALPACA``; its no-input variant when the example has no input). The
template's fixed text and the fields are tokenized separately, so a long field is cut and never the template. The
response is the target text plus the end-of-sequence token, cut at ``max_response_length``; the prompt's fields are then
cut, longest field first, until prompt + response fit ``max_length``: from their end by default (``task.truncation:
keep_start``, as a tokenizer's right truncation: a structured input keeps its first slots, an instruction its first
words), or from their start (``keep_end``: a long context keeps the question that ends it). Every cut is counted per
field; above ``CUT_WARN`` of the examples the encoding warns, naming the field and the setting to raise. Only response
positions are scored (``Encoded.response_start``), as TRL's completion-only loss.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace

import numpy as np

from fedpeft.backbones.encoding import Encoded, special_tokens, template_segments
from fedpeft.backbones.loading import Backbone
from fedpeft.data.types import Example

log = logging.getLogger(__name__)

ALPACA = ("Below is an instruction that describes a task, paired with an input that provides further context. "
          "Write a response that appropriately completes the request.\n\n"
          "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                   "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")
_FIELD = re.compile(r"\{(instruction|input)\}")
_SENTINEL = "\u2063FEDPEFT_CONTENT\u2063"


def end_token_id(tokenizer) -> int:
    """The token that ends a response: the tokenizer's end-of-sequence token, else its separator."""
    for tid in (tokenizer.eos_token_id, tokenizer.sep_token_id):
        if tid is not None:
            return int(tid)
    raise ValueError("task.kind generation: the tokenizer has neither an end-of-sequence nor a separator token to "
                     "end a response with")


def uses_chat_template(tokenizer, prompt_template: str | None) -> bool:
    """A user's ``task.prompt_template`` wins; otherwise the model's chat template where it has one."""
    return prompt_template is None and bool(getattr(tokenizer, "chat_template", None))


@dataclass
class PromptFormat:
    """How a prompt is laid out for one tokenizer: template segments (literal text or a field) and lead ids."""

    tokenizer: object
    chat: bool
    template: str | None
    lead: list[int]

    @classmethod
    def of(cls, backbone: Backbone, prompt_template: str | None) -> PromptFormat:
        tok = backbone.tokenizer
        chat = uses_chat_template(tok, prompt_template)
        lead = [] if chat else special_tokens(tok, "causal")[0]  # a chat template writes its own special tokens
        return cls(tok, chat, prompt_template, lead)

    def segments(self, ex: Example) -> list[tuple[str, str]]:
        """(kind, text) pieces of ``ex``'s prompt: ``lit`` (template text) or a field with its value; a dialogue's
        earlier turns (``Example.history``) come first, each a ``history`` field, in the chat template's turns (or,
        without one, as ``User:``/``Assistant:`` lines before the prompt)."""
        instruction, context = ex.text_a, ex.text_b or ""
        if self.chat:
            marks = [f"\u2063FEDPEFT_TURN{i}\u2063" for i in range(len(ex.history))]
            messages = [{"role": role, "content": m} for (role, _), m in zip(ex.history, marks)]
            rendered = self.tokenizer.apply_chat_template(messages + [{"role": "user", "content": _SENTINEL}],
                                                          add_generation_prompt=True, tokenize=False)
            parts: list[tuple[str, str]] = []
            for (_, text), mark in zip(ex.history, marks):
                head, rendered = rendered.split(mark)
                parts += [("lit", head), ("history", text)]
            head, tail = rendered.split(_SENTINEL)
            parts += [("lit", head), ("instruction", instruction)]
            if context:
                parts += [("lit", "\n\n"), ("input", context)]
            return [p for p in parts if p != ("lit", "")] + [("lit", tail)]
        turns = [piece for role, text in ex.history
                 for piece in (("lit", f"{role.capitalize()}: "), ("history", text), ("lit", "\n\n"))]
        template = self.template or (ALPACA if context else ALPACA_NO_INPUT)
        values = {"instruction": instruction, "input": context}
        return turns + [(k, s if k == "lit" else values[k]) for k, s in template_segments(template, _FIELD)]

    def prompt_text(self, ex: Example) -> str:
        """The prompt as one string (what ``fedpeft generate`` shows a user)."""
        return "".join(text for _, text in self.segments(ex))


CUT_WARN = 0.05  # share of the examples whose prompt or response is cut above which the encoding warns
TRUNCATIONS = ("keep_start", "keep_end")


@dataclass
class Cuts:
    """How many of ``examples`` lost tokens to the length limits: prompts, per field (instruction, input), and
    responses."""

    examples: int = 0
    prompts: int = 0
    fields: dict[str, int] = field(default_factory=dict)
    responses: int = 0

    def describe(self, max_length: int, max_response_length: int, truncation: str) -> str:
        """One line a user can act on: the shares cut, which field lost tokens and at which end, what to raise."""
        if not (self.prompts or self.responses):
            return f"no example cut (task.max_length {max_length})"
        end = "end" if truncation == "keep_start" else "start"
        parts = []
        if self.prompts:
            where = ", ".join(f"the {k} in {n}" for k, n in sorted(self.fields.items(), key=lambda kv: -kv[1]))
            parts.append(f"{self.prompts} of {self.examples} prompts ({self.prompts / self.examples:.0%}) cut at "
                         f"their {end} to fit task.max_length {max_length} ({where}; task.truncation {truncation})")
        if self.responses:
            parts.append(f"{self.responses} of {self.examples} responses ({self.responses / self.examples:.0%}) cut "
                         f"at task.max_response_length {max_response_length}")
        return "; ".join(parts) + "; raise the limit to keep them whole"

    @property
    def share(self) -> float:
        """The larger of the shares of prompts and of responses cut."""
        return max(self.prompts, self.responses) / max(self.examples, 1)


def cut_fields(fields: dict[int, list[int]], budget: int, truncation: str = "keep_start") -> set[int]:
    """Drop tokens from the longest field until all fit ``budget``, from its end (``keep_start``) or its start
    (``keep_end``); the keys of the fields that lost tokens."""
    if truncation not in TRUNCATIONS:
        raise ValueError(f"task.truncation: unknown '{truncation}'; allowed: {', '.join(TRUNCATIONS)}")
    cut: set[int] = set()
    while sum(len(v) for v in fields.values()) > budget:
        key = max(fields, key=lambda k: len(fields[k]))
        fields[key].pop(-1 if truncation == "keep_start" else 0)
        cut.add(key)
    return cut


def response_ids(tok, text: str | None, end: int, max_response_length: int, cuts: Cuts) -> list[int]:
    """A response's ids and the end token, cut at ``max_response_length`` (counted in ``cuts``)."""
    ids = tok(text or "", add_special_tokens=False, verbose=False)["input_ids"] + [end]
    if len(ids) > max_response_length:
        ids, cuts.responses = ids[:max_response_length], cuts.responses + 1
    return ids


def prompt_ids(tok, fmt: PromptFormat, ex: Example, max_length: int, reserved: int, max_response_length: int,
               lit_cache: dict[str, list[int]], truncation: str) -> tuple[list[int], list[str]]:
    """``ex``'s prompt ids in ``max_length - reserved`` tokens (its fields cut, ``cut_fields``; ``reserved``: the
    response's) and the kinds of the fields cut. Where the template's own text leaves no room, a dialogue loses its
    oldest exchanges (user and assistant turn) first, counted as a cut of its history; ValueError naming
    ``task.max_length`` when the template and the response still leave no token for the prompt's fields."""
    dropped = False
    while True:
        segs = fmt.segments(ex)
        pieces: list[list[int]] = []
        fields: dict[int, list[int]] = {}
        for i, (kind, text) in enumerate(segs):
            if kind == "lit":
                if text not in lit_cache:
                    lit_cache[text] = tok(text, add_special_tokens=False)["input_ids"]
                pieces.append(lit_cache[text])
            else:
                fields[i] = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
                pieces.append(fields[i])
        fixed = len(fmt.lead) + sum(len(p) for i, p in enumerate(pieces) if i not in fields)
        budget = max_length - fixed - reserved
        if budget >= 1 or not ex.history:
            break
        ex, dropped = replace(ex, history=ex.history[2:]), True
    if budget < 1:
        raise ValueError(f"task.max_length {max_length} leaves no room for the prompt: the template takes {fixed} "
                         f"tokens and the response {reserved} (task.max_response_length {max_response_length}); "
                         "raise task.max_length or lower task.max_response_length")
    cut = [segs[i][0] for i in cut_fields(fields, budget, truncation)] + (["history"] if dropped else [])
    return list(fmt.lead) + [t for i, p in enumerate(pieces) for t in (fields.get(i, p))], sorted(set(cut))


def log_cuts(cuts: Cuts, what: str, max_length: int, max_response_length: int, truncation: str) -> None:
    """One log line of what the limits cut (a warning above ``CUT_WARN``), if anything was."""
    if cuts.prompts or cuts.responses:
        level = logging.WARNING if cuts.share > CUT_WARN else logging.INFO
        log.log(level, "encoding %d %s: %s", cuts.examples, what,
                cuts.describe(max_length, max_response_length, truncation))


def count_cut(cuts: Cuts, cut: list[str]) -> None:
    """Count one prompt's cut fields (``prompt_ids``) in ``cuts``."""
    for kind in cut:
        cuts.fields[kind] = cuts.fields.get(kind, 0) + 1
    cuts.prompts += bool(cut)


def encode_instructions(backbone: Backbone, fmt: PromptFormat, examples: list[Example], max_length: int,
                        max_response_length: int, with_response: bool = True,
                        truncation: str = "keep_start") -> Encoded:
    """Prompt (+ response and end token when ``with_response``) ids per example, where each response starts, and
    which prompts were cut (``Encoded.prompt_cut``; the counts in ``Encoded.cuts``).

    ValueError naming ``task.max_length`` when the template and response leave no token for the prompt's fields."""
    tok = backbone.tokenizer
    end = end_token_id(tok)
    cuts = Cuts(examples=len(examples))
    ids_all, starts, prompt_cut = [], [], []
    lit_cache: dict[str, list[int]] = {}
    for ex in examples:
        response: list[int] = []
        if with_response:
            response = response_ids(tok, ex.target, end, max_response_length, cuts)
        prompt, cut = prompt_ids(tok, fmt, ex, max_length, len(response), max_response_length, lit_cache,
                                 truncation)
        count_cut(cuts, cut)
        prompt_cut.append(bool(cut))
        ids_all.append(prompt + response)
        starts.append(len(prompt))
    log_cuts(cuts, "examples", max_length, max_response_length, truncation)
    n = len(examples)
    return Encoded(ids_all, np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64), len(fmt.lead),
                   np.array(starts, dtype=np.int64), np.array(prompt_cut, dtype=bool), cuts)
