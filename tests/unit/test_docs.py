"""The documentation site: its reference pages are generated from the code and current, every config key and
component setting is described, ``mkdocs build --strict`` passes (no broken link, no warning), and two pages render
in headless Chromium without console errors."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fedpeft.catalogue import undocumented
from fedpeft.cli import reference
from tests.browser import browse, chromium, console

ROOT = Path(__file__).resolve().parents[2]


def test_generated_reference_pages_are_current():
    assert reference.main([str(ROOT / "docs" / "reference"), "--check"]) == 0, \
        "run: python -m fedpeft.cli.reference docs/reference"


def test_every_config_key_and_component_setting_has_a_description():
    assert undocumented() == []


def test_the_reference_lists_every_key_and_component():
    pages = reference.pages()
    for key in ("federation.secure_aggregation", "runtime.checkpoint_every", "task.num_examples", "tracking"):
        assert f"| `{key}` |" in pages["config.md"], key
    for name in ("fedadam", "ffa", "mlflow", "soft_prompt", "cmaes"):
        assert f"### `{name}`" in pages["components.md"], name
    assert "`eta`" in pages["components.md"] and "fedpeft config" in pages["cli.md"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.strip() == "", proc.stderr[-3000:]
    return out


def test_the_site_builds_strict_with_every_page(site):
    for page in ("index.html", "getting-started/index.html", "methods/fedbpt/index.html",
                 "reference/components/index.html", "reference/api/index.html", "how-to/add-a-component/index.html"):
        assert (site / page).exists(), page
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "run_embedded" in api and "AggregatorBase" in api  # mkdocstrings read the code


def test_two_pages_render_in_headless_chromium_without_console_errors(site):
    binary = chromium()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        for page, text in (("", "fedpeft"), ("reference/components/", "fedadam")):
            dom = browse(binary, base + page, "--dump-dom", "--virtual-time-budget=3000")
            assert dom.returncode == 0, dom.stderr[-2000:]
            assert console(dom.stderr) == [], page
            assert text in dom.stdout and "md-content" in dom.stdout, page
    finally:
        server.shutdown()
        server.server_close()


def test_every_config_block_in_the_docs_resolves(tmp_path):
    """A YAML block of the docs whose keys are config sections is a config a reader may copy: it must resolve (the
    add-a-component page's blocks name its own components and are run by their own test)."""
    import re

    import yaml

    from fedpeft.config import ExperimentConfig
    from fedpeft.resolve import load_config

    sections, checked = set(ExperimentConfig.model_fields), 0
    for page in sorted((ROOT / "docs").rglob("*.md")):
        if page.name == "add-a-component.md":
            continue
        for i, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", page.read_text(), re.S)):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and data and set(data) <= sections:
                path = tmp_path / f"{page.stem}-{i}.yaml"
                path.write_text(block)
                load_config(path)  # a ConfigError names the key; the page is in the traceback's path
                checked += 1
    assert checked >= 20
