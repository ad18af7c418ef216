"""Reference pages generated from the code, committed with the docs and refreshed by
this script (also the mkdocs hook, ``hooks:`` in mkdocs.yml).

A page under ``docs/`` holds its hand-written text and, where a generated part belongs, a
block between two marker lines::

    <!-- generated: NAME (written by docs/gen_ref.py from the code; do not edit) -->
    ...
    <!-- end generated: NAME -->

whose body is :data:`GENERATORS` ``[NAME]()``, built from the code of this checkout: the
``psfl`` parser (:func:`sim.cli.build_parser`), the config dataclasses, the exit-code
tables, the wire codec and the broker's topic policy. The bodies are committed, so the
pages read whole on GitHub and in a checkout without a site build; a test
(``tests/unit/test_docs_site.py``) fails when a committed body differs from what the code
generates now. When the site builds, :func:`on_page_markdown` regenerates every body. An
unknown block name, a block without its end line, or a config field without a docstring
entry is an error.

``python docs/gen_ref.py --write`` refreshes every page; ``--check`` lists the stale ones
(exit 1); ``python docs/gen_ref.py PAGE.md`` prints a page with its blocks regenerated.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # this checkout's packages, not an installed copy

START = re.compile(r"^<!-- generated: ([a-z0-9-]+)\b[^\n]*-->[ \t]*$", re.M)
_MARKER_LINE = re.compile(r"^<!-- (?:end )?generated: [a-z0-9-]+\b[^\n]*-->[ \t]*\n?", re.M)
BLOCK = re.compile(r"^(<!-- generated: ([a-z0-9-]+)\b[^\n]*-->)[ \t]*\n(.*?)"
                   r"^(<!-- end generated: \2 -->)[ \t]*$", re.M | re.S)
_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj):`~?([^`]+)`")
USAGE_WIDTH = 88


class GenerationError(RuntimeError):
    """A page asks for a generator that does not exist, or the code lacks what a
    generated page must show (a config field without a docstring entry)."""


# --------------------------------------------------------------------------- helpers


def rst_to_md(text: str) -> str:
    """Docstring markup to Markdown: Sphinx roles and ````x```` become code spans."""
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    return text.replace("``", "`")


def cell(text: str) -> str:
    """``text`` for a Markdown table cell: one line; ``|``, ``<``, ``>``, ``*``, ``_``
    and ``[`` escaped outside code spans (code spans are kept as they are)."""
    text = " ".join(text.split())
    out, pos = [], 0
    for m in _CODE.finditer(text):
        out.append(_escape(text[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_escape(text[pos:]))
    return "".join(out)


def _escape(text: str) -> str:
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")
    text = text.replace("_", "\\_").replace("[", "\\[")
    return text.replace("<", "&lt;").replace(">", "&gt;")


def code(text: str) -> str:
    """``text`` as one inline code span (backticks inside are fenced with more)."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; cells are used as given (escape them with :func:`cell`)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def docstring_entries(obj: Any) -> dict[str, str]:
    """The ``Attributes:`` (or ``Args:``) section of ``obj``'s docstring: entry name ->
    its text, one line, Markdown. ``a / b: text`` gives both names the text."""
    lines = (inspect.getdoc(obj) or "").splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.strip() in ("Attributes:", "Args:")), None)
    out: dict[str, str] = {}
    if start is None:
        return out
    names: list[str] = []
    for line in lines[start + 1:]:
        if line and not line.startswith(" "):
            break  # the next section
        m = re.match(r"^ {4}(\S[^:]*?):(?:\s+(.*))?$", line)
        if m:
            names = [n.strip() for n in m.group(1).split("/")]
            for n in names:
                out[n] = m.group(2) or ""
        elif names and line.strip():
            for n in names:
                out[n] += " " + line.strip()
    return {k: rst_to_md(v.strip()) for k, v in out.items()}


# ----------------------------------------------------------------------- the CLI


