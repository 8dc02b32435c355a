"""Headless Chromium for the tests that check pages as a person sees them: Debian's `chromium`
package, installed by the test set-up when it is missing (as root, from the package registry;
nothing is downloaded at run time by the pages themselves)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_failed: list[str] = []  # this worker's failed install, if any

ARTIFACTS = Path(__file__).resolve().parent.parent / "out" / "test-artifacts"


def chromium() -> str:
    """The chromium binary; installs Debian's package when it is missing and this runs as root."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is missing and cannot be installed here (needs root and apt-get): "
                    "apt-get install -y chromium")
    if _failed:
        pytest.fail(_failed[0])
    # pytest-xdist's workers ask at once on a fresh machine: one installs, the others wait for it
    # (two apt-gets at once fail on dpkg's lock).
    with open(Path(tempfile.gettempdir()) / "statebudget-chromium.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if found := shutil.which("chromium"):  # another worker installed it meanwhile
            return found
        out = subprocess.run(["apt-get", "install", "-y", "chromium"], capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            out = subprocess.run("apt-get update && apt-get install -y chromium", shell=True, capture_output=True,
                                 text=True, timeout=900)
    if out.returncode != 0:  # said once; the next tests fail at once rather than try again for minutes
        _failed.append(f"installing chromium failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        pytest.fail(_failed[0])
    return shutil.which("chromium")


def _run(args: list[str], timeout_s: float = 60) -> str:
    base = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--disable-extensions", "--virtual-time-budget=4000"]
    out = subprocess.run(base + args, capture_output=True, text=True, timeout=timeout_s)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def rendered_dom(url: str) -> str:
    """The page's DOM after its scripts ran (what a person would see, as HTML)."""
    return _run(["--dump-dom", url])


def screenshot(url: str, name: str, size: str = "1280,1000") -> Path:
    """A PNG of the page, kept under out/test-artifacts/ for a person to look at."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    _run([f"--screenshot={path}", f"--window-size={size}", url])
    assert path.is_file() and path.stat().st_size > 1000
    return path
