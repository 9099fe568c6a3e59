"""Runs read back from their directories, grouped by config (seeds aggregated), and per-round series.

Long because every chart and table of the report reads its numbers here, so that they agree with each other.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpeft.tracking.summary import final_generation as generation_of

import yaml

from fedpeft.metrics import per_class as per_class_of
from fedpeft.tracking.rundir import RunDir
from fedpeft.suites.base import kept_result

Record = dict[str, Any]


@dataclass
class Run:
    path: Path
    config_text: str
    config: dict[str, Any]
    summary: dict[str, Any] | None
    records: list[Record]
    model: dict[str, Any] | None = None  # model.json: the task's classes and the clients' names, also while unfinished

    @property
    def seed(self) -> Any:
        return self.config.get("seed", (self.summary or {}).get("seed"))

    @property
    def class_names(self) -> list[str] | None:
        return (self.summary or {}).get("class_names") or ((self.model or {}).get("task") or {}).get("class_names")

    @property
    def client_names(self) -> dict[str, str] | None:
        """Natural clients' names by id (``summary.json``, else ``model.json``)."""
        names = (self.summary or {}).get("client_names")
        listed = ((self.model or {}).get("clients") or {}).get("names")
        return names if isinstance(names, dict) else dict(enumerate(listed)) if isinstance(listed, list) else None


@dataclass
class Group:
    label: str  # full: the run's name, or the common name with n and seeds
    runs: list[Run] = field(default_factory=list)
    short: str = ""  # for legends: what tells the groups apart


def expand_run_dirs(paths: list[Path]) -> list[Path]:
    """Run directories as given; a folder without ``metrics.jsonl`` stands for the runs directly inside it."""
    out = []
    for p in map(Path, paths):
        if (p / "metrics.jsonl").exists():
            out.append(p)
        else:
            inner = sorted(q for q in p.iterdir() if (q / "metrics.jsonl").exists()) if p.is_dir() else []
            if not inner:
                raise FileNotFoundError(f"{p}: not a run directory (no metrics.jsonl) and holds none")
            out.extend(inner)
    return out


def load_run(path: Path) -> Run:
    path = Path(path)
    cfg_path, summary_path = path / "config.yaml", path / "summary.json"
    text = cfg_path.read_text() if cfg_path.exists() else ""
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    run = RunDir(path)
    return Run(path, text, yaml.safe_load(text) or {}, summary, run.read_metrics(), run.read_record())


def _group_key(run: Run) -> str:
    return json.dumps({k: v for k, v in run.config.items() if k not in ("seed", "name")}, sort_keys=True, default=str)


def _stem(name: str) -> str:
    return re.sub(r"([-_.]{1,2}(s|seed)?\d+)$", "", name)


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs whose config.yaml agree except ``seed`` and ``name`` form one group, in first-seen order."""
    groups: dict[str, Group] = {}
    for run in runs:
        groups.setdefault(_group_key(run), Group("")).runs.append(run)
    seen: dict[str, int] = {}
    for g in groups.values():
        if len(g.runs) == 1:
            g.label = g.runs[0].path.name
        else:
            g.label = f"{_stem(g.runs[0].path.name)} (n={len(g.runs)}, seeds {','.join(str(r.seed) for r in g.runs)})"
        seen[g.label] = seen.get(g.label, 0) + 1
        if seen[g.label] > 1:
            g.label += f" #{seen[g.label]}"
    out = list(groups.values())
    stems = [g.runs[0].path.name if len(g.runs) == 1 else _stem(g.runs[0].path.name) for g in out]
    for g, s in zip(out, _distinct(stems) if len(set(stems)) == len(stems) else [g.label for g in out]):
        g.short = s if len(g.runs) == 1 else f"{s} (n={len(g.runs)})"
    return out


def _distinct(names: list[str]) -> list[str]:
    """Names without the prefix and suffix they all share (cut at a separator)."""
    if len(names) < 2:
        return names
    pre = os.path.commonprefix(names)
    suf = os.path.commonprefix([n[::-1] for n in names])[::-1]
    cut_pre = max(pre.rfind(c) for c in "-_./ ") + 1
    cut_suf = min((i for i in (suf.find(c) for c in "-_./ ") if i >= 0), default=len(suf))
    suf = suf[cut_suf:]
    out = [n[cut_pre:len(n) - len(suf)].strip("-_./ ") for n in names]
    return out if all(out) and len(set(out)) == len(out) else names


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def per_round(run: Run, get: Callable[[Record], Any]) -> dict[int, float]:
    out = {}
    for r in run.records:
        v = _num(get(r))
        if v is not None:
            out[int(r["round"])] = v
    return out


def cumulative(run: Run, key: str) -> dict[int, float]:
    total, out = 0.0, {}
    for r in run.records:
        total += r.get(key) or 0
        out[int(r["round"])] = total
    return out


@dataclass
class Agg:
    xs: list[float]
    mean: list[float]
    lo: list[float] | None  # mean ± std where the group has several runs
    hi: list[float] | None


def aggregate(per_run: list[dict[int, float]]) -> Agg:
    rounds = sorted({k for d in per_run for k in d})
    xs, mean, lo, hi = [], [], [], []
    for k in rounds:
        vals = [d[k] for d in per_run if k in d]
        m = statistics.fmean(vals)
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        xs.append(float(k))
        mean.append(m)
        lo.append(m - sd)
        hi.append(m + sd)
    many = len(per_run) > 1
    return Agg(xs, mean, lo if many else None, hi if many else None)


def server_keys(runs: list[Run]) -> list[str]:
    keys = {k for run in runs for r in run.records for k, v in (r.get("server") or {}).items() if _num(v) is not None}
    return sorted(keys)


def vector_keys(runs: list[Run]) -> list[str]:
    """Keys of the records' ``server_vectors`` (per-round vectors: head importance, selected layers, ...)."""
    return sorted({k for run in runs for r in run.records for k in (r.get("server_vectors") or {})})


