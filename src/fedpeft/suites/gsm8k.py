"""GSM8K (``gsm8k``): grade-school maths by exact match of the final number, lm-evaluation-harness's ``gsm8k`` task
(``lm_eval/tasks/gsm8k/gsm8k.yaml``, version 3) rewritten over ``shared/data/GSM8K``'s JSON lines.

- the context: ``shots`` solved problems, the first rows of the train split (``first_n``), each ``Question:
  <question>\\nAnswer: <worked answer>`` and a blank line, then ``Question: <question>\\nAnswer:``;
- decoding: greedy, at most ``max_new_tokens`` (lm-eval's default 256), cut at ``Question:``, ``</s>`` or
  ``<|im_end|>``;
- scoring: exact match after lm-eval's normalisation (case ignored; commas, ``$``, everything up to ``#### `` and a
  final full stop removed) of the number read from the completion against the gold after ``####``:
  ``strict`` reads the number after ``#### ``, ``flexible`` the last number written (lm-eval's two filters).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedpeft.data.paths import DataNotFoundError, shared_data_dir
from fedpeft.suites.base import SUITES, SuiteResult, json_lines, standard_error
from fedpeft.suites.completion import encode_texts, generate

STOPS = ("Question:", "</s>", "<|im_end|>")
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")


class GSM8KSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit_field: ClassVar[str] = "limit"

    data_dir: str | None = Field(None, description="folder with train.jsonl and test.jsonl (default: "
                                                   "shared/data/GSM8K)")
    shots: int = Field(5, ge=0, le=8, description="solved train problems before each question (lm-eval: 5)")
    limit: int | None = Field(None, ge=1, description="the first this many test problems (None: all 1,319)")
    max_new_tokens: int = Field(256, ge=1, description="the completion's token budget (lm-eval's max_gen_toks)")


def read_jsonl(path: Path) -> list[dict[str, str]]:
    """GSM8K rows; ValueError naming the file and line of a row that is not an object with question and answer."""
    if not path.is_file():
        raise DataNotFoundError(f"{path}: GSM8K's file is missing (shared/data/GSM8K holds it)")
    rows = []
    for n, row in json_lines(path):
        if not isinstance(row.get("question"), str) or "####" not in str(row.get("answer", "")):
            raise ValueError(f"{path}:{n}: a GSM8K row has a question and an answer ending '#### <number>'")
        rows.append(row)
    return rows


def normalise(text: str) -> str:
    """lm-eval's ``exact_match`` preparation for gsm8k: the ignored patterns removed, lower case, stripped."""
    for pattern in IGNORE:
        text = re.sub(pattern, "", text)
    return text.lower().strip()


def extract(completion: str, mode: str) -> str:
    """The number lm-eval's filter reads (``strict``: after ``#### ``; ``flexible``: the last number), or
    ``[invalid]`` (lm-eval's fallback)."""
    found = (STRICT if mode == "strict" else FLEXIBLE).findall(completion)
    if not found:
        return "[invalid]"
    match = found[0 if mode == "strict" else -1]
    if isinstance(match, tuple):
        match = next((g for g in match if g), None)
        if match is None:
            return "[invalid]"
    return match.strip()


def context_of(question: str, shots: list[dict[str, str]]) -> str:
    solved = "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)
    return f"{solved}Question: {question}\nAnswer:"


@SUITES.register("gsm8k", "GSM8K: exact match of the final number (lm-eval's gsm8k: 5 shots, greedy, strict "
                 "and flexible extraction)", GSM8KSettings)
class GSM8K:
    def __init__(self, settings: GSM8KSettings) -> None:
        self.settings = settings

    def run(self, objective: Any, params: dict[str, Any], batch_size: int = 16,
            progress: bool = False) -> SuiteResult:
        s = self.settings
        if s.data_dir is not None:
            folder = Path(s.data_dir)
        else:
            root = shared_data_dir()
            if root is None:
                raise DataNotFoundError.for_task("gsm8k", "GSM8K", None)
            folder = root / "GSM8K"
        test = read_jsonl(folder / "test.jsonl")[:s.limit]
        shots = read_jsonl(folder / "train.jsonl")[:s.shots] if s.shots else []
        tok = objective.backbone.tokenizer
        enc = encode_texts(tok, [context_of(r["question"], shots) for r in test])
        outputs = generate(objective, params, enc, [s.max_new_tokens] * len(test), batch_size, STOPS, progress,
                           "gsm8k")
        records = []
        for k, (row, out) in enumerate(zip(test, outputs)):
            gold = normalise(row["answer"])
            rec = {"row": k, "gold": gold, "output": out}
            for mode in ("strict", "flexible"):
                rec[mode] = extract(out, mode)
                rec[f"{mode}_correct"] = normalise(rec[mode]) == gold
            records.append(rec)
        scores = {}
        for mode in ("strict", "flexible"):
            acc = float(np.mean([r[f"{mode}_correct"] for r in records])) if records else float("nan")
            scores[f"exact_match_{mode}"] = 100 * acc
            scores[f"exact_match_{mode}_se"] = 100 * standard_error(acc, len(records))
        protocol = {"source": "lm-evaluation-harness lm_eval/tasks/gsm8k/gsm8k.yaml (version 3)",
                    "items": len(test), "shots": s.shots, "max_new_tokens": s.max_new_tokens, "decoding": "greedy",
                    "stop": list(STOPS), "scores_in": "percent"}
        return SuiteResult("gsm8k", scores, records, protocol)
