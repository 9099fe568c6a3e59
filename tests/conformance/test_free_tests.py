"""What a new component gets for free: the conformance suite run with a new aggregator and a new adapter registered
(``dummy_plugin.py``) runs and passes this many tests for them, none written by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_new_aggregator_and_adapter_get_the_shared_tests():
    ran = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "tests.conformance.dummy_plugin",
                          "-p", "no:cacheprovider", "--ignore", str(Path(__file__)), "-k", "dummy",
                          "tests/conformance"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    passed = [line for line in ran.stdout.splitlines() if "::" in line and line.rstrip().endswith("]")
              and " PASSED " in line]
    aggregator = [p for p in passed if "dummy-mean" in p]
    adapter = [p for p in passed if "dummy-prompt" in p]
    # registry row + 4 shared aggregator tests; registry row + one round on BERT, LLaMA and generating
    assert ran.returncode == 0 and len(aggregator) == 5 and len(adapter) == 4, ran.stdout[-3000:] + ran.stderr[-2000:]
