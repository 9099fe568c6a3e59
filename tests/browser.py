"""Headless Chromium for the tests that render pages (report.html, the documentation site): find or install the
binary, load a page, read its console messages."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    apt = shutil.which("apt-get")
    if apt is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("headless Chromium test needs the `chromium` binary; not installed, and cannot install it "
                    f"({'apt-get missing' if apt is None else 'not running as root'}): apt-get install chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run([apt, "install", "-y", "--no-install-recommends", "chromium"], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not shutil.which("chromium"):
        pytest.skip(f"`apt-get install chromium` failed (rc {proc.returncode}): {proc.stderr[-500:]}")
    return shutil.which("chromium")


def browse(binary: str, page: Path | str, *args: str) -> subprocess.CompletedProcess:
    cmd = [binary, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr", "--v=0",
           "--window-size=1200,2000", *args, page if isinstance(page, str) else page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


