"""The run archive keeps what the result tables read from finished runs and whole unfinished runs (to resume)."""

import tarfile
from pathlib import Path

from benchmarks import archive_runs


def test_archive_keeps_records_of_finished_runs_and_whole_unfinished_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = Path("runs/bench")
    done, open_ = runs / "a__s0", runs / "b__s0"
    for d in (done / "checkpoint", open_ / "checkpoint" / "round-3"):
        d.mkdir(parents=True)
    for f in ("config.yaml", "metrics.jsonl", "summary.json", "posthoc.json", ".lock", "report.html"):
        (done / f).write_text(f)
    (done / "checkpoint" / "server.safetensors").write_text("x")
    for f in ("config.yaml", "metrics.jsonl", ".lock", "checkpoint/round-3/server.safetensors"):
        (open_ / f).write_text(f)
    (runs / "baselines.json").write_text("{}")

    assert archive_runs.archive(runs, Path("out.tgz")) == (1, 1)
    with tarfile.open("out.tgz") as tar:
        names = set(tar.getnames())
    assert names == {
        "runs/bench/baselines.json",
        "runs/bench/a__s0/config.yaml",
        "runs/bench/a__s0/metrics.jsonl",
        "runs/bench/a__s0/summary.json",
        "runs/bench/a__s0/posthoc.json",
        "runs/bench/b__s0/config.yaml",
        "runs/bench/b__s0/metrics.jsonl",
        "runs/bench/b__s0/checkpoint/round-3/server.safetensors",
    }
