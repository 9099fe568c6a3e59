"""The Flower tutorial's one-machine deployment, run as it is written in ``docs/tutorials/flower-deployment.md``.

The block after the ``tested as written`` marker is run by bash in an empty folder, with this environment's ``bin``
first on PATH (where ``fedpeft`` and ``flwr`` are): a SuperLink under TLS with node authentication, two registered
SuperNodes, the app written by ``fedpeft flower app``, built by ``flwr build`` and submitted by ``flwr run``. The
deployment's records must equal the embedded run's that the block makes beside it, bytes included.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fedpeft.runtime.flower.local import BIN, flower_env  # noqa: E402
from fedpeft.tracking.rundir import RunDir  # noqa: E402
from fedpeft.tracking.summary import TIMING_FIELDS  # noqa: E402

TUTORIAL = Path(__file__).parents[2] / "docs" / "tutorials" / "flower-deployment.md"
MARKER = "<!-- tested as written: tests/integration/test_flower_tutorial.py runs this block -->"
FLOWER_ONLY = ("flower_record_bytes", "model_loads")


def tutorial_block() -> str:
    text = TUTORIAL.read_text()
    assert text.count(MARKER) == 1, f"{TUTORIAL} must hold the marker once"
    start = text.index("```bash\n", text.index(MARKER)) + len("```bash\n")
    return text[start:text.index("\n```\n", start)] + "\n"


@pytest.mark.slow
def test_the_one_machine_deployment_runs_as_written(tmp_path):
    (tmp_path / "block.sh").write_text(tutorial_block())
    env = flower_env() | {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(["bash", "-e", "block.sh"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=900)
    finally:  # whatever the block left running (it ends with `kill $(jobs -p)`)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, out[-4000:]

    def comparable(run: str) -> list[dict]:
        records = RunDir(tmp_path / "runs" / run).read_metrics()
        return [{k: v for k, v in r.items() if k not in TIMING_FIELDS + FLOWER_ONLY} for r in records]

    flower = comparable("flower")
    assert [r["round"] for r in flower] == [0, 1, 2] and all(r["num_ok"] == 2 for r in flower[1:])
    assert flower == comparable("embedded")
    assert list(tmp_path.glob("fedpeft.fedpeft-flower.*.fab")), "flwr build wrote no FAB"
