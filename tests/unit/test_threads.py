"""A run's torch thread count (``runtime/threads.py``): resolved once when ``runtime.threads`` is unset, recorded in
summary.json, run.log and the checkpoints, kept on resume, shared among client workers, and set by a client
process from the count the server sends. (That the embedded and flower-sim runtimes then give the same numbers at
the default is ``tests/integration/test_flower.py``'s.)"""

from __future__ import annotations

import json

import pytest
import torch

from fedpeft.runtime import threads as run_threads
from fedpeft.runtime.embedded import StopAfterRound, run_embedded
from fedpeft.runtime.threads import default_threads, usable_cores
from fedpeft.tracking.rundir import RunDir


@pytest.fixture
def torch_threads():
    """Sets this process's torch threads for a test (what an unset runtime.threads starts from); restored after."""
    old = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(old)


def _log_lines(root, word="torch threads"):
    return [line for line in (root / "run.log").read_text().splitlines() if word in line]


def test_the_resolved_count_is_recorded_in_the_run(tiny_cfg, tmp_path, torch_threads):
    torch_threads(3)
    expected = min(3, usable_cores())  # torch's count, at most the usable cores
    cfg = tiny_cfg()
    assert cfg.runtime.threads is None  # the default: resolved when the run starts
    summary = run_embedded(cfg, tmp_path / "run")
    assert summary["threads"] == expected
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["threads"] == expected
    meta = RunDir(tmp_path / "run").checkpoint_meta()
    assert (meta["round"], meta["threads"]) == (2, expected) and len(meta["run_id"]) == 16
    [line] = _log_lines(tmp_path / "run")
    assert f"torch threads: {expected} (runtime.threads unset: resolved at the start of the run)" in line
    assert torch.get_num_threads() == 3  # the process's own count is back after the run


def test_a_set_count_is_used_and_recorded(tiny_cfg, tmp_path, torch_threads):
    torch_threads(2)
    summary = run_embedded(tiny_cfg(runtime__threads=1), tmp_path / "run")
    assert summary["threads"] == 1 and "torch threads: 1 (runtime.threads)" in _log_lines(tmp_path / "run")[0]


@pytest.mark.skipif(usable_cores() < 2, reason="with one usable core every count resolves to 1")
def test_a_resumed_run_keeps_the_count_it_started_with(tiny_cfg, tmp_path, torch_threads):
    cfg = tiny_cfg()
    torch_threads(1)
    with pytest.raises(StopAfterRound):
        run_embedded(cfg, tmp_path / "run", stop_after_round=1)
    torch_threads(2)  # this process would resolve 2 now
    summary = run_embedded(cfg, tmp_path / "run", resume=True)
    assert summary["threads"] == 1
    assert "torch threads: 1 (recorded when the run started)" in _log_lines(tmp_path / "run")[-1]


def test_client_workers_share_the_cores_by_default(tiny_cfg, tmp_path, torch_threads, monkeypatch):
    monkeypatch.setattr(run_threads, "usable_cores", lambda: 8)
    for torch_count, workers, expected in [(8, 1, 8), (8, 3, 2), (8, 16, 1), (4, 1, 4), (16, 2, 4)]:
        torch_threads(torch_count)
        assert default_threads(workers) == expected
    monkeypatch.undo()
    torch_threads(2)
    summary = run_embedded(tiny_cfg(runtime__client_workers=2), tmp_path / "run")
    assert summary["threads"] == max(1, min(2, usable_cores()) // 2)  # each worker's, and the server's


def test_a_client_process_computes_with_the_count_the_server_sends(torch_threads):
    pytest.importorskip("flwr")
    from fedpeft.runtime.flower.node_service import _use_threads, process_info

    torch_threads(2)
    _use_threads({"threads": 1})
    assert torch.get_num_threads() == 1 and process_info()["threads"] == 1
    _use_threads({})  # a server that sends no count: the process keeps its own
    assert torch.get_num_threads() == 1
