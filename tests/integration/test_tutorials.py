"""Each tutorial (docs/tutorials/*.md) runs as written, in a quick mode, and does what it says.

Every ```bash and ```python block of a tutorial is preceded by a directive, an HTML comment
(hidden on the site and on GitHub) on the line before its fence, that says whether and how
this module runs it::

    <!-- test: run -->            run the block as written
    <!-- test: skip: REASON -->   do not run it, and say why (a reason is required)
    <!-- test: file: PATH -->     write the block to PATH (a config, a module; any language)

A run or file directive may add items, separated by ``;``:

    OLD => NEW            replace OLD in the block (as a whole word where it is one):
                          placeholders (RUN_DIR => run), quick settings (epochs = 5 =>
                          epochs = 1)
    WORDS += ARGS         append ARGS to each command that starts with WORDS (quick mode:
                          psfl demo += --set epochs=1)
    given: FILE ...       files this module provides in the working directory first (the
                          reader's own data: my.csv)
    together              the commands after the block's ``psfl broker run`` start at once, as
                          on their own hosts, and must all end
    hosts: NAME ...       a page run across hosts (test_bank_and_partner): the host of each
                          of the block's commands in order (one name: every command), run
                          there through ``sh`` in the host's network namespace and directory

A directive whose substitution or append matches nothing fails the test (it went stale).

A tutorial runs in one fresh working directory, block after block. A bash block runs line by
line (``\\`` continuations joined, ``# comments`` dropped, optional ``[--...]`` groups left
out): ``psfl`` is ``python -P -m sim.cli`` (as the console script: the working directory is
not on ``sys.path``), ``python`` this interpreter, ``VAR=value`` prefixes set the environment
(``PYTHONPATH=X`` keeps this checkout after X), ``> FILE`` writes stdout to FILE. A ``psfl
broker run`` line starts the broker in the background on 127.0.0.1 with ephemeral ports
(its ``--bind`` rewritten, a ``--ready-file`` added) until the block ends, and every later
``--broker ADDRESS`` points at it. A python block runs as a script in the working directory.
Every command must exit 0 within its timeout and print no traceback; each test then checks
the files and figures its tutorial promises.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import REPO
from tests.mdblocks import fenced_blocks
from tests.bounds import above, below

pytestmark = pytest.mark.timeout(600)

TUTORIALS = REPO / "docs" / "tutorials"
#: fenced blocks in these languages must carry a directive
RUN_LANGS = {"", "bash", "sh", "shell", "console", "python"}
SHELL_LANGS = RUN_LANGS - {"python"}
DIRECTIVE = re.compile(r"^\s*<!--\s*test:\s*(.*?)\s*-->\s*$")
PSFL = [sys.executable, "-P", "-m", "sim.cli"]
#: the most seconds one command (or one block's commands together) may take
COMMAND_TIMEOUT_S = 240.0
#: the quick FedForge settings of the fedforge tutorial's directive, for across-hosts' RUN
SYNTH_QUICK_DROP = ("workclass", "fnlwgt", "education", "educational-num", "occupation",
                    "race", "capital-gain", "capital-loss", "native-country")


# ------------------------------------------------------------------ reading a page


@dataclass(frozen=True)
class Directive:
    action: str  # run | skip | file
    reason: str = ""
    path: str = ""
    subs: tuple[tuple[str, str], ...] = ()
    appends: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()
    given: tuple[str, ...] = ()
    together: bool = False
    hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Block:
    where: str  # PAGE:LINE, the page under the repository and the line of its fence
    lang: str
    text: str
    directive: Directive | None


def parse_directive(text: str) -> Directive:
    """The directive of a ``<!-- test: ... -->`` comment (ValueError when malformed)."""
    if text == "skip" or text.startswith("skip:"):
        reason = text[5:].strip()
        if not reason:
            raise ValueError("a skip needs its reason: <!-- test: skip: REASON -->")
        return Directive("skip", reason=reason)
    head, *items = [s.strip() for s in text.split(";")]
    if head == "run":
        action, path = "run", ""
    elif head.startswith("file:") and head[5:].strip():
        action, path = "file", head[5:].strip()
    else:
        raise ValueError(f"a directive starts with run, skip: REASON or file: PATH, not {head!r}")
    subs, appends, given, together, hosts = [], [], [], False, []
    for item in items:
        if "=>" in item:
            old, new = (s.strip() for s in item.split("=>", 1))
            if not old:
                raise ValueError(f"empty substitution in {item!r}")
            subs.append((old, new))
        elif "+=" in item:
            words, args = item.split("+=", 1)
            appends.append((tuple(shlex.split(words)), tuple(shlex.split(args))))
        elif item.startswith("given:"):
            given += item[6:].split()
        elif item == "together":
            together = True
        elif item.startswith("hosts:") and item[6:].split():
            hosts += item[6:].split()
        else:
            raise ValueError(f"unknown directive item {item!r}")
    return Directive(action, path=path, subs=tuple(subs), appends=tuple(appends),
                     given=tuple(given), together=together, hosts=tuple(hosts))


def page_blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` with the directive on the line before each (if any)."""
    lines = page.read_text().splitlines()
    out = []
    for start, lang, body in fenced_blocks(lines):
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        d = DIRECTIVE.match(lines[j]) if j >= 0 else None
        where = f"{page.relative_to(REPO)}:{start + 1}"
        try:
            directive = parse_directive(d.group(1)) if d else None
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        out.append(Block(where, lang, "\n".join(body) + "\n", directive))
    return out