def vector_rows(runs: list[Run], key: str) -> dict[int, list[float | None]]:
    """Per round, the element-wise mean of the runs' vector ``key`` (runs whose length differs are skipped)."""
    by_round: dict[int, list[list[float | None]]] = {}
    for run in runs:
        for r in run.records:
            vec = (r.get("server_vectors") or {}).get(key)
            if isinstance(vec, list) and vec:
                by_round.setdefault(int(r["round"]), []).append([_num(v) for v in vec])
    out = {}
    for rnd, vecs in sorted(by_round.items()):
        vecs = [v for v in vecs if len(v) == len(vecs[0])]
        cols = [[x for x in col if x is not None] for col in zip(*vecs)]
        out[rnd] = [statistics.fmean(c) if c else None for c in cols]
    return out


def last_local(run: Run) -> dict[str, float]:
    """Per-client local accuracy of the last round that has one."""
    for r in reversed(run.records):
        local = {k: float(v) for k, v in (r.get("local_accuracy") or {}).items() if _num(v) is not None}
        if local:
            return local
    return {}


def varies(values) -> bool:
    """Whether some finite value differs from the others (a chart of constant data shows nothing)."""
    return len({v for v in map(_num, values) if v is not None}) > 1


def training_rounds(run: Run) -> int:
    """Training rounds: the summary's ``rounds``, else the records past round 0 (the initial evaluation)."""
    n = (run.summary or {}).get("rounds")
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    return sum(1 for r in run.records if (_num(r.get("round")) or 0) > 0)


def is_generation(run: Run) -> bool:
    """A generation run (its records carry perplexity per response token)."""
    return any(_num(r.get("perplexity")) is not None for r in run.records)


def final_generation(run: Run) -> dict[str, Any] | None:
    """The scores of what the final round's global model wrote (``tracking.summary.final_generation``)."""
    return generation_of(run.records)


def final_accuracy(run: Run) -> float | None:
    if run.summary and _num(run.summary.get("final_accuracy")) is not None:
        return run.summary["final_accuracy"]
    accs = [r["accuracy"] for r in run.records if _num(r.get("accuracy")) is not None]
    return accs[-1] if accs else None


def best_accuracy(run: Run) -> float | None:
    """The summary's ``best_accuracy``, else the best of the training rounds (round 0, the initial model, aside)."""
    if run.summary and _num(run.summary.get("best_accuracy")) is not None:
        return run.summary["best_accuracy"]
    accs = [r["accuracy"] for r in run.records if _num(r.get("accuracy")) is not None and r.get("round", 0) > 0]
    return max(accs) if accs else None


def final_macro_f1(run: Run) -> float | None:
    """The summary's ``macro_f1`` (global model, last evaluated round), else the last record's."""
    if run.summary and _num(run.summary.get("macro_f1")) is not None:
        return float(run.summary["macro_f1"])
    return next((v for v in (_num(r.get("macro_f1")) for r in reversed(run.records)) if v is not None), None)


def client_names(runs: list[Run]) -> dict[str, str]:
    """Client id -> name from the summaries' ``client_names`` (natural clients); ids the runs name differently
    are left out."""
    seen: dict[str, set[str]] = {}
    for run in runs:
        names = run.client_names
        if isinstance(names, dict):
            for k, v in names.items():
                seen.setdefault(str(k), set()).add(str(v))
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}


