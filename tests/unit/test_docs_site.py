"""The documentation site (mkdocs.yml, docs/) stays honest.

- ``mkdocs build --strict`` succeeds: every page is in the nav, every link and anchor
  resolves, every generated part is generated (docs/gen_ref.py), and the Python API's
  docstrings parse.
- The generated reference covers every ``psfl`` command and option and every config key.
- Every ``psfl ...`` command in a fenced code block of README.md, CONTRIBUTING.md and
  docs/ parses with the real parser (``sim.cli.build_parser``; parsed, never run).
- Every ``docs/....md`` path a tracked file cites exists.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from functools import cache
from pathlib import Path

import pytest

from tests.mdblocks import fenced_blocks

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: fenced code blocks in these languages hold shell commands ("" = no language given)
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "zsh"}
SEPARATORS = {"&&", "||", ";", "|", "&"}
REDIRECTS = {">", ">>", "<", "2>", "2>&1", "&>"}
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@cache
def gen_ref():
    """docs/gen_ref.py, the mkdocs hook that generates the reference parts."""
    spec = importlib.util.spec_from_file_location("docs_gen_ref", DOCS / "gen_ref.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their module
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]


# ------------------------------------------------------------------ the build


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        pytest.importorskip(module)
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{log[-6000:]}"
    built = {p.relative_to(site).as_posix(): p.read_text() for p in site.rglob("*.html")}
    left = [name for name, html in built.items() if "<!-- generated:" in html]
    assert not left, f"unexpanded generated parts in {left}"
    cli = built["reference/cli/index.html"]
    assert "psfl vfl run" in cli and "--plan-pilots" in cli
    config = built["reference/config/index.html"]
    assert "[vfl.dp]" in config and "predict_max_releases" in config and "max_subscriptions_per_identity" in config
    api = built["reference/python-api/index.html"]
    assert "VflJob" in api and "FedForge" in api and "run_predict" in api


# ------------------------------------------------------- the generated reference


def _walk(parser: argparse.ArgumentParser, words: tuple[str, ...]):
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*words, name))


def test_cli_reference_covers_every_command_and_option() -> None:
    from sim.cli import build_parser

    text = gen_ref().cli_reference()
    headings = {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}
    commands = list(_walk(build_parser(), ("psfl",)))
    assert len(commands) > 20
    for words, parser in commands:
        assert " ".join(words) in headings, f"no section for {' '.join(words)!r}"
        section = text.split(f" {' '.join(words)}\n", 1)[1].split("\n#", 1)[0]
        for action in parser._actions:
            for opt in action.option_strings:
                if opt not in ("-h", "--help"):
                    assert f"`{opt}" in section, f"{' '.join(words)}: {opt} not documented"
            if not action.option_strings and action.help and not isinstance(
                    action, argparse._SubParsersAction):
                assert action.dest in section or str(action.metavar) in section


def test_config_reference_covers_every_key_with_its_default() -> None:
    g = gen_ref()
    text = g.config_reference()
    specs = list(g.CONFIG_TABLES)
    for spec in specs:
        cls = g._load(spec.cls)
        assert f"# `{spec.heading}`" in text
        nested = g._nested_tables(spec)  # [synth.aim] ...: a row here, a table of its own
        specs += nested.values()
        for old, new in getattr(cls, "MOVED_KEYS", {}).items():  # the old key -> new key table
            base = spec.heading.strip("[]")
            assert f"| `{base}.{old}` | `{base}.{new}` |" in text
        for f in dataclasses.fields(cls):
            key = spec.keys.get(f.name, f.name)
            if f.name in nested:
                assert f"| `{nested[f.name].heading}` | table |" in text
            elif key and key == f.name:
                default = (f.default if f.default is not dataclasses.MISSING
                           else f.default_factory() if f.default_factory is not dataclasses.MISSING
                           else None)
                shown = "required" if default is None and f.default is dataclasses.MISSING \
                    and f.default_factory is dataclasses.MISSING else g.toml_value(default)
                row = f"| `{key}` | `{f.type}` | "
                assert row in text, f"{spec.cls}: no row for {key!r}"
                assert f"{row}`{shown}` |" in text or f"{row}{shown} |" in text, \
                    f"{spec.cls}.{key}: default {shown!r} not shown"
            elif key:
                assert f"`{key}`" in text


def test_a_config_field_without_a_docstring_entry_fails_the_build() -> None:
    g = gen_ref()

    fake = types.ModuleType("docs_site_fake_config")
    fake.Undocumented = dataclasses.make_dataclass(
        "Undocumented", [("documented", int, dataclasses.field(default=1)),
                         ("forgotten", int, dataclasses.field(default=2))],
        namespace={"__doc__": "Settings.\n\n    Attributes:\n        documented: has its "
                              "entry.\n"}, frozen=True)
    sys.modules[fake.__name__] = fake  # importable by gen_ref._load
    try:
        assert g.docstring_entries(fake.Undocumented) == {"documented": "has its entry."}
        spec = g.ConfigTable(heading="[x]", cls=f"{fake.__name__}:Undocumented", intro="")
        with pytest.raises(g.GenerationError, match="forgotten"):
            g.config_fields(spec)
    finally:
        del sys.modules[fake.__name__]
    with pytest.raises(g.GenerationError, match="unknown generated part"):
        g.expand("<!-- generated: no-such-part -->\n<!-- end generated: no-such-part -->\n")
    with pytest.raises(g.GenerationError, match="without their"):
        g.expand("<!-- generated: cli -->\ntext\n")


def test_the_committed_reference_pages_are_what_the_code_generates() -> None:
    """The generated blocks are committed (readable on GitHub and in a checkout without a
    site build); each must be what the code generates now."""
    g = gen_ref()
    pages = g.generated_pages()
    assert {p.name for p in pages} >= {"cli.md", "config.md", "exit-codes.md",
                                       "wire-format.md"}
    stale = [str(p.relative_to(ROOT)) for p in g.stale_pages()]
    assert not stale, f"stale generated pages {stale}: run python docs/gen_ref.py --write"
    config = (DOCS / "reference" / "config.md").read_text()
    assert "| `max_reassign` |" in config and "## `[vfl]`" in config  # a body, not a marker


def test_a_stale_block_is_detected(tmp_path: Path) -> None:
    g = gen_ref()
    page = DOCS / "reference" / "exit-codes.md"
    text = page.read_text()
    assert g.expand(text) == text
    stale = text.replace("BROKER_UNREACHABLE", "BROKER_GONE", 1)
    assert stale != text and g.expand(stale) == text  # regenerated back, so detected
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "page.md").write_text(stale)
    assert g.stale_pages(docs) == [docs / "page.md"]
    assert g.write_pages(docs) == [docs / "page.md"] and g.stale_pages(docs) == []
    assert (docs / "page.md").read_text() == text


def test_the_wire_format_example_is_the_codec_s_own_output() -> None:
    text = gen_ref().wire_format()
    from pubsub import codec

    assert f"| `VERSION` | `{codec.VERSION}` |" in text
    assert "A message, byte by byte" in text and "inline payload" in text


# ------------------------------------------------------------ psfl commands


def _blocks(path: Path):
    """``(first line number, text)`` of each fenced shell code block of ``path``."""
    for start, lang, body in fenced_blocks(path.read_text().splitlines()):
        if lang in SHELL_LANGS:
            yield start + 2, body


def _logical_lines(start: int, body: list[str]):
    """Lines with their ``\\`` continuations joined, and a ``$ `` prompt dropped."""
    buf, first = "", start
    for n, line in enumerate(body, start):
        if not buf:
            first = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        text = (buf + line).strip()
        buf = ""
        if text.startswith("$ "):
            text = text[2:]
        if text:
            yield first, text


def _variants(tokens: list[str]) -> list[list[str]]:
    """A command with optional ``[...]`` groups (alternatives split by ``|``) as argv
    variants: every group left out; every group in (first alternatives); and each
    alternative of each group alone."""
    items: list[object] = []
    group: list[list[str]] | None = None
    for tok in tokens:
        if group is None and tok.startswith("[") and tok != "[":
            group = [[]]
            tok = tok[1:]
        if group is None:
            items.append(tok)
            continue
        closes = tok.endswith("]")
        tok = tok[:-1] if closes else tok
        if tok == "|":
            group.append([])
        elif tok:
            group[-1].append(tok)
        if closes:
            items.append(group)
            group = None
    if group is not None:
        items.append(group)  # an unclosed bracket: the parser will say what is wrong

    def build(choice) -> list[str]:
        out: list[str] = []
        for k, item in enumerate(items):
            if isinstance(item, str):
                out.append(item)
            else:
                alt = choice(k, item)
                if alt is not None:
                    out += item[alt]
        return out

    groups = [k for k, item in enumerate(items) if not isinstance(item, str)]
    variants = [build(lambda k, g: None), build(lambda k, g: 0)]
    for k in groups:
        for a in range(len(items[k])):
            variants.append(build(lambda j, g, k=k, a=a: a if j == k else None))
    unique = []
    for v in variants:
        if v not in unique:
            unique.append(v)
    return unique


def _commands(text: str) -> list[list[str]]:
    """The ``psfl`` commands of one logical shell line, as token lists (after ``psfl``);
    a ``|`` inside an optional ``[...]`` group separates alternatives, not commands."""
    tokens = shlex.split(text, comments=True)
    commands, current, depth = [], [], 0
    for tok in tokens + [";"]:
        if depth == 0 and tok in SEPARATORS:
            commands.append(current)
            current = []
            continue
        if tok.startswith("[") and tok != "[":
            depth += 1
        if tok.endswith("]") and depth:
            depth -= 1
        current.append(tok)
    out = []
    for cmd in commands:
        cleaned, skip_next = [], False
        for tok in cmd:
            if skip_next:
                skip_next = False
            elif tok in REDIRECTS:
                skip_next = True
            elif not tok.startswith((">", "2>")):
                cleaned.append(tok)
        while cleaned and ENV_ASSIGNMENT.match(cleaned[0]):
            cleaned.pop(0)
        if cleaned and cleaned[0] == "psfl":
            out.append(cleaned[1:])
    return out


@cache
def documented_commands() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``(where, argv)`` of every ``psfl`` command variant in the docs' shell blocks;
    a variant with an elided part (a bare ``...``) is left out."""
    found = []
    for page in _pages():
        for start, body in _blocks(page):
            for line_no, text in _logical_lines(start, body):
                for argv in _commands(text):
                    for variant in _variants(argv):
                        if "..." in variant:
                            continue
                        where = f"{page.relative_to(ROOT)}:{line_no}"
                        found.append((where, tuple(variant)))
    return tuple(found)