def substitute(text: str, old: str, new: str) -> tuple[str, int]:
    """``text`` with ``old`` replaced (bounded by non-word characters where its ends are
    word characters), and the number of replacements."""
    pat = re.escape(old)
    if re.match(r"\w", old[0]):
        pat = r"(?<!\w)" + pat
    if re.match(r"\w", old[-1]):
        pat += r"(?!\w)"
    return re.subn(pat, lambda _: new, text)


def logical_lines(text: str) -> list[str]:
    """Shell lines with ``\\`` continuations joined, blank and comment-only ones dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        joined, buf = (buf + line).strip(), ""
        if joined and shlex.split(joined, comments=True):
            out.append(joined)
    return out


def drop_optional(tokens: list[str]) -> list[str]:
    """``tokens`` without optional ``[--...]`` groups (``[--a X | --b Y]`` included)."""
    out, depth = [], 0
    for tok in tokens:
        if depth == 0 and tok.startswith("[-"):
            depth = 1
        if depth:
            if tok.endswith("]"):
                depth = 0
            continue
        out.append(tok)
    return out


@dataclass
class Command:
    words: list[str]  # as in the page (after substitutions), without env and redirection
    env: dict[str, str] = field(default_factory=dict)
    stdout_to: str | None = None

    def argv(self) -> list[str]:
        head = {"psfl": PSFL, "python": [sys.executable]}.get(self.words[0], self.words[:1])
        return [*head, *self.words[1:]]

    def starts_with(self, words: tuple[str, ...] | str) -> bool:
        words = tuple(words.split()) if isinstance(words, str) else words
        return tuple(self.words[:len(words)]) == words


def parse_line(line: str) -> Command:
    tokens = drop_optional(shlex.split(line, comments=True))
    env = {}
    while tokens and re.match(r"^[A-Za-z_]\w*=", tokens[0]):
        k, v = tokens.pop(0).split("=", 1)
        env[k] = v
    stdout_to = None
    if len(tokens) >= 2 and tokens[-2] == ">":
        stdout_to = tokens[-1]
        tokens = tokens[:-2]
    bad = [t for t in tokens if t in {"&&", "||", ";", "|", "&", ">", ">>", "<", "2>", "&>"}]
    if bad or not tokens:
        raise ValueError(f"shell syntax this runner does not take: {line!r}")
    return Command(tokens, env, stdout_to)


# ------------------------------------------------------------------ running a page


@dataclass
class Step:
    """One command (or python block) of a tutorial that ran and exited 0."""
    where: str
    words: list[str]
    stdout: str
    stderr: str

    def starts_with(self, words: str) -> bool:
        return self.words[:len(words.split())] == words.split()

    @property
    def name(self) -> str:
        """The command's leading words (``psfl vfl run``, ``python``), at most three."""
        lead = []
        for w in self.words[:3]:
            if not re.fullmatch(r"[a-z][a-z-]*", w):
                break
            lead.append(w)
        return " ".join(lead)

    def arg(self, option: str) -> str:
        return self.words[self.words.index(option) + 1]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for k, v in (extra or {}).items():
        env[k] = v
    paths = [p for p in ((extra or {}).get("PYTHONPATH", ""), str(REPO),
                         os.environ.get("PYTHONPATH", "")) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)  # this checkout stays importable
    return env


def _check(where: str, cmd: str, code: int | None, out: str, err: str) -> None:
    assert code == 0, f"{where}: `{cmd}` exited {code}\n{out[-1500:]}\n{err[-3000:]}"
    assert "Traceback" not in err, f"{where}: `{cmd}` printed a traceback\n{err[-3000:]}"


def _run(cmd: Command, where: str, cwd: Path) -> Step:
    shown = shlex.join(cmd.words)
    try:
        res = subprocess.run(cmd.argv(), cwd=cwd, env=_env(cmd.env), capture_output=True,
                             text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{where}: `{shown}` ran past {COMMAND_TIMEOUT_S:.0f} s\n"
                    f"{(exc.stderr or b'')[-3000:]!r}")
    _check(where, shown, res.returncode, res.stdout, res.stderr)
    if cmd.stdout_to is not None:
        (cwd / cmd.stdout_to).write_text(res.stdout)
    return Step(where, cmd.words, res.stdout, res.stderr)


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _read(f: Any) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")


