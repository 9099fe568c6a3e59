"""Model-written code is contained (``fedpeft.suites.sandbox``): an infinite loop, a large allocation, a child
process, a write outside the temporary directory and a network socket all end as failures, and nothing they
attempted is left behind; a correct HumanEval program passes and a wrong one fails."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from fedpeft.suites.sandbox import run_program

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox is POSIX")


def test_an_infinite_loop_is_stopped_and_scored_as_a_failure():
    t0 = time.monotonic()
    out = run_program("while True:\n    pass\n", timeout=2, cpu_s=1)
    assert not out.passed and out.status in ("timed out", "failed") and time.monotonic() - t0 < 10


def test_a_large_allocation_fails_under_the_memory_limit():
    out = run_program("x = bytearray(2 * 1024 ** 3)\n", memory_mb=256)
    assert not out.passed and "MemoryError" in out.stderr


def test_a_child_process_is_refused_and_none_is_left_running(tmp_path):
    marker = "fedpeft_sandbox_sleep_marker"
    src = (f"import subprocess\nsubprocess.Popen(['sleep', '30', '{marker}'])\n"
           "import os\nos.fork()\n")
    out = run_program(src)
    assert not out.passed and "subprocess.Popen is not allowed" in out.stderr
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert marker not in ps


def test_a_write_outside_the_working_directory_is_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    for src in (f"open({str(target)!r}, 'w').write('x')\n",
                f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)\n",
                f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')\n",
                f"import os\nos.remove({str(tmp_path)!r})\n"):
        out = run_program(src)
        assert not out.passed and "sandbox:" in out.stderr, src
    assert not target.exists() and tmp_path.exists()
    inside = run_program("open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'\n")
    assert inside.passed, inside.stderr


def test_a_large_file_fails_under_the_file_size_limit():
    out = run_program("open('big.bin', 'wb').write(b'x' * (16 * 1024 * 1024))\n", file_mb=1)
    assert not out.passed


def test_the_network_is_refused():
    out = run_program("import socket\nsocket.create_connection(('127.0.0.1', 9))\n")
    assert not out.passed and "socket.connect is not allowed" in out.stderr


def test_a_humaneval_program_passes_when_right_and_fails_when_wrong(tmp_path):
    import json

    from fedpeft.suites.humaneval import program_of, read_problems

    problem = {"task_id": "t/0", "prompt": "def add(a, b):\n    \"\"\"Sum.\"\"\"\n",
               "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"}
    assert run_program(program_of(problem, "    return a + b\n")).passed
    assert not run_program(program_of(problem, "    return a - b\n")).passed
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(problem) + "\n" + json.dumps({"task_id": "t/1", "prompt": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"p.jsonl:2: a HumanEval problem lacks \['test', 'entry_point'\]"):
        read_problems(str(path))
