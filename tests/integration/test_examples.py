"""Each script in examples/ runs in its quick mode and prints what its docstring says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.bounds import above, below

pytestmark = pytest.mark.timeout(600)


def _run(script: str, *args: str) -> str:
    res = subprocess.run([sys.executable, str(REPO / "examples" / script), *args],
                         capture_output=True, text=True, timeout=540, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    return res.stdout


def _auc(text: str, prefix: str = "") -> float:
    m = re.search(re.escape(prefix) + r"test_auc (\d\.\d+)", text)
    assert m, text
    return float(m.group(1))


@pytest.mark.stochastic
def test_custom_model_quick_reaches_the_bank_auc(tmp_path: Path) -> None:
    # a user bottom with BatchNorm and Dropout, defined in the script, DP off
    out = _run("custom_model.py", "--quick", "--out", str(tmp_path / "run"))
    above(_auc(out), 0.90, "test AUC")  # seeds: 0.9197 at the lowest (0.92 failed it)
    assert (tmp_path / "run" / "model" / "passive" / "manifest.json").exists()


def test_large_model_quick(tmp_path: Path) -> None:
    out = _run("large_model.py", "--quick", "--out", str(tmp_path / "run"))
    assert "'model': 'resnet'" in out and 0.8 < _auc(out) <= 1.0


@pytest.mark.stochastic
def test_same_code_in_memory_and_through_the_broker() -> None:
    out = _run("same_code_two_transports.py", "--quick")
    mem, brk = _auc(out, "memory: "), _auc(out, "broker: ")
    assert 0.8 < mem <= 1.0 and 0.8 < brk <= 1.0
    below(abs(mem - brk), 0.03, "|memory - broker| AUC")


def test_predict_saved_reproduces_the_test_auc() -> None:
    out = _run("predict_saved.py", "--quick")
    trained = float(re.search(r"trained: test_auc (\d\.\d+)", out).group(1))  # type: ignore[union-attr]
    again = float(re.search(r"test split: test_auc (\d\.\d+)", out).group(1))  # type: ignore[union-attr]
    assert again == pytest.approx(trained, abs=1e-6)
    assert "scored 500 new rows" in out


@pytest.mark.stochastic
def test_fedforge_parties_quick(tmp_path: Path) -> None:
    out = _run("fedforge_parties.py", "--quick", "--out", str(tmp_path / "run"))
    spent = [float(v) for v in re.findall(r"p\d+=(\d\.\d+)", out)]
    assert len(spent) == 3 and all(0.9 <= e <= 1.0 + 1e-6 for e in spent), out
    tv = float(re.search(r"avg_tv (\d\.\d+)", out).group(1))  # type: ignore[union-attr]
    assert tv > 0.0
    below(tv, 0.3, "avg TV")
    assert "reloaded: same rows True" in out
    assert (tmp_path / "run" / "stages" / "ckpt" / "model.npz").is_file()
