"""MMLU by choice log-likelihood (``mmlu``), the usual protocol: lm-evaluation-harness's ``mmlu`` task
(``lm_eval/tasks/mmlu/default``, Hendrycks et al.'s prompt), 0 to 5 shots.

- the context: ``The following are multiple choice questions (with answers) about <subject>.`` and a blank line
  (the subject's name with spaces), then ``shots`` solved examples, the first rows of the subject's dev split
  (lm-eval's ``first_n`` sampler), each ``<question>\\nA. ..\\nB. ..\\nC. ..\\nD. ..\\nAnswer: <letter>`` and a
  blank line, then the question in the same form ending ``Answer:``;
- the choices ``" A"`` to ``" D"`` (lm-eval's target delimiter, a space); the prediction is the choice of highest
  summed log-probability (``loglikelihood``); accuracy per item.

Reported: the accuracy over all items (lm-eval's group score, weighted by size), per category (FlowerTune's three,
so that the two MMLU protocols read side by side) and its standard error. ``per_subject`` scores the fixed
stratified subset of ``mmlu_data``. The same data through lm-eval itself is ``lmeval:mmlu``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedpeft.suites.base import SUITES, SuiteResult, standard_error
from fedpeft.suites.loglikelihood import loglikelihoods
from fedpeft.suites.mmlu_data import (CATEGORIES, LETTERS, Item, category_of, folder_of, load_items, read_subject,
                                      subject_file)


class MMLUSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit_field: ClassVar[str] = "per_subject"

    data_dir: str | None = Field(None, description="folder with MMLU's test/ and dev/ CSVs and "
                                                   "flowertune_categories.json (default: shared/data/MMLU)")
    categories: list[str] = Field(list(CATEGORIES), description="MMLU categories to score")
    shots: int = Field(5, ge=0, le=5, description="solved dev examples before each question (the first rows of "
                                                  "the subject's dev split)")
    per_subject: int | None = Field(None, ge=1, description="a fixed stratified subset: this many items drawn from "
                                                            "every subject (None: every test item)")
    seed: int = Field(0, description="the draw of the stratified subset")


def question_text(item: Item) -> str:
    """lm-eval's ``doc_to_text``."""
    options = "".join(f"\n{letter}. {text}" for letter, text in zip(LETTERS, item.options))
    return f"{item.question.strip()}{options}\nAnswer:"


def context_of(item: Item, shots: list[Item]) -> str:
    """The description, the solved examples and the question."""
    head = f"The following are multiple choice questions (with answers) about {item.subject.replace('_', ' ')}.\n\n"
    solved = "".join(f"{question_text(s)} {s.gold}\n\n" for s in shots)
    return head + solved + question_text(item)


@SUITES.register("mmlu", "MMLU by choice log-likelihood, 0-5 shots (lm-eval's mmlu prompt); accuracy overall "
                 "and per category", MMLUSettings)
class MMLU:
    def __init__(self, settings: MMLUSettings) -> None:
        self.settings = settings

    def run(self, objective: Any, params: dict[str, Any], batch_size: int = 16,
            progress: bool = False) -> SuiteResult:
        s = self.settings
        folder = folder_of(s.data_dir, "mmlu")
        items = load_items(folder, list(s.categories), s.per_subject, s.seed)
        dev: dict[str, list[Item]] = {}
        pairs = []
        for item in items:
            if item.subject not in dev:
                dev[item.subject] = (read_subject(subject_file(folder, item.subject, "dev"), item.subject)[:s.shots]
                                     if s.shots else [])
                if len(dev[item.subject]) < s.shots:
                    raise ValueError(f"shots: {s.shots}, but {subject_file(folder, item.subject, 'dev')} has "
                                     f"{len(dev[item.subject])} rows")
            context = context_of(item, dev[item.subject])
            pairs.extend((context, f" {letter}") for letter in LETTERS)
        ll, _ = loglikelihoods(objective, params, pairs, batch_size)
        ll = ll.reshape(len(items), len(LETTERS))
        category = category_of(folder, list(s.categories))
        records = []
        for item, row in zip(items, ll):
            pred = LETTERS[int(np.argmax(row))]
            records.append({"category": category[item.subject], "subject": item.subject, "row": item.row,
                            "gold": item.gold, "loglikelihoods": [float(x) for x in row], "prediction": pred,
                            "correct": pred == item.gold})
        acc = float(np.mean([r["correct"] for r in records])) if records else math.nan
        scores = {"accuracy": 100 * acc, "accuracy_se": 100 * standard_error(acc, len(records))}
        for cat in s.categories:
            hits = [r["correct"] for r in records if r["category"] == cat]
            a = float(np.mean(hits)) if hits else math.nan
            scores[cat], scores[f"{cat}_se"], scores[f"{cat}_n"] = 100 * a, 100 * standard_error(a, len(hits)), \
                len(hits)
        protocol = {"source": "lm-evaluation-harness lm_eval/tasks/mmlu/default (prompt, first_n dev shots)",
                    "items": len(items), "shots": s.shots, "per_subject": s.per_subject, "seed": s.seed,
                    "categories": list(s.categories), "scoring": "choice log-likelihood", "scores_in": "percent"}
        return SuiteResult("mmlu", scores, records, protocol)
