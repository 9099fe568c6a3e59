"""Turn instruction examples into token ids for a causal LM: prompt (instruction + input) then response.

The prompt is ``task.prompt_template`` with ``{instruction}`` and ``{input}`` when the user sets one, else the
tokenizer's chat template around one user turn (instruction, a blank line, the input) when the model has one
(SmolLM2-Instruct does), else the Alpaca template (``ALPACA``; its no-input variant when the example has no input). The template's fixed text and
the fields are tokenized separately, so a long field is cut and never the template. The response is the target
text plus the end-of-sequence token, cut at ``max_response_length``; the prompt's fields are then cut from the
left, longest field first, until prompt + response fit ``max_length``. Only response positions are scored
(``Encoded.response_start``), as TRL's completion-only loss.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

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
        """(kind, text) pieces of ``ex``'s prompt: ``lit`` (template text) or a field with its value."""
        instruction, context = ex.text_a, ex.text_b or ""
        if self.chat:
            rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}],
                                                          add_generation_prompt=True, tokenize=False)
            head, tail = rendered.split(_SENTINEL)
            parts = [("lit", head), ("instruction", instruction)]
            if context:
                parts += [("lit", "\n\n"), ("input", context)]
            return parts + [("lit", tail)]
        template = self.template or (ALPACA if context else ALPACA_NO_INPUT)
        values = {"instruction": instruction, "input": context}
        return [(k, s if k == "lit" else values[k]) for k, s in template_segments(template, _FIELD)]

    def prompt_text(self, ex: Example) -> str:
        """The prompt as one string (what ``fedpeft generate`` shows a user)."""
        return "".join(text for _, text in self.segments(ex))


@dataclass
class Cuts:
    """How many examples lost tokens to the length limits (logged once per encoding)."""

    prompts: int = 0
    responses: int = 0


def _cut_left(fields: dict[int, list[int]], budget: int) -> bool:
    """Drop tokens from the left of the longest field until all fit ``budget``; whether any was dropped."""
    cut = False
    while sum(len(v) for v in fields.values()) > budget:
        key = max(fields, key=lambda k: len(fields[k]))
        fields[key].pop(0)
        cut = True
    return cut


def encode_instructions(backbone: Backbone, fmt: PromptFormat, examples: list[Example], max_length: int,
                        max_response_length: int, with_response: bool = True) -> Encoded:
    """Prompt (+ response and end token when ``with_response``) ids per example, and where each response starts.

    ValueError naming ``task.max_length`` when the template and response leave no token for the prompt's fields."""
    tok = backbone.tokenizer
    end = end_token_id(tok)
    cuts = Cuts()
    ids_all, starts = [], []
    lit_cache: dict[str, list[int]] = {}
    for ex in examples:
        response: list[int] = []
        if with_response:
            response = tok(ex.target or "", add_special_tokens=False, verbose=False)["input_ids"] + [end]
            if len(response) > max_response_length:
                response, cuts.responses = response[:max_response_length], cuts.responses + 1
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
        budget = max_length - fixed - len(response)
        if budget < 1:
            raise ValueError(f"task.max_length {max_length} leaves no room for the prompt: the template takes {fixed} "
                             f"tokens and the response {len(response)} (task.max_response_length "
                             f"{max_response_length}); raise task.max_length or lower task.max_response_length")
        cuts.prompts += _cut_left(fields, budget)
        prompt = list(fmt.lead) + [t for i, p in enumerate(pieces) for t in (fields.get(i, p))]
        ids_all.append(prompt + response)
        starts.append(len(prompt))
    if cuts.prompts or cuts.responses:
        log.info("encoding %d examples: %d prompts cut from the left to fit task.max_length %d, %d responses cut at "
                 "task.max_response_length %d", len(examples), cuts.prompts, max_length, cuts.responses,
                 max_response_length)
    n = len(examples)
    return Encoded(ids_all, np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64), len(fmt.lead),
                   np.array(starts, dtype=np.int64))
