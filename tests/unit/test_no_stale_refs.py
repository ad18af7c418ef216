"""No tracked source or document cites something a reader of the repository cannot follow:
a path under the workspace's ``shared/`` folders (outside the repository) or an issue
number of the tracker. CHANGELOG.md is history and is left as written."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = re.compile(r"shared/(reference|seeds|tools|hooks)/")
ISSUE = re.compile(r"\b[Ii]ssue [0-9]+\b")
EXEMPT = {"CHANGELOG.md"}


def _tracked() -> list[Path]:
    """The tracked *.py and *.md files, or a skip where git or the repository is missing."""
    if shutil.which("git") is None:
        pytest.skip("git is not available")
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", "*.py", "*.md"],
            cwd=ROOT, capture_output=True, check=True, timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")
    names = [n for n in out.decode().split("\0") if n]
    return [ROOT / n for n in names if Path(n).name not in EXEMPT and (ROOT / n).is_file()]


def test_no_shared_paths_or_issue_numbers() -> None:
    offenders = []
    for path in _tracked():
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            if SHARED.search(line) or ISSUE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not offenders, (
        f"{len(offenders)} line(s) cite a shared/ path or an issue number:\n"
        + "\n".join(offenders)
    )