def test_the_docs_show_many_psfl_commands() -> None:
    cmds = documented_commands()
    assert len(cmds) > 80
    assert {argv[0] for _, argv in cmds} >= {"demo", "vfl", "synth", "sim", "broker", "keys",
                                             "report"}


@pytest.mark.parametrize("where, argv", documented_commands(),
                         ids=lambda v: v if isinstance(v, str) else " ".join(v)[:60])
def test_documented_psfl_command_parses(where: str, argv: tuple[str, ...]) -> None:
    from sim.cli import build_parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(list(argv))
        except SystemExit as exc:
            if exc.code not in (0, None):
                pytest.fail(f"{where}: `psfl {shlex.join(argv)}` does not parse: "
                            f"{err.getvalue().strip().splitlines()[-1]}")


def test_the_command_extraction_handles_shell_syntax() -> None:
    line = ("FOO=1 psfl vfl run --dataset bank --out R [--set a=1 | --quick] "
            "&& psfl report R > log.txt  # a comment")
    cmds = _commands(line)
    assert cmds[1] == ["report", "R"]
    assert _variants(cmds[0]) == [
        ["vfl", "run", "--dataset", "bank", "--out", "R"],
        ["vfl", "run", "--dataset", "bank", "--out", "R", "--set", "a=1"],
        ["vfl", "run", "--dataset", "bank", "--out", "R", "--quick"]]
    body = ["psfl vfl run --dataset bank \\", "    --out R   # trailing", "", "echo hi"]
    joined = "psfl vfl run --dataset bank      --out R   # trailing"
    assert list(_logical_lines(10, body)) == [(10, joined), (13, "echo hi")]


