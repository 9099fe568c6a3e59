"""MkDocs hook: the figures the results files link to (``benchmarks/results/*.svg``) are published beside every page
that includes a results file through a ``--8<--`` snippet, so a relative image link in the included file resolves on
the site as it does on GitHub. The files are read from ``benchmarks/results`` at build time: nothing is copied into
``docs/``."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

RESULTS = Path("benchmarks/results")
SNIPPET = re.compile(r'--8<--\s+"benchmarks/results/[^"]+\.md"')


def on_files(files: Files, config) -> Files:
    figures = sorted(RESULTS.glob("*.svg"))
    for page in [f for f in files if f.src_uri.endswith(".md") and f.abs_src_path]:
        if not SNIPPET.search(Path(page.abs_src_path).read_text(encoding="utf-8")):
            continue
        folder = str(Path(page.src_uri).parent)
        for figure in figures:
            uri = figure.name if folder == "." else f"{folder}/{figure.name}"
            if files.get_file_from_path(uri) is None:
                files.append(File.generated(config, uri, abs_src_path=str(figure.resolve())))
    return files