def _subcommands(parser: argparse.ArgumentParser
                 ) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """``(name, parser, help)`` of each subcommand of ``parser``, in parser order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, p, helps.get(name, "")) for name, p in action.choices.items()]
    return []


def _walk(parser: argparse.ArgumentParser, words: tuple[str, ...], help_text: str
          ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    yield words, parser, help_text
    for name, sub, sub_help in _subcommands(parser):
        yield from _walk(sub, (*words, name), sub_help)


def _usage(parser: argparse.ArgumentParser) -> str:
    """A synopsis of the command: its name, ``[OPTIONS]`` when it has optional ones, its
    required options and its positional arguments. Built here rather than by argparse,
    whose usage lines wrap differently from one Python version to the next (the committed
    page must not depend on the version that wrote it); the table below lists every
    option."""
    words = [parser.prog]
    grouped = {id(a) for g in parser._mutually_exclusive_groups if g.required
               for a in g._group_actions}
    optional = [a for a in parser._actions if a.option_strings
                and not isinstance(a, argparse._HelpAction)]
    if any(not a.required and id(a) not in grouped for a in optional):
        words.append("[OPTIONS]")
    for g in parser._mutually_exclusive_groups:
        if g.required:
            words.append("(" + " | ".join(_option_word(a) for a in g._group_actions) + ")")
    words += [_option_word(a) for a in optional if a.required and id(a) not in grouped]
    for a in parser._actions:
        if a.option_strings:
            continue
        if isinstance(a, argparse._SubParsersAction):
            words.append("COMMAND ...")
            continue
        name = str(a.metavar or a.dest)
        words.append({"?": f"[{name}]", "*": f"[{name} ...]", "+": f"{name} [{name} ...]",
                      argparse.REMAINDER: "..."}.get(a.nargs, name))  # type: ignore[arg-type]
    return "usage: " + " ".join(words)


def _option_word(action: argparse.Action) -> str:
    """A required option as the synopsis shows it: its longest spelling and metavar."""
    flag = max(action.option_strings, key=len)
    if action.nargs == 0:
        return flag
    return f"{flag} {action.metavar or action.dest.upper()}"


def _option_row(parser: argparse.ArgumentParser, action: argparse.Action) -> list[str]:
    fmt = parser.formatter_class(prog=parser.prog)
    name = ", ".join(action.option_strings) if action.option_strings else (
        action.metavar or action.dest)
    if action.nargs == 0:
        value = "flag"
    elif action.choices is not None:
        value = " \\| ".join(code(str(c)) for c in action.choices)
    else:
        metavar = action.metavar or (action.dest.upper() if action.option_strings
                                     else action.dest)
        value = code(str(metavar))
        if action.nargs == argparse.REMAINDER:
            value += " (the rest of the line)"
        elif action.nargs in ("+", "*"):
            value += " …"
    if isinstance(action, argparse._AppendAction):
        value += ", repeatable"
    if action.required:
        default = "required"
    elif action.default in (None, False, [], argparse.SUPPRESS) or action.nargs == 0:
        default = ""
    else:
        default = code(str(action.default))
    help_text = fmt._expand_help(action) if action.help else ""
    return [code(name), value, default, cell(help_text)]


def cli_reference() -> str:
    """Every ``psfl`` command: its help, usage and options, from :func:`sim.cli.build_parser`."""
    from sim.cli import build_parser

    parser = build_parser()
    parts: list[str] = []
    for words, p, help_text in _walk(parser, ("psfl",), parser.description or ""):
        depth = min(len(words), 4)
        parts.append(f"{'#' * (depth + 1)} {' '.join(words)}")
        if help_text:
            text = help_text[0].upper() + help_text[1:].rstrip()
            parts.append(cell(text if text.endswith((".", ")")) else text + "."))
        parts.append("```text\n" + _usage(p) + "\n```")
        subs = _subcommands(p)
        if subs:
            parts.append(table(["command", "what it does"],
                               [[code(" ".join((*words, n))), cell(h)] for n, _, h in subs]))
        rows = [_option_row(p, a) for a in p._actions
                if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]
        if rows:
            parts.append(table(["argument", "value", "default", "meaning"], rows))
    return "\n\n".join(parts)


# --------------------------------------------------------------------- configs


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConfigTable:
    """One TOML table of a config file and the dataclass that reads it.

    Attributes:
        heading: the table as written in TOML (the section's heading).
        cls: ``module:ClassName`` of the frozen dataclass.
        intro: a sentence on where the table is read.
        keys: fields written under another name in TOML (a nested table, say): field ->
            what to show as the key.
    """

    heading: str
    cls: str
    intro: str
    keys: dict[str, str] = dataclasses.field(default_factory=dict)


CONFIG_TABLES: tuple[ConfigTable, ...] = (
    ConfigTable(heading="[vfl]", cls="parties.config:VflConfig",
                intro="PubSub-VFL runs: `psfl demo`, `psfl vfl run|party|profile|plan|schema`, "
                      "the `[vfl]` table of a `psfl sim run` scenario, "
                      "`sim.api.VflJob(config=...)`."),
    ConfigTable(heading="[synth]", cls="synth.config:SynthConfig",
                intro="FedForge runs: `psfl synth run`, `python -m synth ...`, the `[synth]` "
                      "table of a consortium scenario, `sim.fedforge.FedForge(config=...)`."),
    ConfigTable(heading="[scenario]", cls="sim.cluster.scenario:Scenario",
                intro="A `psfl sim run` scenario file (beside its `[vfl]` table).",
                keys={"active": "[scenario.active], [scenario.passive]", "passive": "",
                      "more": "[scenario.passive2] … [scenario.passive9]",
                      "faults": "[[scenario.faults]]"}),
    ConfigTable(heading="[scenario.active], [scenario.passive], [scenario.passive2] …",
                cls="sim.cluster.scenario:PartySpec", intro="One party's resources in a scenario.",
                keys={"link": "[scenario.PARTY.link]"}),
    ConfigTable(heading="[scenario.PARTY.link]", cls="sim.cluster.scenario:LinkConfig",
                intro="A party's shaped link to the broker (also the `link` inline table "
                      "of a consortium site)."),
    ConfigTable(heading="[[scenario.faults]]", cls="sim.cluster.scenario:FaultSpec",
                intro="One scheduled fault of a scenario."),
    ConfigTable(heading="[consortium]", cls="sim.cluster.consortium:Consortium",
                intro="A `psfl sim run` consortium scenario (beside its `[synth]` table).",
                keys={"parties": "[[consortium.parties]]", "offline": "[consortium.offline]",
                      "workload_update": "[consortium.workload_update]",
                      "kill_coordinator": "[consortium.kill_coordinator]"}),
    ConfigTable(heading="[[consortium.parties]]", cls="sim.cluster.consortium:SiteSpec",
                intro="One consortium site, in party order (`p000` first).",
                keys={"link": "link = { ... }"}),
    ConfigTable(heading="[consortium.offline]", cls="sim.cluster.consortium:OfflineSpec",
                intro="A site that goes away for a while."),
    ConfigTable(heading="[consortium.workload_update]", cls="sim.cluster.consortium:WorkloadUpdateSpec",
                intro="New queries handed in while the run goes."),
    ConfigTable(heading="[consortium.kill_coordinator]", cls="sim.cluster.consortium:KillSpec",
                intro="A kill -9 of the coordinator and its restart with `--resume`."),
    ConfigTable(heading="[job]", cls="parties.config.job:JobSection",
                intro="A cross-organisation run's job file (`job.toml`, beside `[vfl]`; "
                      "`psfl vfl party|schema|predict --job FILE --data OWN_FILE`): who takes "
                      "part and where they meet. Each party gives its own data file on its "
                      "command line."),
    ConfigTable(heading="[broker]", cls="broker.proxy:BrokerConfig",
                intro="`psfl broker run --config FILE` and `--set broker.KEY=VALUE` (its "
                      "other options set `bind`, `keys_dir`, `policy_file`, `members_file`)."),
)


def _load(spec: str) -> type:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def toml_value(value: Any) -> str:
    """A default as TOML would write it (``None``: unset)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def config_fields(table_spec: ConfigTable) -> list[tuple[str, str, str, str]]:
    """``(key, type, default, description)`` of every field of the table's dataclass.

    Raises:
        GenerationError: a field has no entry in the class docstring.
    """
    cls = _load(table_spec.cls)
    docs = docstring_entries(cls)
    nested = _nested_tables(table_spec)
    rows = []
    for f in dataclasses.fields(cls):
        if f.name not in docs:
            raise GenerationError(f"{table_spec.cls}: field {f.name!r} has no entry in the "
                                  "docstring's Attributes section")
        key = table_spec.keys.get(f.name, nested[f.name].heading if f.name in nested
                                  else f.name)
        if key == "":
            continue  # shown with another field's row
        if key != f.name:  # a nested table: its keys are in its own section
            rows.append((key, "table", "", docs[f.name]))
            continue
        if f.default is not dataclasses.MISSING:
            default = toml_value(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = toml_value(f.default_factory())
        else:
            default = "required"
        rows.append((key, str(f.type), default, docs[f.name]))
    return rows


def _nested_tables(spec: ConfigTable) -> dict[str, ConfigTable]:
    """The fields of ``spec``'s dataclass that are dataclasses themselves (nested tables,
    ``[synth.aim]``), but those ``spec.keys`` names, as tables of their own: field -> table.
    Only a table written as one plain ``[name]`` heading has them."""
    m = re.fullmatch(r"\[([\w.]+)\]", spec.heading)
    if m is None:
        return {}
    import typing

    cls = _load(spec.cls)
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        sub = hints.get(f.name)
        if f.name in spec.keys or not (isinstance(sub, type) and dataclasses.is_dataclass(sub)):
            continue
        summary = re.sub(r"^``\[[\w.]+\]``:\s*", "",  # the heading says it already
                         (inspect.getdoc(sub) or "").split("\n\n")[0])
        summary = summary[:1].upper() + summary[1:]
        out[f.name] = ConfigTable(heading=f"[{m.group(1)}.{f.name}]",
                                  cls=f"{sub.__module__}:{sub.__qualname__}",
                                  intro=" ".join(rst_to_md(summary).split()))
    return out


def _config_parts(spec: ConfigTable, level: int) -> list[str]:
    """The heading, intro and key table of ``spec``, then its nested tables' (one level
    down), then the keys its class lists as moved (``MOVED_KEYS``: old key -> new place)."""
    parts = [f"{'#' * level} `{spec.heading}`",
             f"{spec.intro} Read into `{spec.cls.replace(':', '.')}`."]
    rows = [[code(k), code(t) if t != "table" else t,
             code(d) if d not in ("", "required", "unset") else d, cell(desc)]
            for k, t, d, desc in config_fields(spec)]
    parts.append(table(["key", "type", "default", "meaning"], rows))
    for sub in _nested_tables(spec).values():
        parts += _config_parts(sub, level + 1)
    moved = getattr(_load(spec.cls), "MOVED_KEYS", None)
    if moved:
        base = spec.heading.strip("[]")
        parts.append(f"{'#' * (level + 1)} Moved keys of `{spec.heading}`")
        parts.append(f"Keys of `{spec.heading}` that moved to a nested table. In a file or "
                     "`--set` the old key is an error naming its new place; a run's own "
                     "saved configuration of the old layout is read migrated.")
        parts.append(table(["old key", "new key"],
                           [[code(f"{base}.{old}"), code(f"{base}.{new}")]
                            for old, new in moved.items()]))
    return parts


def config_reference() -> str:
    """Every key of every config table, from the dataclasses and their docstrings."""
    parts = []
    for spec in CONFIG_TABLES:
        parts += _config_parts(spec, 2)
    return "\n\n".join(parts)


# ------------------------------------------------------------------ exit codes


def _qualname(cls: type) -> str:
    return f"`{cls.__module__}.{cls.__qualname__}`"


def exit_codes() -> str:
    """The exit-code enum and which error types map to each code
    (:func:`parties.runtime.exitcodes.exit_code_for`, :func:`pubsub.cli.run_guarded`, the FedForge
    processes' ``synth.cli`` constants)."""
    import parties.runtime.exitcodes as pc
    import pubsub.cli as bus_cli
    import synth.cli as sc

    by_code: dict[int, list[str]] = {}
    for types, code_ in pc._EXIT_CODES:
        by_code.setdefault(int(code_), []).extend(_qualname(t) for t in types)
    by_code.setdefault(int(pc.ExitCode.BAD_INPUT), []).append(
        "`parties.privacy.dpsgd.DpIncompatibleModel`")
    rows = [[f"{int(c)}", code(c.name), ", ".join(by_code.get(int(c), [])) or "—"]
            for c in pc.ExitCode]
    synth_codes = {"EXIT_FAILED": sc.EXIT_FAILED, "EXIT_BAD_INPUT": sc.EXIT_BAD_INPUT,
                   "EXIT_BROKER": sc.EXIT_BROKER, "EXIT_PEER": sc.EXIT_PEER}
    return "\n\n".join([
        "`parties.runtime.exitcodes.ExitCode`, and the errors `parties.runtime.exitcodes.exit_code_for` maps "
        "to each (first match wins; anything else is a bug and propagates as a traceback):",
        table(["code", "name", "errors"], rows),
        "Every command runs under `pubsub.cli.run_guarded`, which maps the bus's own errors: "
        f"bad input ({', '.join(_qualname(t) for t in bus_cli.BAD_INPUT_ERRORS)}) to "
        f"{bus_cli.EXIT_BAD_INPUT}, an unusable broker "
        f"({', '.join(_qualname(t) for t in bus_cli.BROKER_ERRORS)}) to "
        f"{bus_cli.EXIT_BROKER_UNREACHABLE}, Ctrl-C to 130.",
        "The FedForge processes (`python -m synth ...`, `synth.cli`) use the same numbers: "
        + ", ".join(f"`{k}` = {v}" for k, v in synth_codes.items())
        + "; a coordinator or participant error carries its own code.",
    ])


# ----------------------------------------------------------------- wire format


def _rst_doc_to_md(doc: str) -> str:
    """A module docstring (reST with ``::`` literal blocks) as Markdown."""
    lines = inspect.cleandoc(doc).splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::"):
            out.append(rst_to_md(line.rstrip()[:-2].rstrip() + ":"))
            i += 1
            block: list[str] = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            body = inspect.cleandoc("\n".join(block))
            out += ["", "```text", body, "```", ""]
            continue
        out.append(rst_to_md(line))
        i += 1
    return "\n".join(out)


def wire_format() -> str:
    """The codec's own description (``pubsub.codec``'s docstring), its constants, and a
    worked example encoded, decoded and dissected by the codec at build time."""
    import numpy as np

    from pubsub import codec

    consts = [(name, getattr(codec, name)) for name in
              ("VERSION", "MAX_TOPIC_BYTES", "MAX_PUBLISHER_BYTES", "MAX_HEADER_BYTES",
               "INLINE_MAX_BYTES", "ZERO_COPY_BYTES")]
    head = (f"`struct.Struct({codec.HEAD.format!r})`, {codec.HEAD.size} bytes: version, "
            "CRC-32, seq, JSON length, publisher-id length")
    dtypes = ", ".join(code(d) for d in sorted(codec._ALLOWED_DTYPES))

    topic, pub, meta = "emb/r1/passive/7", "passive/c0ffee", {"epoch": 0, "batch": 7}
    arr = np.arange(6, dtype="<f4").reshape(2, 3)
    frames = codec.encode(topic, [arr], meta, seq=3, publisher=pub)
    msg = codec.decode(frames)
    if (len(frames) != 1 or msg.topic != topic or msg.publisher != pub or msg.seq != 3
            or msg.meta != meta or not np.array_equal(msg.arrays[0], arr)):
        raise GenerationError("pubsub.codec does not round-trip the wire-format example")
    f0 = bytes(frames[0])
    t_end = len(topic.encode()) + 1
    version, crc, seq, jlen, plen = codec.HEAD.unpack_from(f0, t_end)
    h_end = t_end + codec.HEAD.size
    p_end = h_end + plen
    j_end = p_end + jlen
    pay = len(f0) - arr.nbytes
    parts = [(0, t_end, "topic + NUL", topic + "\\0"),
             (t_end, t_end + 1, "version u8", str(version)),
             (t_end + 1, t_end + 5, "CRC-32 u32", f"0x{crc:08x}"),
             (t_end + 5, t_end + 13, "seq u64", str(seq)),
             (t_end + 13, t_end + 17, "JSON length u32", str(jlen)),
             (t_end + 17, h_end, "publisher-id length u8", str(plen)),
             (h_end, p_end, "publisher id", pub),
             (p_end, j_end, "JSON header", f0[p_end:j_end].decode()),
             (j_end, pay, "pad to a multiple of 8", f"{pay - j_end} bytes"),
             (pay, len(f0), "inline payload", f"{arr.dtype.str} {list(arr.shape)}, "
                                              f"{arr.nbytes} bytes")]
    rows = [[f"{a}–{b - 1}" if b - a > 1 else str(a), cell(what), code(shown),
             code(f0[a:b][:16].hex(" ") + (" …" if b - a > 16 else ""))]
            for a, b, what, shown in parts if b > a]
    example = (
        f"`pubsub.codec.encode({topic!r}, [np.arange(6, dtype='<f4').reshape(2, 3)], "
        f"{meta!r}, seq=3, publisher={pub!r})` gives one frame of {len(f0)} bytes (the "
        f"payload is under `INLINE_MAX_BYTES`, so it travels inline), which "
        "`pubsub.codec.decode` turns back into the same topic, sequence number, publisher, "
        "metadata and array:")
    return "\n\n".join([
        "## The codec", _rst_doc_to_md(codec.__doc__ or ""),
        "## Constants", table(["name", "value"], [*([code(k), code(str(v))] for k, v in consts),
                                                  [code("HEAD"), head]]),
        f"Array dtypes a message may carry: {dtypes}.",
        "## A message, byte by byte", example,
        table(["bytes", "field", "value", "hex"], rows),
    ])


def topic_policy() -> str:
    """The broker's default topic permissions per role (``broker/default_policy.toml``)."""
    import tomllib

    path = ROOT / "broker" / "default_policy.toml"
    roles = tomllib.loads(path.read_text())["roles"]
    rows = [[code(role), f"PORT+{3 + 2 * i} / PORT+{4 + 2 * i}",
             ", ".join(code(p) for p in spec.get("publish", [])),
             ", ".join(code(p) for p in spec.get("subscribe", []))]
            for i, (role, spec) in enumerate(roles.items())]
    return ("From `broker/default_policy.toml` (`*` matches one segment, a final `**` any "
            "rest; role i publishes to PORT+3+2i and reads from PORT+4+2i):\n\n"
            + table(["role", "publish / read port", "may publish", "may read"], rows))


#: marker name -> generator of the Markdown that replaces it
GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "config": config_reference,
    "exit-codes": exit_codes,
    "wire-format": wire_format,
    "topic-policy": topic_policy,
}


def expand(markdown: str) -> str:
    """``markdown`` with the body of every generated block regenerated (marker lines
    kept).

    Raises:
        GenerationError: a block names no generator, or a start line has no end line.
    """
    def sub(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in GENERATORS:
            raise GenerationError(f"unknown generated part {name!r} (known: "
                                  f"{', '.join(sorted(GENERATORS))})")
        return f"{m.group(1)}\n{GENERATORS[name]().strip(chr(10))}\n{m.group(4)}"

    out = BLOCK.sub(sub, markdown)
    starts = [m.group(1) for m in START.finditer(markdown)]
    ended = [m.group(2) for m in BLOCK.finditer(markdown)]
    if len(starts) != len(ended):
        missing = sorted(set(starts) - set(ended)) or starts
        raise GenerationError(f"generated part(s) {missing} without their "
                              "'<!-- end generated: NAME -->' line")
    return out


def generated_pages(docs: Path = ROOT / "docs") -> list[Path]:
    """The pages under ``docs`` that hold a generated block."""
    return [p for p in sorted(docs.rglob("*.md")) if START.search(p.read_text())]


def stale_pages(docs: Path = ROOT / "docs") -> list[Path]:
    """The pages whose committed blocks differ from what the code generates now."""
    return [p for p in generated_pages(docs) if expand(p.read_text()) != p.read_text()]


def write_pages(docs: Path = ROOT / "docs") -> list[Path]:
    """Regenerate every page's blocks in place (each file replaced whole); returns the
    pages that changed."""
    changed = []
    for p in generated_pages(docs):
        text = p.read_text()
        new = expand(text)
        if new != text:
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_text(new)
            tmp.replace(p)
            changed.append(p)
    return changed


def on_page_markdown(markdown: str, **_: Any) -> str:
    """mkdocs event: regenerate the page's blocks (their marker lines left out of the
    site, where a reader has nothing to do with them)."""
    return _MARKER_LINE.sub("", expand(markdown))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Regenerate the reference pages' generated "
                                 "blocks from the code.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="refresh every page in place")
    g.add_argument("--check", action="store_true",
                   help="list the pages whose blocks are stale; exit 1 if any")
    ap.add_argument("pages", nargs="*", type=Path, help="print these pages regenerated")
    args = ap.parse_args(argv)
    if args.write:
        for p in write_pages():
            print(f"refreshed {p.relative_to(ROOT)}")
        return 0
    if args.check:
        stale = stale_pages()
        for p in stale:
            print(f"stale: {p.relative_to(ROOT)} (python docs/gen_ref.py --write)")
        return 1 if stale else 0
    for p in args.pages:
        sys.stdout.write(expand(p.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
