"""The architecture's contracts (``[tool.importlinter]`` in pyproject.toml, checked with
import-linter): the layers (the bus below everything; the broker, the VFL parties and
FedForge on it, none using another; ``sim`` above them), the algorithms free of I/O, and
no import cycle between the modules of any package.

A copy of the packages with a planted upward import, a planted cycle and a planted
socket in an algorithm must break each contract, and the same copy without them must
keep all three: the contracts can fail, and fail for what they say.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pubsub", "broker", "parties", "synth", "sim")
CONTRACTS = {
    "layers": "The bus below everything",
    "algorithms-no-io": "The algorithms (strategies",
    "acyclic": "No import cycles",
}


def _lint_here() -> tuple[int, str]:
    """import-linter on this checkout, in process (the packages under test are the ones
    this interpreter imports)."""
    from importlinter.cli import lint_imports

    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with redirect_stdout(out):
            code = lint_imports(config_filename=str(ROOT / "pyproject.toml"),
                                no_cache=True)
    finally:
        os.chdir(cwd)
    return code, out.getvalue()


def _verdicts(report: str) -> dict[str, str]:
    """Each contract's verdict, KEPT or BROKEN, in a report (names wrap over lines)."""
    flat = " ".join(report.split())
    out = {}
    for cid, start in CONTRACTS.items():
        m = re.search(re.escape(start) + r".*?\b(KEPT|BROKEN)\b", flat)
        out[cid] = m.group(1) if m else "?"
    return out


def test_the_contracts_hold() -> None:
    code, report = _lint_here()
    assert code == 0, report
    assert _verdicts(report) == dict.fromkeys(CONTRACTS, "KEPT"), report


def _copy(dst: Path) -> None:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dst / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")


def _lint_copy(where: Path) -> tuple[int, str]:
    """import-linter on the copy at ``where``, in a fresh interpreter whose import path
    puts the copy first (the installed checkout must not answer for it)."""
    env = {**os.environ, "PYTHONPATH": str(where)}
    proc = subprocess.run([sys.executable, "-c",
                           "import sys; from importlinter.cli import lint_imports; "
                           "sys.exit(lint_imports(config_filename='pyproject.toml', "
                           "no_cache=True))"],
                          cwd=where, env=env, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_planted_violations_break_each_contract(tmp_path: Path) -> None:
    _copy(tmp_path)
    code, report = _lint_copy(tmp_path)
    assert code == 0 and _verdicts(report) == dict.fromkeys(CONTRACTS, "KEPT"), report
    # the bus reaching up into the parties (an upward import)
    (tmp_path / "pubsub" / "planted_up.py").write_text("import parties.config  # planted\n")
    # two modules of the FedForge package importing each other (a cycle)
    (tmp_path / "synth" / "planted_a.py").write_text("from synth import planted_b  # planted\n")
    (tmp_path / "synth" / "planted_b.py").write_text("from synth import planted_a  # planted\n")
    # a strategy opening a socket (I/O in an algorithm)
    with (tmp_path / "parties" / "strategy.py").open("a") as f:
        f.write("\nimport socket  # noqa: E402  (planted)\n")
    code, report = _lint_copy(tmp_path)
    assert code == 1, report
    assert _verdicts(report) == dict.fromkeys(CONTRACTS, "BROKEN"), report
    flat = " ".join(report.split())
    assert "pubsub.planted_up -> parties.config" in flat, report
    assert "planted_a" in flat and "planted_b" in flat, report
    assert "parties.strategy -> socket" in flat, report


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-n", "0"]))