def _start_broker(cmd: Command, where: str, cwd: Path, logs: Path
                  ) -> tuple[subprocess.Popen[bytes], str, Any]:
    """The block's broker on 127.0.0.1 (ephemeral ports): ``(process, address, log)``."""
    words = list(cmd.words)
    if "--bind" in words:
        words[words.index("--bind") + 1] = "tcp://127.0.0.1:0"
    else:
        words += ["--bind", "tcp://127.0.0.1:0"]
    ready = logs / f"broker-{time.monotonic_ns()}.addr"
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([*Command(words).argv(), "--ready-file", str(ready)], cwd=cwd,
                            env=_env(cmd.env), stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            pytest.fail(f"{where}: `{shlex.join(cmd.words)}` did not start\n{_read(log)[-3000:]}")
        time.sleep(0.05)
    return proc, ready.read_text().strip(), log


def _run_together(cmds: list[Command], where: str, cwd: Path) -> list[Step]:
    """Start ``cmds`` at once; each must exit 0 before the deadline."""
    procs, logs = [], []
    try:
        for cmd in cmds:
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            logs.append((out, err))
            procs.append(subprocess.Popen(cmd.argv(), cwd=cwd, env=_env(cmd.env),
                                          stdout=out, stderr=err))
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        for cmd, proc, (out, err) in zip(cmds, procs, logs, strict=True):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{where}: `{shlex.join(cmd.words)}` ran past "
                            f"{COMMAND_TIMEOUT_S:.0f} s\n{_read(err)[-3000:]}")
            _check(where, shlex.join(cmd.words), proc.returncode, _read(out), _read(err))
        return [Step(where, cmd.words, _read(out), _read(err))
                for cmd, (out, err) in zip(cmds, logs, strict=True)]
    finally:
        for proc in procs:
            _stop(proc)
        for out, err in logs:
            out.close()
            err.close()


def _shell_block(block: Block, text: str, cwd: Path) -> Iterator[Step]:
    d = block.directive
    assert d is not None
    cmds = [parse_line(line) for line in logical_lines(text)]
    for words, args in d.appends:
        hits = [c for c in cmds if c.starts_with(words)]
        assert hits, f"{block.where}: `{' '.join(words)} +=` matches no command (stale directive)"
        for c in hits:
            c.words += list(args)
    brokers = [i for i, c in enumerate(cmds) if c.starts_with("psfl broker run")]
    assert len(brokers) <= 1, f"{block.where}: one `psfl broker run` per block"
    if d.together and not brokers:
        raise AssertionError(f"{block.where}: `together` needs a `psfl broker run` line")
    if not brokers:
        for cmd in cmds:
            yield _run(cmd, block.where, cwd)
        return
    b = brokers[0]
    before, after = cmds[:b], cmds[b + 1:]
    steps = [_run(cmd, block.where, cwd) for cmd in before]
    logs = cwd.parent / f"{cwd.name}-logs"
    logs.mkdir(exist_ok=True)
    proc, address, log = _start_broker(cmds[b], block.where, cwd, logs)
    try:
        for cmd in after:
            if "--broker" in cmd.words:
                cmd.words[cmd.words.index("--broker") + 1] = address
        if d.together:
            steps += _run_together(after, block.where, cwd)
        else:
            steps += [_run(cmd, block.where, cwd) for cmd in after]
    finally:
        _stop(proc)
        broker_log = _read(log)
        log.close()
    _check(block.where, shlex.join(cmds[b].words), proc.returncode, "", broker_log)
    steps.append(Step(block.where, cmds[b].words, broker_log, ""))
    yield from steps  # nothing of the block runs any more


def run_tutorial(name: str, cwd: Path) -> Iterator[Step]:
    """Run the blocks of the tutorial ``name`` (its page in TUTORIALS) in order in ``cwd``,
    yielding each step that ran (every one exited 0; a failure fails the test)."""
    for n, block in enumerate(page_blocks(TUTORIALS / f"{name}.md")):
        d = block.directive
        if d is None or d.action == "skip":
            continue  # test_every_tutorial_block_says_how_it_is_tested holds the rest
        missing = [g for g in d.given if not (cwd / g).exists()]
        assert not missing, f"{block.where}: the test provides no {missing}"
        text = block.text
        for old, new in d.subs:
            text, hits = substitute(text, old, new)
            assert hits, f"{block.where}: `{old} =>` matches nothing (stale directive)"
        if d.action == "file":
            path = cwd / d.path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        elif block.lang == "python":
            script = cwd / f"tutorial_block_{n}.py"
            script.write_text(text)
            yield _run(Command(["python", script.name]), block.where, cwd)
        else:
            yield from _shell_block(block, text, cwd)


# ------------------------------------------------------------------ helpers for the checks


def _json(path: Path) -> Any:
    assert path.is_file(), f"{path} was not written"
    return orjson.loads(path.read_bytes())


def _png(path: Path) -> None:
    assert path.is_file(), f"{path} was not written"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000, path


def _csv_rows(path: Path) -> int:
    assert path.is_file(), f"{path} was not written"
    with path.open() as f:
        return sum(1 for _ in f) - 1


