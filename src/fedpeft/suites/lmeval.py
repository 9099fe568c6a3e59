"""lm-evaluation-harness as a suite (``lmeval:TASK``): lm-eval scores the model itself, by its own task code.

The bridge hands lm-eval's ``HFLM`` the backbone's HF model with the adapter in place as weights
(``model.decoding.weights_in_place``: LoRA merged, as PEFT's ``merge_and_unload`` model computes), and runs
``lm_eval.simple_evaluate`` on fedpeft's local task YAMLs (``lmeval_tasks/``) with the data of ``shared/data`` (no
hub): ``boolq`` (SuperGLUE BoolQ, lm-eval's prompt) and ``mmlu`` (lm-eval's MMLU prompt over the original CSVs;
the group ``fedpeft_mmlu`` of one task per subject, weighted by size). Other tasks are lm-eval's own or the
YAMLs of ``include_path``; their data must be reachable (lm-eval downloads from the hub where a task asks).

``write_tasks(dest)`` writes the same YAMLs with the data paths filled in, for running ``lm_eval`` directly
(``lm_eval --include_path DEST --tasks fedpeft_boolq --model hf --model_args pretrained=…,peft=…``): the parity
check of ``benchmarks/standard_eval.py``. Adapters that put rows before the tokens (soft and deep prompts) are not
weights and are refused; the native suites (``mmlu``) score them.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from fedpeft.data.paths import DataNotFoundError, shared_data_dir
from fedpeft.suites.base import SUITES, SuiteResult
from fedpeft.suites.mmlu_data import read_categories, read_subject, subject_file

TASKS = Path(__file__).parent / "lmeval_tasks"
LOCAL = {"boolq": "fedpeft_boolq", "mmlu": "fedpeft_mmlu"}  # fedpeft's name -> its task (or group) in lm-eval


class LMEvalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit_field: ClassVar[str] = "limit"

    task: str = Field("boolq", description="the task: boolq or mmlu (fedpeft's local YAMLs), or any task lm-eval "
                                           "or include_path defines")
    num_fewshot: int | None = Field(None, ge=0, description="solved examples before each question (None: the "
                                                            "task's default)")
    limit: int | None = Field(None, ge=1, description="the first this many documents of each task (lm-eval's "
                                                      "--limit; None: all)")
    data_dir: str | None = Field(None, description="the folder with BoolQ/ and MMLU/ (default: shared/data)")
    include_path: str | None = Field(None, description="a folder of further lm-eval task YAMLs")


def write_tasks(dest: Path, data_dir: str | Path | None = None) -> Path:
    """fedpeft's lm-eval task YAMLs in ``dest`` with the data paths filled in: ``fedpeft_boolq``, one
    ``fedpeft_mmlu_<subject>`` per MMLU subject and the groups ``fedpeft_mmlu_<category>`` and ``fedpeft_mmlu``."""
    root = Path(data_dir) if data_dir is not None else shared_data_dir()
    if root is None:
        raise DataNotFoundError("lmeval: the tasks read shared/data (BoolQ/, MMLU/); set FEDPEFT_DATA_DIR or "
                                "data_dir")
    root = root.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    for path in TASKS.glob("*.yaml"):
        (dest / path.name).write_text(path.read_text(encoding="utf-8").replace("@DATA@", str(root)),
                                      encoding="utf-8")
    cats = read_categories(root / "MMLU")
    groups = []
    for cat, subjects in cats.items():
        names = []
        for s in subjects:
            name = f"fedpeft_mmlu_{s}"
            names.append(name)
            files = {split: str(_as_jsonl(root / "MMLU", s, split, dest / "data")) for split in ("test", "dev")}
            task = {"include": "_fedpeft_mmlu_template.yaml", "task": name, "task_alias": s,
                    "description": f"The following are multiple choice questions (with answers) about "
                                   f"{s.replace('_', ' ')}.\n\n",
                    "dataset_kwargs": {"data_files": files}}
            (dest / f"{name}.yaml").write_text(json.dumps(task, indent=1) + "\n", encoding="utf-8")  # JSON is YAML
        group = f"fedpeft_mmlu_{cat}"
        groups.append(group)
        (dest / f"{group}.yaml").write_text(json.dumps({
            "group": group, "task": names,
            "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}]}, indent=1) + "\n")
    (dest / "fedpeft_mmlu.yaml").write_text(json.dumps({
        "group": "fedpeft_mmlu", "task": groups,
        "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}]}, indent=1) + "\n")
    return dest


def _as_jsonl(folder: Path, subject: str, split: str, dest: Path) -> Path:
    """One MMLU CSV as JSON lines (``question, A, B, C, D, answer``): its text exactly (a CSV loader would read
    numeric options as numbers and rewrite them)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"{subject}_{split}.jsonl"
    rows = read_subject(subject_file(folder, subject, split), subject)
    out.write_text("".join(json.dumps({"question": r.question, "A": r.options[0], "B": r.options[1],
                                       "C": r.options[2], "D": r.options[3], "answer": r.gold}) + "\n"
                           for r in rows), encoding="utf-8")
    return out


