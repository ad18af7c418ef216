"""A griffe extension for the Python API pages (mkdocs.yml, mkdocstrings ``extensions``).

The project's docstrings are Google style (``Args:``, ``Raises:``, ``Attributes:``) with
reST inline markup: Sphinx roles (``:class:`x```), double-backtick literals and ``::``
before an indented example. Markdown shows those literally, so before mkdocstrings parses
a docstring this turns a role into a code span (``~`` keeps the last name), a literal
into a code span, and drops the ``::`` marker (the indented block after it is already a
Markdown code block). An entry that documents several names at once (``a / b: text``,
as the config dataclasses do) becomes one entry per name, so that each gets its row.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj|const):`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+?)``")
_GROUPED = re.compile(r"^(\s+)(\w+(?:\s*/\s*\w+)+):(\s.*)?$")


def rst_inline_to_md(text: str) -> str:
    """reST inline markup of a docstring as Markdown (see the module docstring)."""
    text = _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`",
                     text)
    text = _LITERAL.sub(r"`\1`", text)
    lines = []
    for line in text.splitlines():
        if line.strip() == "::":
            continue
        if line.rstrip().endswith("::"):
            line = line.rstrip()[:-1]
        lines.append(line)
    return "\n".join(_split_grouped(lines))


def _split_grouped(lines: list[str]) -> list[str]:
    """``a / b: text`` (and its indented continuation) as ``a: text`` and
    ``b: as `a`.``"""
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _GROUPED.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, names = m.group(1), [n.strip() for n in m.group(2).split("/")]
        out.append(f"{indent}{names[0]}:{m.group(3) or ''}")
        i += 1
        while i < len(lines) and lines[i].strip() and (
                len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
            out.append(lines[i])
            i += 1
        out += [f"{indent}{n}: as `{names[0]}`." for n in names[1:]]
    return out


class RstInline(griffe.Extension):
    """Rewrite every docstring's reST inline markup before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_inline_to_md(obj.docstring.value)