def _columns(m: dict[str, Any]) -> dict[str, list[str]]:
    return {p: list(v["columns"]) for p, v in m["parties"].items()}


# ------------------------------------------------------------------ the directives


PAGES = sorted(p.stem for p in TUTORIALS.glob("*.md"))


def test_every_tutorial_has_its_test() -> None:
    tested = {name.removeprefix("test_").replace("_", "-") for name in globals()
              if name.startswith("test_") and name.removeprefix("test_").replace("_", "-")
              in PAGES}
    assert tested == set(PAGES), f"tutorials without a test here: {set(PAGES) - tested}"


@pytest.mark.parametrize("name", PAGES)
def test_every_tutorial_block_says_how_it_is_tested(name: str) -> None:
    blocks = page_blocks(TUTORIALS / f"{name}.md")
    runnable = [b for b in blocks if b.lang in RUN_LANGS]
    undirected = [b.where for b in runnable if b.directive is None]
    assert not undirected, ("blocks without a <!-- test: run | skip: REASON | file: PATH --> "
                            f"line before them: {undirected}")
    assert any(b.directive.action == "run" for b in runnable if b.directive), \
        f"{name}: no block of it runs"
    for b in blocks:
        d = b.directive
        if d is not None and d.action == "run" and b.lang not in RUN_LANGS:
            raise AssertionError(f"{b.where}: only bash and python blocks run (file: PATH?)")
        if d is not None and d.action == "run" and b.lang in SHELL_LANGS:
            for line in logical_lines(b.text):
                parse_line(line)  # the runner takes its shell syntax


def test_the_directive_grammar() -> None:
    d = parse_directive('run; RUN_DIR => run; psfl vfl run --dataset bank += --set epochs=1; '
                        'given: my.csv my.parquet; together')
    assert d == Directive("run", subs=(("RUN_DIR", "run"),),
                          appends=((("psfl", "vfl", "run", "--dataset", "bank"),
                                    ("--set", "epochs=1")),),
                          given=("my.csv", "my.parquet"), together=True)
    assert parse_directive("run; together; hosts: broker bank").hosts == ("broker", "bank")
    assert parse_directive("skip: covered; elsewhere").reason == "covered; elsewhere"
    assert parse_directive("file: mypkg/models.py").path == "mypkg/models.py"
    for bad in ("skip", "skip:", "runs", "run; nonsense", "file:"):
        with pytest.raises(ValueError):
            parse_directive(bad)
    assert substitute("RUN/a RUN_DIR xRUN", "RUN", "r") == ("r/a RUN_DIR xRUN", 1)
    assert substitute('{"epochs": 3}', '{"epochs": 3}', '{"epochs": 1}')[1] == 1
    c = parse_line("PYTHONPATH=. psfl report R [--out DIR] [--max-batches 40 | --window-s 5:15]"
                   " # plots")
    assert c.words == ["psfl", "report", "R"] and c.env == {"PYTHONPATH": "."}
    c = parse_line("printf '[runs.r1]\\nx = 1\\n' > members.toml")
    assert c.words == ["printf", "[runs.r1]\\nx = 1\\n"] and c.stdout_to == "members.toml"
    with pytest.raises(ValueError):
        parse_line("psfl demo && psfl report runs/demo")
    assert logical_lines("a \\\n  b  # c\n# only a comment\n\nd\n") == ["a    b  # c", "d"]


# ------------------------------------------------------------------ the tutorials


def test_first_vfl_run(tmp_path: Path) -> None:
    names = []
    for step in run_tutorial("first-vfl-run", tmp_path):
        names.append(step.name)
        run = tmp_path / "runs" / "demo"
        if step.starts_with("psfl demo"):
            m = _json(run / "metrics.json")
            assert m["dataset"] == "bank" and m["epochs"] == 1 and 0.8 < m["test_auc"] <= 1.0
            assert "test_auc" in step.stdout
            # "What a run directory holds"
            for f in ("config.toml", "events.jsonl", "passive.json", "broker.addr",
                      "timeline-active.json", "timeline-passive.json",
                      "model/active/manifest.json", "model/passive/manifest.json"):
                assert (run / f).is_file(), f
        elif step.starts_with("psfl report"):
            for png in ("metric_vs_time.png", "cpu_util.png", "gantt_demo.png"):
                _png(run / "plots" / png)
                assert f"plots/{png}" in step.stdout
        elif step.starts_with("psfl vfl predict"):
            p = _json(tmp_path / "runs" / "demo-pred" / "predict.json")
            assert p["source"] == "test_split"
            assert p["test_auc"] == pytest.approx(_json(run / "metrics.json")["test_auc"],
                                                  abs=1e-6)
            assert _csv_rows(tmp_path / "runs" / "demo-pred" / "predictions.csv") == p["rows"]
    assert names == ["psfl demo", "psfl report", "psfl vfl predict"]


