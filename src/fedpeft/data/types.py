"""Plain data records shared by tasks, templates and partitioners."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Example:
    """One labelled example; ``text_b`` is set for sentence-pair tasks, ``group`` (a domain, user, site, ...)
    for tasks split into natural clients by the ``by_column`` partition scheme.

    Generation tasks: ``text_a`` is the instruction, ``text_b`` the input/context (None when empty), ``label`` 0,
    ``target`` the response the model learns to write and ``references`` every reference text (empty: just target).
    Preference tasks: ``target`` is the chosen response and ``rejected`` the rejected one; ``history`` the dialogue's
    earlier turns as (role, text) pairs, role "user" or "assistant" (rendered in the model's chat template).
    """

    text_a: str
    label: int
    text_b: str | None = None
    group: str | None = None
    target: str | None = None
    references: tuple[str, ...] = ()
    rejected: str | None = None
    history: tuple[tuple[str, str], ...] = ()

    @property
    def domain(self) -> str | None:
        """Alias of ``group`` (the name used by multi-domain tasks)."""
        return self.group

    @property
    def refs(self) -> tuple[str, ...]:
        """The reference texts metrics compare against: ``references``, else ``(target,)``, else none."""
        if self.references:
            return self.references
        return () if self.target is None else (self.target,)


@dataclass
class TaskData:
    """A loaded task: splits plus everything a readout needs to score classes (or, generation, to build prompts).

    ``template`` is for masked LMs and must contain ``{mask}``; ``causal_template`` ends where the
    label word is predicted as the next token. Both use ``{text_a}`` and, for pairs, ``{text_b}``.
    ``kind`` is "classification", "generation" or "preference" (pairs of a chosen and a rejected response to one
    prompt, for preference optimisation); a generation or preference task has no classes (empty class names, label
    words and descriptions) and its ``prompt_template`` (``{instruction}``, ``{input}``; None: the model's chat
    template or the built-in default) frames each example's instruction and input.
    """

    name: str
    class_names: list[str]
    train: list[Example]
    test: list[Example]
    label_words: list[str]
    label_descriptions: list[str]
    template: str = "{text_a} It was {mask}."
    causal_template: str = "{text_a}\nAnswer:"
    is_pair: bool = False
    info: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # the user's data files read (fingerprinted by a run)
    kind: str = "classification"  # or "generation", "preference"
    prompt_template: str | None = None  # generation: user prompt with {instruction} and {input}
    truncation: str = "keep_start"  # where a too-long text's fields are cut (task.truncation)
    label_word_spacing: str = "space"  # verbalizer: how a label word is tokenized (task.label_word_spacing)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def is_generation(self) -> bool:
        """True for the text tasks of a causal LM (instruction/response generation and preference pairs): no
        classes, prompts in the model's chat template; False for classification."""
        return self.kind in ("generation", "preference")

    @property
    def is_preference(self) -> bool:
        """True for preference tasks (a chosen and a rejected response per prompt)."""
        return self.kind == "preference"

    SPEC_FIELDS = ("name", "class_names", "label_words", "label_descriptions", "template", "causal_template",
                   "is_pair", "kind", "prompt_template", "truncation", "label_word_spacing")

    def spec(self) -> dict[str, Any]:
        """Everything a readout needs to score classes, without the examples (a run keeps it in ``task.json``)."""
        return {k: getattr(self, k) for k in self.SPEC_FIELDS}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> TaskData:
        """The task of ``spec()`` with empty splits: enough to classify new texts as the run did. A key missing
        from an older spec (``kind``, ``prompt_template``, ``label_word_spacing``) takes its default; a generation
        spec without ``truncation`` was written when prompts were cut at their start (``keep_end``), a
        classification one when texts were cut at their end (the default)."""
        generation = spec.get("kind", "classification") in ("generation", "preference")
        old = {"truncation": "keep_end"} if "truncation" not in spec and generation else {}
        return cls(**{k: spec[k] for k in cls.SPEC_FIELDS if k in spec} | old, train=[], test=[])
