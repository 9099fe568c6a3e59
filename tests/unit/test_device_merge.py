"""Runs sent back from the GPU machine join the local ones without overwriting a finished run or one resuming here."""

import tarfile
from pathlib import Path

import pytest

from benchmarks import archive_runs
from benchmarks.device.merge import merge
from benchmarks.device.pack import parts


def _run(root: Path, name: str, finished: bool, tag: str) -> None:
    d = root / "runs" / "bench" / name
    (d / "checkpoint").mkdir(parents=True)
    (d / "config.yaml").write_text(tag)
    (d / "checkpoint" / "server.safetensors").write_text(tag)
    if finished:
        (d / "summary.json").write_text(tag)


def test_merge_takes_finished_runs_and_keeps_local_finished_and_resuming_ones(tmp_path, monkeypatch):
    there, here = tmp_path / "there", tmp_path / "here"
    for name, finished in (("a", True), ("b", True), ("c", False), ("d", False), ("e", True)):
        _run(there, name, finished, "gpu")
    (there / "runs" / "bench" / "baselines.json").write_text("gpu")
    _run(here, "a", False, "cpu")  # unfinished here, finished there: replaced
    _run(here, "b", True, "cpu")  # finished here: kept
    _run(here, "c", False, "cpu")  # unfinished on both: the local one resumes
    monkeypatch.chdir(there)
    archive_runs.archive(Path("runs/bench"), tmp_path / "back.tgz")

    result = merge(tmp_path / "back.tgz", here)

    bench = here / "runs" / "bench"
    assert result == {"taken": ["runs/bench/a", "runs/bench/baselines.json", "runs/bench/d", "runs/bench/e"],
                      "skipped": ["runs/bench/b", "runs/bench/c"]}
    assert (bench / "a" / "summary.json").read_text() == "gpu" and not (bench / "a" / "checkpoint").exists()
    assert (bench / "b" / "summary.json").read_text() == "cpu"
    assert (bench / "c" / "config.yaml").read_text() == "cpu"
    assert (bench / "d" / "checkpoint" / "server.safetensors").read_text() == "gpu"


def test_merge_refuses_members_outside_runs(tmp_path):
    (tmp_path / "x").write_text("x")
    with tarfile.open(tmp_path / "bad.tgz", "w:gz") as tar:
        tar.add(tmp_path / "x", arcname="etc/x")
    with pytest.raises(ValueError, match="not under runs/<benchmark>/"):
        merge(tmp_path / "bad.tgz", tmp_path)


def test_parts_fit_the_capacity_and_refuse_a_file_above_it():
    sizes = {"gguf.00": 30, "gguf.01": 30, "site": 48, "data": 15, "wheel": 13}
    groups = parts(sizes, 61)
    assert sorted(n for g in groups for n in g) == sorted(sizes)
    assert all(sum(sizes[n] for n in g) <= 61 for g in groups) and len(groups) == 3
    with pytest.raises(ValueError, match="above one call's capacity"):
        parts({"big": 62}, 61)


def test_merge_leaves_a_run_that_a_local_process_is_writing(tmp_path, monkeypatch):
    from fedpeft.tracking.rundir import RunDir

    there, here = tmp_path / "there", tmp_path / "here"
    _run(there, "a", True, "gpu")
    _run(here, "a", False, "cpu")
    monkeypatch.chdir(there)
    archive_runs.archive(Path("runs/bench"), tmp_path / "back.tgz")
    writer = RunDir(here / "runs" / "bench" / "a")
    writer.lock()  # a grid here is resuming it
    try:
        assert merge(tmp_path / "back.tgz", here) == {"taken": [], "skipped": ["runs/bench/a"]}
    finally:
        writer.unlock()
    assert merge(tmp_path / "back.tgz", here)["taken"] == ["runs/bench/a"]
