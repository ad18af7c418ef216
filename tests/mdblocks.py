"""Fenced code blocks of a markdown page, for the tests that read the docs
(tests/unit/test_docs_site.py, tests/integration/test_tutorials.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator

#: An opening fence: its marker and its language.
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")


def fenced_blocks(lines: list[str]) -> Iterator[tuple[int, str, list[str]]]:
    """``(index of the opening fence line, language lower-cased, body lines)`` of each
    fenced block of ``lines``, in order; an unclosed block runs to the end."""
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        yield start, lang, body