# --------------------------------------------------------- cited docs paths


def _tracked(*patterns: str) -> list[Path]:
    if shutil.which("git") is None:
        pytest.skip("git is not available")
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *patterns], cwd=ROOT,
                             capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")
    return [ROOT / n for n in out.decode().split("\0") if n and (ROOT / n).is_file()]


#: A repository path as files cite it: a top-level directory, then a file name with an
#: extension (a placeholder segment such as ``NAME`` or ``<name>`` is not a path).
CITED_PATH = re.compile(
    r"(?<![\w/.-])((?:pubsub|broker|parties|synth|sim|tests|bench|docs|examples|\.ci)"
    r"/[\w./-]*\w\.(?:py|md|toml|json|csv|gz|parquet|yml|yaml|sh|txt))(?![\w*<])")


def test_docs_paths_cited_in_the_repository_exist() -> None:
    cited = re.compile(r"(?<![\w/.-])docs/\w[\w/.-]*?\.md\b")
    missing = []
    for path in _tracked("*.py", "*.md", "*.toml", "*.yml", "*.cfg", "*.txt"):
        if path.name == "CHANGELOG.md":
            continue  # history, left as written
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for ref in cited.findall(line):
                if not (ROOT / ref).is_file():
                    missing.append(f"{path.relative_to(ROOT)}:{lineno}: {ref}")
    assert not missing, "cited docs pages that do not exist:\n" + "\n".join(missing)


def test_every_repository_path_cited_exists() -> None:
    """Docstrings, comments, docs and configs cite only files the repository has (tests
    are left out: their fixtures name files they create)."""
    missing = []
    for path in _tracked("*.py", "*.md", "*.toml", "*.yml", "*.cfg", "*.txt"):
        rel = path.relative_to(ROOT).as_posix()
        if path.name == "CHANGELOG.md" or rel.startswith(("tests/", "docs/benchmarks/data/")):
            continue  # history as written; fixtures; recorded bench commands
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for ref in CITED_PATH.findall(line):
                if "/NAME." not in ref and not (ROOT / ref).exists():
                    missing.append(f"{rel}:{lineno}: {ref}")
    assert not missing, "cited paths that do not exist:\n" + "\n".join(missing)


def test_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