def _own_data(cwd: Path) -> float:
    """The reader's tables of your-own-data.md: ``my.csv`` (features a, b, c, d and a
    yes/no ``target`` that depends on all of them) and ``my.parquet`` (x1, x3, x2 and a
    numeric ``price``). Returns the standard deviation of ``price``."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 3000
    a, c = rng.normal(size=n), rng.normal(size=n)
    b, d = rng.choice(["red", "green", "blue"], n), rng.choice(["x", "y"], n)
    logit = 1.5 * a + 1.5 * c + np.where(b == "red", 1.0, -0.5) + np.where(d == "x", 0.8, -0.8)
    target = np.where(rng.random(n) < 1 / (1 + np.exp(-logit)), "yes", "no")
    pd.DataFrame({"a": a.round(3), "b": b, "c": c.round(3), "d": d,
                  "target": target}).to_csv(cwd / "my.csv", index=False)
    x1, x2, x3 = rng.normal(size=n), rng.normal(size=n), rng.choice(["n", "s", "e", "w"], n)
    price = (200 + 40 * x1 + 25 * x2 + np.select([x3 == "n", x3 == "s"], [30, -30], 0)
             + rng.normal(0, 10, n))
    pd.DataFrame({"x1": x1.round(3), "x3": x3, "x2": x2.round(3),
                  "price": price.round(2)}).to_parquet(cwd / "my.parquet", index=False)
    return float(price.std())


@pytest.mark.stochastic
def test_your_own_data(tmp_path: Path) -> None:
    price_std = _own_data(tmp_path)
    seen = {}
    for step in run_tutorial("your-own-data", tmp_path):
        assert step.starts_with("psfl vfl run")
        seen[step.arg("--dataset")] = _json(tmp_path / step.arg("--out") / "metrics.json")
    assert sorted(seen) == ["my.csv", "my.parquet"]
    m = seen["my.csv"]  # the label and the column lists as given, a binary task
    assert m["task"] == "binary" and m["metric_name"] == "auc"
    assert _columns(m) == {"active": ["a", "b"], "passive": ["c", "d"]}
    assert 0.75 < m["test_auc"] <= 1.0
    m = seen["my.parquet"]  # no column lists: the first half (rounded up) to the active party
    assert m["task"] == "regression" and m["metric_name"] == "rmse"
    assert _columns(m) == {"active": ["x1", "x3"], "passive": ["x2"]}
    below(m["test_rmse"] / price_std, 0.5, "RMSE / label sd")  # in the label's own units, and learnt


def test_your_own_model(tmp_path: Path) -> None:
    steps = list(run_tutorial("your-own-model", tmp_path))
    runs = tmp_path / "runs"
    snippet = steps[0]
    assert snippet.words[0] == "python"
    # the python snippet: in memory, then through a broker, then predict with the first
    printed = float(snippet.stdout.split()[0])
    assert 0.8 < printed <= 1.0
    mem, brk = _json(runs / "mine-p" / "metrics.json"), _json(runs / "mine-pred" / "predict.json")
    assert (runs / "mine-p" / "broker.addr").is_file() and 0.8 < mem["test_auc"] <= 1.0
    assert brk["test_auc"] == pytest.approx(printed, abs=1e-6)  # the saved model of runs/mine
    assert _csv_rows(runs / "mine-pred" / "predictions.csv") == brk["rows"]
    big = _json(runs / "big" / "metrics.json")
    assert big["model"]["model"] == "resnet"
    assert big["model"]["resnet"]["depth"] == 2 and big["model"]["resnet"]["norm"] == "batch"
    assert 0.8 < big["test_auc"] <= 1.0
    mine = _json(runs / "mine" / "metrics.json")  # now the mypkg run's
    assert mine["config"]["model"]["bottom"] == "mypkg.models:bottom"
    assert mine["config"]["model"]["top"] == "mypkg.models:top"
    assert 0.75 < mine["test_auc"] <= 1.0
    assert [s.name for s in steps[1:]] == ["psfl vfl run"] * 2


def test_several_parties(tmp_path: Path) -> None:
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(1)
    n = 2000
    x = rng.normal(size=(n, 5))
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-x @ [1.0, -1.0, 1.0, 0.5, 1.5])), 1, 0)
    pd.DataFrame({**{k: x[:, i].round(3) for i, k in enumerate("abcde")},
                  "y": y}).to_csv(tmp_path / "my.csv", index=False)
    seen = {}
    for step in run_tutorial("several-parties", tmp_path):
        if step.starts_with("psfl vfl run"):
            out = tmp_path / step.arg("--out")
            seen[step.arg("--dataset")] = _json(out / "metrics.json")
            if step.arg("--dataset") == "bank":  # the "Outputs" section
                for p in ("passive", "passive2", "passive3"):
                    assert (out / f"{p}.json").is_file(), p
                    assert (out / f"timeline-{p}.json").is_file(), p
                    assert (out / "model" / p / "manifest.json").is_file(), p
    m = seen["bank"]  # "4 parties, 4 columns each"
    cols = _columns(m)
    assert sorted(cols) == ["active", "passive", "passive2", "passive3"]
    assert all(len(c) == 4 for c in cols.values()), cols
    assert sorted(m["dp_by_party"]) == ["passive", "passive2", "passive3"]
    assert 0.8 < m["test_auc"] <= 1.0
    m = seen["my.csv"]
    assert _columns(m) == {"active": ["a", "b"], "passive": ["c", "d"], "passive2": ["e"]}
    assert 0.7 < m["test_auc"] <= 1.0
    # by hand: three parties through a CURVE broker with the run's membership
    m = _json(tmp_path / "runC" / "metrics.json")
    assert m["security"]["transport"] == "curve" and m["security"]["identity"] == "active"
    assert sorted(m["parties"]) == ["active", "passive", "passive2"] and m["epochs"] == 1
    assert 0.8 < m["test_auc"] <= 1.0
    assert (tmp_path / "runB" / "passive.json").is_file()
    assert (tmp_path / "runD" / "passive2.json").is_file()


@pytest.mark.stochastic
def test_fedforge(tmp_path: Path, jax_compile_cache: Path) -> None:
    steps = list(run_tutorial("fedforge", tmp_path))
    assert [s.words[:2] for s in steps] == [["psfl", "synth"], ["psfl", "report"]]
    run = tmp_path / "run"
    m = _json(run / "metrics.json")
    assert m["dataset"] == "adult" and m["parties"] == 10 and m["epsilon"] == 1.0
    assert sorted(m["epsilon_spent"]) == [f"p{i:03d}" for i in range(10)]
    assert all(0.9 <= e <= 1.0 + 1e-9 for e in m["epsilon_spent"].values())
    assert m["avg_tv"] > 0.0 and m["ml_utility"] is not None
    below(m["avg_tv"], 0.3, "avg TV")
    # "as many rows as the parties hold, in the table's own values"
    assert _csv_rows(run / "synthetic.csv") == sum(m["rows"].values())
    header = (run / "synthetic.csv").read_text().splitlines()[0].split(",")
    assert "income" in header and "fnlwgt" not in header
    for f in ("events.jsonl", "config.toml", "schema.json", "broker.addr",
              "data/train.parquet", "data/holdout.parquet", "data/parties/p009.parquet",
              "stages/checkpoint.json"):
        assert (run / f).is_file(), f
    for png in ("stage_timeline.png", "tv_per_marginal.png", "privacy_budget.png"):
        _png(run / "plots" / png)


def _synth_run_dir(out: Path) -> None:
    """What across-hosts.md's by-hand FedForge run takes from a ``psfl synth run``
    directory (config.toml, schema.json, data/parties/), laid out as that command does
    before it starts any process: adult, K = 10, the fedforge tutorial's quick settings."""
    from sim.launch.synth import prepare_data
    from synth.config import DataSection, EngineSection, SynthConfig, dump_synth_config

    cfg = SynthConfig(dataset="adult", parties=10, epsilon=1.0, engine=EngineSection(iters=100),
                      data=DataSection(drop_columns=SYNTH_QUICK_DROP))
    cfg, _ = prepare_data(cfg, out)
    (out / "config.toml").write_text(dump_synth_config(cfg))


