"""MkDocs hook: the equations that ``pymdownx.arithmatex`` marks (``\\( ... \\)``, ``$$ ... $$``) become MathML at
build time (latex2mathml), which browsers render natively: the site shows its equations offline, with no script.
An equation latex2mathml cannot convert is a warning, so ``mkdocs build --strict`` fails on it."""

from __future__ import annotations

import html
import logging
import re

from latex2mathml.converter import convert

log = logging.getLogger("mkdocs.hooks.mathml")
INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
BLOCK = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)
UNKNOWN = re.compile(r">[^<]*(\\[A-Za-z]+)")


def _mathml(display: str, page: str):
    def replace(match: re.Match) -> str:
        tex = html.unescape(match.group(1)).strip()
        try:
            out = convert(tex, display=display)
        except Exception as e:  # noqa: BLE001 - any parse failure is reported with the page and the equation
            log.warning("%s: cannot convert the equation %r to MathML (%s: %s)", page, tex, type(e).__name__, e)
            return match.group(0)
        if unknown := UNKNOWN.findall(out):  # a command latex2mathml does not know is kept as text
            log.warning("%s: the equation %r uses %s, which latex2mathml does not know", page, tex, unknown)
        return out
    return replace


def on_page_content(html_text: str, page, **_) -> str:
    html_text = BLOCK.sub(_mathml("block", page.file.src_uri), html_text)
    return INLINE.sub(_mathml("inline", page.file.src_uri), html_text)