@dataclass
class ClassReport:
    """The global model per class at one evaluated round (``summary.json``, else the last record with a
    ``confusion``): ``per_class`` maps class name -> precision, recall, f1, support."""
    round: int | None
    names: list[str]
    per_class: dict[str, dict[str, float]]
    macro_f1: float | None
    confusion: list[list[int]] | None  # rows true class, columns predicted; None when absent or malformed

    def occurring(self) -> list[dict[str, Any]]:
        """The per-class entries of the classes that occur as a label or a prediction (without a confusion
        matrix: as a label), which scikit-learn's macro average runs over."""
        entries = list(self.per_class.values())
        m = self.confusion
        if m is not None and len(m) == len(entries):
            return [e for i, e in enumerate(entries) if sum(m[i]) or sum(row[i] for row in m)]
        return [e for e in entries if (_num(e.get("support")) or 0) > 0]

    def macro(self, key: str) -> float | None:
        """Unweighted mean of ``key`` over the occurring classes; for ``f1`` the recorded ``macro_f1`` first."""
        if key == "f1" and self.macro_f1 is not None:
            return self.macro_f1
        vals = [_num(e.get(key)) for e in self.occurring()]
        return statistics.fmean(vals) if vals and None not in vals else None


def _square(m: Any) -> list[list[int]] | None:
    if not (isinstance(m, list) and m and all(isinstance(row, list) and len(row) == len(m) for row in m)):
        return None
    vals = [[_num(v) for v in row] for row in m]
    return None if any(v is None for row in vals for v in row) else [[int(v) for v in row] for row in vals]


def class_report(run: Run) -> ClassReport | None:
    s = run.summary or {}
    per_class = s.get("per_class") if isinstance(s.get("per_class"), dict) and s.get("per_class") else None
    confusion, rnd = _square(s.get("confusion")), s.get("confusion_round")
    recs = [r for r in run.records if _square(r.get("confusion")) is not None]
    if confusion is None and recs:  # the record of the summary's round, else the last
        rec = next((r for r in recs if r.get("round") == rnd), recs[-1]) if per_class else recs[-1]
        confusion, rnd = _square(rec["confusion"]), rec.get("round")
    if per_class is None and confusion is None:
        return None
    n = len(confusion) if confusion is not None else len(per_class)
    given = run.class_names
    if isinstance(given, list) and len(given) == n:
        names = [str(c) for c in given]
    elif per_class is not None and len(per_class) == n:
        names = [str(c) for c in per_class]
    else:
        names = [str(i) for i in range(n)]
    if per_class is None:
        per_class = per_class_of(confusion, names)
    return ClassReport(rnd if isinstance(rnd, int) and not isinstance(rnd, bool) else None, names,
                       {str(k): (v if isinstance(v, dict) else {}) for k, v in per_class.items()},
                       _num(s.get("macro_f1")) if "per_class" in s else None, confusion)


def bytes_to_target(run: Run, target: float) -> float | None:
    """Cumulative training bytes up until the first round whose global accuracy reaches ``target``."""
    up = cumulative(run, "bytes_up")
    for r in run.records:
        if (_num(r.get("accuracy")) or -1.0) >= target:
            return up[int(r["round"])]
    return None


def wall_seconds(run: Run) -> float:
    if run.summary and _num(run.summary.get("wall_seconds")) is not None:
        return run.summary["wall_seconds"]
    return sum(r.get("wall_seconds") or 0 for r in run.records)


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        return {k: v for key, val in d.items() for k, v in flatten(val, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): d}


FLOWERTUNE_BUDGET_MB = 200_000  # FlowerTune LLM leaderboard: the communication budget of a run


def leaderboard_row(summary: dict[str, Any] | None, run_dir: Path | None = None) -> dict[str, Any] | None:
    """A run's row in FlowerTune's general-NLP board, or None where the run was not scored by
    ``flowertune-general-nlp`` (``evaluation.suites``, or ``fedpeft evaluate RUN_DIR --suite``, which keeps the global
    adapter's scores in ``suites/``): the three categories and their average (percent), the communication in MiB by
    FlowerTune's rule (every array the run sent, both directions: ``bytes_up_total + bytes_down_total`` / 2^20) and
    whether that is within the board's 200,000 MB budget."""
    scores = ((summary or {}).get("suites") or {}).get("flowertune-general-nlp")
    kept = None if run_dir is None else kept_result(run_dir, "flowertune-general-nlp")
    if not scores and kept is not None and kept.is_file():
        saved = json.loads(kept.read_text(encoding="utf-8"))
        scores = saved["scores"] | {"items": saved.get("protocol", {}).get("items")}
    if not scores or "average" not in scores or summary is None:  # not scored, or its scoring failed
        return None
    mib = (summary["bytes_up_total"] + summary["bytes_down_total"]) / 2 ** 20
    return {"stem": scores.get("stem"), "social_sciences": scores.get("social_sciences"),
            "humanities": scores.get("humanities"), "average": scores.get("average"), "items": scores.get("items"),
            "communication_mib": mib, "within_budget": mib <= FLOWERTUNE_BUDGET_MB}