def test_across_hosts(tmp_path: Path, jax_compile_cache: Path) -> None:
    text = (TUTORIALS / "across-hosts.md").read_text()
    inline = re.search(r'`(python -c "from synth\.protocol[^`]*)`\s*prints `([^`]*)`', text)
    assert inline, "the aggregator ids' one-liner is gone from across-hosts.md"
    res = subprocess.run([sys.executable, *shlex.split(inline.group(1))[1:]], cwd=tmp_path,
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip() == inline.group(2), res.stderr
    _synth_run_dir(tmp_path / "RUN")
    steps = list(run_tutorial("across-hosts", tmp_path))
    # PubSub-VFL by hand: the active party's metrics.json, the passive party's passive.json
    m = _json(tmp_path / "runC" / "metrics.json")
    assert m["security"]["transport"] == "curve" and m["security"]["identity"] == "active"
    assert m["epochs"] == 1 and 0.8 < m["test_auc"] <= 1.0 and m["wall_s"] > 0
    for d, f in (("runB", "passive.json"), ("runB", "config.toml"), ("runC", "config.toml")):
        assert (tmp_path / d / f).is_file(), f"{d}/{f}"
    assert any(s.starts_with("psfl vfl party --role active") and "test_auc" in s.stdout
               for s in steps)
    assert any(s.starts_with("psfl vfl party --role passive") and "passive party done" in s.stdout
               for s in steps)
    # FedForge by hand: every party's ledger, synthetic rows, no quality stage
    m = _json(tmp_path / "out" / "metrics.json")
    assert sorted(m["epsilon_spent"]) == [f"p{i:03d}" for i in range(10)]
    assert all(0.9 <= e <= 1.0 + 1e-9 for e in m["epsilon_spent"].values())
    assert m["avg_tv"] is None  # "Without --eval-dir the coordinator skips the quality stage"
    assert _csv_rows(tmp_path / "out" / "synthetic.csv") == sum(m["rows"].values())
    coord = next(s for s in steps if s.words[:4] == ["python", "-m", "synth", "coordinator"])
    assert "quality skipped" in coord.stdout + coord.stderr
    assert sum(s.starts_with("psfl broker run") for s in steps) == 2


# ------------------------------------------------------------------ across hosts, for real


def _host_env(bin_dir: Path) -> dict[str, str]:
    env = _env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def _shims(bin_dir: Path) -> Path:
    """``psfl`` and ``python`` as this checkout's (the console script without
    ``sys.path``'s working directory, as installed)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, cmd in (("psfl", f"exec {shlex.quote(sys.executable)} -P -m sim.cli \"$@\""),
                      ("python", f"exec {shlex.quote(sys.executable)} \"$@\"")):
        f = bin_dir / name
        f.write_text(f"#!/bin/sh\n{cmd}\n")
        f.chmod(0o755)
    return bin_dir


@dataclass
class HostStep:
    where: str
    host: str  # "" = the setup machine
    line: str
    stdout: str
    stderr: str


def _host_popen(hosts: Any, host: str, line: str, env: dict[str, str], out: Any, err: Any,
                cwd: Path) -> subprocess.Popen[bytes]:
    argv = ["sh", "-c", "exec " + line]
    return subprocess.Popen(hosts.argv(host, argv) if host else argv, cwd=cwd, env=env,
                            stdout=out, stderr=err, start_new_session=True)


def _stop_group(proc: subprocess.Popen[Any]) -> None:
    """Stop a process started in its own session, and whatever it started."""
    import signal

    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _host_block(block: Block, text: str, work: Path, hosts: Any, env: dict[str, str],
                on_broker: Any) -> list[HostStep]:
    d = block.directive
    assert d is not None
    lines = logical_lines(text)
    names = list(d.hosts) * len(lines) if len(d.hosts) == 1 else list(d.hosts)
    assert len(names) == len(lines), f"{block.where}: {len(d.hosts)} hosts, {len(lines)} commands"
    assert set(names) <= set(hosts.hosts), f"{block.where}: unknown host in {names}"
    procs: list[tuple[str, str, subprocess.Popen[bytes], Any, Any]] = []
    broker = None
    try:
        if d.together:
            assert lines[0].startswith("psfl broker run"), f"{block.where}: broker first"
            ready = work / names[0] / "broker.ready"
            ready.unlink(missing_ok=True)
            log = tempfile.TemporaryFile()
            line0 = lines[0].split("#")[0].strip() + " --ready-file broker.ready"
            broker = _host_popen(hosts, names[0], line0, env, log, subprocess.STDOUT, work)
            deadline = time.monotonic() + 60
            while not (ready.exists() and ready.read_text().strip()):
                if broker.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"{block.where}: the broker did not start\n{_read(log)[-3000:]}")
                time.sleep(0.05)
            on_broker()
            todo = list(zip(names[1:], lines[1:], strict=True))
        else:
            todo = list(zip(names, lines, strict=True))
        steps = []
        for i, (host, line) in enumerate(todo):
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            procs.append((host, line, _host_popen(hosts, host, line, env, out, err, work),
                          out, err))
            if not d.together:  # one after another
                _wait_host(procs[-1], block.where, steps)
        if d.together:
            for p in procs:
                _wait_host(p, block.where, steps)
        return steps
    finally:
        for _, _, proc, out, err in procs:
            _stop_group(proc)
            out.close()
            err.close()
        if broker is not None:
            _stop_group(broker)


def _wait_host(p: tuple[str, str, subprocess.Popen[bytes], Any, Any], where: str,
               steps: list[HostStep]) -> None:
    host, line, proc, out, err = p
    try:
        proc.wait(COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: `{line}` on {host} ran past {COMMAND_TIMEOUT_S:.0f} s\n"
                    f"{_read(err)[-3000:]}")
    _check(where, f"{line} (on {host or 'the setup machine'})", proc.returncode, _read(out),
           _read(err))
    steps.append(HostStep(where, host, line, _read(out), _read(err)))


def run_tutorial_on_hosts(name: str, work: Path, hosts: Any, bin_dir: Path,
                          on_broker: Any) -> list[HostStep]:
    """Run the tutorial ``name`` with its ``hosts:`` blocks on ``hosts``
    (:class:`sim.launch.hosts.NamespaceHosts` over ``work``); the other blocks run in
    ``work``, the setup machine. ``on_broker()`` runs once each block's broker listens."""
    env = _host_env(bin_dir)
    steps: list[HostStep] = []
    for block in page_blocks(TUTORIALS / f"{name}.md"):
        d = block.directive
        if d is None or d.action == "skip":
            continue
        text = block.text
        for old, new in d.subs:
            text, hits = substitute(text, old, new)
            assert hits, f"{block.where}: `{old} =>` matches nothing (stale directive)"
        if d.action == "file":
            (work / d.path).write_text(text)
        elif d.hosts:
            steps += _host_block(block, text, work, hosts, env, on_broker)
        else:
            for line in logical_lines(text):
                out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
                try:
                    p = ("", line, _host_popen(hosts, "", line, env, out, err, work), out, err)
                    _wait_host(p, block.where, steps)
                finally:
                    out.close()
                    err.close()
    return steps


def _probe(hosts: Any, host: str, code: str) -> str:
    res = subprocess.run(hosts.argv(host, [sys.executable, "-c", code]), capture_output=True,
                         text=True, timeout=60, env=_env())
    assert res.returncode == 0, f"probe on {host}: {res.stderr[-2000:]}"
    return res.stdout


@pytest.mark.cross_host
@pytest.mark.stochastic
def test_bank_and_partner(tmp_path: Path) -> None:
    """The tutorial across three hosts made of network namespaces: each organisation's
    commands in its own namespace (its own address) and directory."""
    from sim.launch.hosts import NamespaceHosts, namespaces_unavailable

    why = namespaces_unavailable()
    if why:
        pytest.skip(f"cross-host test needs network namespaces: {why}")
    page = (TUTORIALS / "bank-and-partner.md").read_text()
    broker_ip = re.search(r'broker = "tcp://([\d.]+):5555"', page)
    assert broker_ip, "the job file's broker address is gone from the tutorial"
    net = broker_ip.group(1).rsplit(".", 1)[0]
    addrs = {"broker": broker_ip.group(1), "partner": f"{net}.2", "bank": f"{net}.3"}
    assert len(set(addrs.values())) == 3
    work = tmp_path / "w"
    work.mkdir()
    probes: list[dict[str, str]] = []

    def on_broker() -> None:  # while the broker listens (its control port, base + 2)
        for host in ("partner", "bank"):
            probes.append({"host": host, "out": _probe(hosts, host, (
                "import socket, os\n"
                "def reach(a):\n"
                "    try:\n"
                "        socket.create_connection((a, 5557), timeout=3).close(); return 'open'\n"
                "    except OSError as e: return type(e).__name__\n"
                f"print('loopback', reach('127.0.0.1'), 'broker', reach({addrs['broker']!r}))\n"
                "print('sees', sorted(os.listdir('..')))\n"))})

    with NamespaceHosts(work, addrs) as hosts:
        steps = run_tutorial_on_hosts("bank-and-partner", work, hosts,
                                      _shims(tmp_path / "bin"), on_broker)
    # the hosts: the broker reachable only at its address, each host seeing its own files
    assert len(probes) == 4, probes
    for p in probes:
        assert "loopback ConnectionRefusedError broker open" in p["out"], p
        assert f"sees ['{p['host']}']" in p["out"], p  # no other host's directory
    # the partner's schema, drafted from its file alone: the date and the merchant ID kept
    schema = (work / "partner" / "partner-schema.toml").read_text()
    assert "[columns.last_purchase]" in schema and 'kind = "date"' in schema
    assert "[columns.merchant_id]" in schema and 'kind = "hashed"' in schema
    assert "customer_id" not in schema.split("description")[1]
    # alignment: both sides found the same shared customers
    a = _json(work / "bank" / "run" / "align" / "align-active.json")
    b = _json(work / "partner" / "run" / "align" / "align-passive.json")
    assert a["n_shared"] == b["n_shared"] == 1800 and a["n_own"] == b["n_own"] == 2000
    # training over CURVE, DP on the partner's records, every partner column used
    m = _json(work / "bank" / "run" / "metrics.json")
    assert m["security"]["transport"] == "curve" and m["dp"]["enabled"]
    assert m["dp"]["target_mu"] == 8.0 and m["test_auc"] <= 1.0
    above(m["test_auc"], 0.55, "cross-host DP test AUC (quick: 2,000 customers, 2 epochs)")
    assert m["active_only"] is not None
    passive = m["parties"]["passive"]
    assert sorted(passive["columns"]) == sorted(["last_purchase", "merchant_id", "spend_90d",
                                                 "visits_90d", "channel"])
    bank_line = next(s for s in steps if s.host == "bank" and "vfl party" in s.line)
    assert "bank (active): job bank-partner (digest" in bank_line.stdout
    partner_line = next(s for s in steps if s.host == "partner" and "vfl party" in s.line)
    digest = re.search(r"digest (\w+)", bank_line.stdout)
    assert digest and f"digest {digest.group(1)}" in partner_line.stdout
    # prediction: the shared new customers, scored
    pred = work / "bank" / "pred" / "predictions.csv"
    assert _csv_rows(pred) == 450
    p = _json(work / "bank" / "pred" / "predict.json")
    assert p["rows"] == 450 and p["metric"] <= 1.0
    above(p["metric"], 0.55, "cross-host prediction AUC on new customers")
    assert not (work / "partner" / "pred" / "predictions.csv").exists()  # the bank's alone
