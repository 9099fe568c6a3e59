"""FlowerTune LLM leaderboard, general NLP (``flowertune-general-nlp``): Flower's generative MMLU, to the prediction.

The protocol of ``benchmarks/flowertune-llm/evaluation/general-nlp/`` in flwrlabs/flower (@ 77068b84:
``benchmarks.py``, ``utils.py``), which scores the board's General NLP column:

- data: MMLU test, the 44 subjects of STEM, social sciences and humanities (``MMLU_CATEGORY``; here read from the
  original CSVs in ``shared/data/MMLU``, Flower loads the HF dataset ``lukaemon/mmlu`` built from them);
- prompt: ``format_example`` (a ``?`` added to a question ending in neither ``?`` nor ``.``; ``Question: ...``, a
  blank line, ``Options:`` and ``A. ...`` to ``D. ...``) after the instruction "Answer the following multiple choice
  question." and before ``The answer is:``, inside ``<|im_start|>question\\n ... <|im_end|>\\n<|im_start|>answer\\n``:
  the same markers for every model, not the model's chat template; tokenised as ``tokenizer.encode(prompt)`` does
  (with the tokenizer's special tokens);
- decoding: greedy, as many new tokens as the gold letter has (``max_new_tokens`` of the batch's first gold: every
  gold is one letter), decoded with ``skip_special_tokens``;
- scoring: ``format_answer(output.lower(), gold.lower(), "mcq")`` (below, Flower's code unchanged in behaviour: the
  output's non-alphanumerics become spaces, its first character is the answer if it is a letter a-e or yes/no,
  else the whole output is compared with the gold); sklearn's accuracy per category; the board's average is the
  mean of the three categories' accuracies.

Flower's scripts are research code, not a package (they load from the hub, hard-code ``cuda`` and 4-bit
quantisation and decode one prompt at a time), so the protocol is rewritten here, batched (left padding,
``model.decoding.greedy``, the same tokens as one prompt at a time) and checked against their code run offline
(``benchmarks/standard_eval.py``). ``per_subject`` scores a fixed stratified subset: a seeded draw of that many
items from every subject, the same for every model.
"""

from __future__ import annotations

import math
import re
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedpeft.suites.base import SUITES, SuiteResult, standard_error
from fedpeft.suites.completion import encode_texts, generate
from fedpeft.suites.mmlu_data import CATEGORIES, Item, category_of, folder_of, load_items as load_mmlu

INSTRUCTION = "Answer the following multiple choice question."


class FlowerTuneSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit_field: ClassVar[str] = "per_subject"  # what ``fedpeft evaluate --limit`` sets
    data_dir: str | None = Field(None, description="folder with MMLU's test/ CSVs and flowertune_categories.json "
                                                   "(default: shared/data/MMLU)")
    categories: list[str] = Field(list(CATEGORIES), description="MMLU categories to score (the board's three)")
    per_subject: int | None = Field(None, ge=1, description="a fixed stratified subset: this many items drawn from "
                                                            "every subject (None: all 10,935 test items)")
    seed: int = Field(0, description="the draw of the stratified subset")


def load_items(settings: FlowerTuneSettings) -> list[Item]:
    """The suite's items in Flower's order, cut to the stratified subset where ``per_subject`` is set."""
    return load_mmlu(folder_of(settings.data_dir, "flowertune-general-nlp"), list(settings.categories),
                     settings.per_subject, settings.seed)


def format_example(question: str, choices: tuple[str, ...]) -> str:
    """Flower's ``utils.format_example``."""
    if not question.endswith("?") and not question.endswith("."):
        question += "?"
    options = "\n".join(f"{chr(65 + i)}. {c}" for i, c in enumerate(choices))
    return "Question: " + question + "\n\nOptions:\n" + options


def prompt_of(item: Item) -> str:
    """The text Flower's ``inference`` encodes for one item."""
    prompt = f"{INSTRUCTION}\n{format_example(item.question, item.options)}\nThe answer is:\n"
    return f"<|im_start|>question\n{prompt}<|im_end|>\n<|im_start|>answer\n"


def format_answer(output_full: str, answer: str, answer_type: str = "mcq") -> tuple[str, str]:
    """Flower's ``utils.format_answer``: (prediction, gold) as compared by the accuracy."""
    output, default = output_full, (output_full, answer)
    if "\n##" in output:
        try:
            output = output.split("\n##")[1].split("\n")[0].strip().lower()
        except Exception:  # noqa: BLE001 - Flower's rule: anything unreadable is compared as it is
            return default
    if "###" in answer:
        try:
            answer = answer.split("answer is:")[1].split("###")[0].strip()
        except Exception:  # noqa: BLE001
            return default
    output = re.sub(r"[^a-zA-Z0-9]", " ", output).strip()
    output = re.sub(" +", " ", output)
    if answer_type == "mcq":
        output = output.encode("ascii", "ignore").decode("ascii")[:1]  # clean_mcq_answer: its first character
    if output in ("a", "b", "c", "d", "e", "yes", "no"):
        return output, answer
    return default


@SUITES.register("flowertune-general-nlp", "FlowerTune LLM leaderboard, general NLP: Flower's generative MMLU "
                 "(STEM, social sciences, humanities; accuracy per category and their average)", FlowerTuneSettings)
class FlowerTuneGeneralNLP:
    def __init__(self, settings: FlowerTuneSettings) -> None:
        self.settings = settings

    def run(self, objective: Any, params: dict[str, Any], batch_size: int = 16,
            progress: bool = False) -> SuiteResult:
        from sklearn.metrics import accuracy_score

        items = load_items(self.settings)
        tok = objective.backbone.tokenizer
        budgets = [len(tok(i.gold, add_special_tokens=False)["input_ids"]) for i in items]
        outputs = generate(objective, params, encode_texts(tok, [prompt_of(i) for i in items]), budgets, batch_size,
                           progress=progress, label="flowertune-general-nlp")
        category = category_of(folder_of(self.settings.data_dir, "flowertune-general-nlp"),
                               list(self.settings.categories))
        records, scores = [], {}
        for item, output in zip(items, outputs):
            pred, gold = format_answer(output.lower(), item.gold.lower(), "mcq")
            records.append({"category": category[item.subject], "subject": item.subject, "row": item.row,
                            "gold": item.gold, "output": output, "prediction": pred, "correct": pred == gold})
        per = {}
        for cat in self.settings.categories:
            rows = [r for r in records if r["category"] == cat]
            acc = float(accuracy_score([r["prediction"] for r in rows], [r["gold"].lower() for r in rows]))
            per[cat] = (acc, len(rows))
        average = float(np.mean([a for a, _ in per.values()]))
        scores["average"] = 100 * average
        scores["average_se"] = 100 * math.sqrt(sum(standard_error(a, n) ** 2 for a, n in per.values())) / len(per)
        for cat, (acc, n) in per.items():
            scores[cat], scores[f"{cat}_se"], scores[f"{cat}_n"] = 100 * acc, 100 * standard_error(acc, n), n
        protocol = {"source": "flwrlabs/flower@77068b84 benchmarks/flowertune-llm/evaluation/general-nlp",
                    "items": len(items), "per_subject": self.settings.per_subject, "seed": self.settings.seed,
                    "categories": list(self.settings.categories), "decoding": "greedy",
                    "batch_size": batch_size, "scores_in": "percent"}
        return SuiteResult("flowertune-general-nlp", scores, records, protocol)