def scores_of(results: dict[str, Any], task: str) -> dict[str, float]:
    """The numeric scores lm-eval reports for ``task`` (and the groups and subtasks under it), in percent:
    ``<task>/<metric>`` (``acc``, its ``acc_stderr``), the task's own first."""
    out: dict[str, float] = {}
    sections = [results.get("groups", {}), results.get("results", {})]
    names = [task] + sorted(n for sec in sections for n in sec if n != task)
    for name in names:
        for sec in sections:
            for key, value in sec.get(name, {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and "," in key:
                    metric = key.split(",")[0]
                    label = metric if name == task else f"{name}/{metric}"
                    out.setdefault(label, 100 * float(value) if math.isfinite(float(value)) else math.nan)
    return out


@SUITES.register("lmeval", "lm-evaluation-harness on a task (lmeval:boolq, lmeval:mmlu: local YAMLs over "
                 "shared/data; or any lm-eval task)", LMEvalSettings)
class LMEval:
    def __init__(self, settings: LMEvalSettings) -> None:
        self.settings = settings

    def run(self, objective: Any, params: dict[str, Any], batch_size: int = 16,
            progress: bool = False) -> SuiteResult:
        try:
            import lm_eval
            from lm_eval.models.huggingface import HFLM
            from lm_eval.tasks import TaskManager
        except ImportError:
            raise ImportError("the lmeval suite needs lm-eval: pip install 'fedpeft[eval]'") from None
        from fedpeft.model.decoding import weights_in_place

        s = self.settings
        task = LOCAL.get(s.task, s.task)
        with tempfile.TemporaryDirectory(prefix="fedpeft-lmeval-") as tmp:
            include = [str(write_tasks(Path(tmp), s.data_dir))] + ([s.include_path] if s.include_path else [])
            manager = TaskManager(include_path=include)
            with weights_in_place(objective, params) as model:
                tok = objective.backbone.tokenizer
                prefix = None if tok.bos_token_id is not None or tok.eos_token_id is not None else objective.end_id
                lm = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size, device=str(objective.device),
                          prefix_token_id=prefix)  # a tokenizer with neither BOS nor EOS: fedpeft's end token
                out = lm_eval.simple_evaluate(model=lm, tasks=[task], num_fewshot=s.num_fewshot, limit=s.limit,
                                              task_manager=manager, log_samples=True, bootstrap_iters=1000,
                                              random_seed=0, numpy_random_seed=1234, torch_random_seed=1234,
                                              fewshot_random_seed=1234)
        records = []
        for name, samples in sorted(out.get("samples", {}).items()):
            for sm in samples:
                records.append({"task": name, "doc_id": sm["doc_id"], "target": sm.get("target"),
                                "loglikelihoods": [r[0] for r in sm.get("filtered_resps", [])
                                                   if isinstance(r, (list, tuple))] or sm.get("filtered_resps"),
                                **{k: sm[k] for k in ("acc", "exact_match") if k in sm}})
        protocol = {"source": f"lm-evaluation-harness {lm_eval.__version__}, task {task}",
                    "items": len(records), "num_fewshot": s.num_fewshot, "limit": s.limit,
                    "n_shot": out.get("n-shot", {}), "versions": out.get("versions", {}), "scores_in": "percent"}
        return SuiteResult(f"lmeval:{s.task}", scores_of(out, task), records, protocol)


if __name__ == "__main__":  # python -m fedpeft.suites.lmeval DEST [DATA_DIR]: the YAMLs, for the lm_eval command
    import sys

    print(write_tasks(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))
