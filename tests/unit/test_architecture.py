"""The architecture's contracts (``[tool.importlinter]`` in pyproject.toml, checked with
import-linter): the layers (the bus below everything; the broker, the VFL parties and
FedForge on it, none using another; ``sim`` above them), the algorithms free of I/O, the
VFL parties' subpackages each importing only those below it, and no import cycle between
the modules of any package; and, with grimp, no cycle between any two modules at all (a
package's ``__init__`` included, which import-linter's sibling check does not see).

A copy of the packages with a planted upward import, a planted cycle, a planted socket in
an algorithm and a planted upward import between the parties' subpackages must break each
contract, and the same copy without them must keep all of them: the contracts can fail,
and fail for what they say.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pubsub", "broker", "parties", "synth", "sim")
CONTRACTS = {
    "layers": "The bus below everything",
    "algorithms-no-io": "The algorithms (strategies",
    "parties-layers": "The VFL parties' subpackages",
    "sim-layers": "The simulator's subpackages",
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
    with (tmp_path / "parties" / "algorithms" / "strategy.py").open("a") as f:
        f.write("\nimport socket  # noqa: E402  (planted)\n")
    # the parties' shared vocabulary reaching up into the runtime
    (tmp_path / "parties" / "core" / "planted_up.py").write_text(
        "import parties.runtime.party  # planted\n")
    # the reports reaching up into the cluster simulator
    (tmp_path / "sim" / "reports" / "planted_up.py").write_text(
        "import sim.cluster.runner  # planted\n")
    code, report = _lint_copy(tmp_path)
    assert code == 1, report
    assert _verdicts(report) == dict.fromkeys(CONTRACTS, "BROKEN"), report
    flat = " ".join(report.split())
    assert "pubsub.planted_up -> parties.config" in flat, report
    assert "planted_a" in flat and "planted_b" in flat, report
    assert "parties.algorithms.strategy -> socket" in flat, report
    assert "parties.core.planted_up -> parties.runtime.party" in flat, report
    assert "sim.reports.planted_up -> sim.cluster.runner" in flat, report


#: the only modules of parties/ and sim/ outside a subpackage
TOP_LEVEL = {"parties": {"__init__.py", "__main__.py", "cli.py"},
             "sim": {"__init__.py", "__main__.py", "cli.py", "api.py", "fedforge.py"}}


def test_parties_and_sim_keep_their_modules_in_subpackages() -> None:
    for pkg, allowed in TOP_LEVEL.items():
        loose = sorted(p.name for p in (ROOT / pkg).glob("*.py") if p.name not in allowed)
        assert not loose, f"{pkg}/: modules outside a subpackage: {loose}"
        for sub in (ROOT / pkg).iterdir():
            if sub.is_dir() and any(sub.glob("*.py")):
                init = sub / "__init__.py"
                assert init.is_file(), f"{sub} is not a package"
                doc = init.read_text()
                assert doc.startswith('"""') and "import" in doc.split('"""')[1], \
                    f"{init}: its docstring must say what the package may import"


def _module_cycles(graph: Any) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def imported(m: str) -> Iterator[str]:
        return iter(sorted(graph.find_modules_directly_imported_by(m)))

    for root in sorted(graph.modules):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        work = [(root, imported(root))]
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, imported(w)))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_module_takes_part_in_an_import_cycle() -> None:
    """Module by module, annotation-only and function-level imports included, a package's
    ``__init__`` too: no cycle anywhere (and a planted one is found)."""
    import grimp

    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert _module_cycles(graph) == []
    graph.add_import(importer="pubsub.codec", imported="parties.data")
    graph.add_import(importer="parties.data", imported="pubsub.codec")
    assert ["parties.data", "pubsub.codec"] in _module_cycles(graph)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-n", "0"]))
