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


def test_archive_leaves_out_unfinished_runs_above_the_size_limit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = Path("runs/bench")
    small, big = runs / "small__s0", runs / "big__s0"
    for d, size in ((small, 10), (big, 1000)):
        (d / "checkpoint").mkdir(parents=True)
        (d / "checkpoint" / "server.safetensors").write_bytes(b"x" * size)
    assert archive_runs.archive(runs, Path("out.tgz"), max_unfinished_bytes=100) == (0, 2)
    with tarfile.open("out.tgz") as tar:
        assert tar.getnames() == ["runs/bench/small__s0/checkpoint/server.safetensors"]


def test_the_same_runs_give_the_same_archive_bytes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (Path("runs/bench/a__s0")).mkdir(parents=True)
    Path("runs/bench/a__s0/summary.json").write_text("{}")
    archive_runs.archive(Path("runs/bench"), Path("one.tgz"))
    archive_runs.archive(Path("runs/bench"), Path("two.tgz"))
    assert Path("one.tgz").read_bytes() == Path("two.tgz").read_bytes()
    assert Path("one.tgz").read_bytes()[4:8] == bytes(4)  # gzip's time field, zero (two calls may share a second)
    assert not list(Path(".").glob("*.tmp"))


def test_a_folder_of_runs_is_packed_one_level_down(tmp_path, monkeypatch):
    """A comparison's seed folder (fedpeft's run, the other codebase's output, the scores) is no run itself: its
    finished run keeps its records, the other output is an unfinished folder under the size limit, the scores stay."""
    monkeypatch.chdir(tmp_path)
    seed = Path("runs/cmp/s0")
    (seed / "fedpeft" / "checkpoint").mkdir(parents=True)
    (seed / "other" / "checkpoint-3").mkdir(parents=True)
    for f in ("config.yaml", "metrics.jsonl", "summary.json", "checkpoint/server.safetensors"):
        (seed / "fedpeft" / f).write_text(f)
    (seed / "other" / "checkpoint-3" / "adapter.safetensors").write_bytes(b"x" * 1000)
    (seed / "scores.json").write_text("{}")

    assert archive_runs.archive(Path("runs/cmp"), Path("out.tgz"), max_unfinished_bytes=100) == (1, 1)
    with tarfile.open("out.tgz") as tar:
        assert set(tar.getnames()) == {"runs/cmp/s0/scores.json", "runs/cmp/s0/fedpeft/config.yaml",
                                       "runs/cmp/s0/fedpeft/metrics.jsonl", "runs/cmp/s0/fedpeft/summary.json"}


def test_excluded_entries_stay_out(tmp_path, monkeypatch):
    """A benchmark's copy of shared data beside its runs is never packed."""
    monkeypatch.chdir(tmp_path)
    (Path("runs/cmp/data")).mkdir(parents=True)
    Path("runs/cmp/data/train.jsonl").write_text("{}")
    (Path("runs/cmp/a__s0")).mkdir()
    Path("runs/cmp/a__s0/summary.json").write_text("{}")
    assert archive_runs.archive(Path("runs/cmp"), Path("out.tgz"), exclude=frozenset({"data"})) == (1, 0)
    with tarfile.open("out.tgz") as tar:
        assert tar.getnames() == ["runs/cmp/a__s0/summary.json"]
