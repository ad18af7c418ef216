"""Every relative link in README.md and docs/ points to a file of the repository, and
every #anchor to a heading of its target (GitHub's heading slugs, which the site's
mkdocs.yml uses too). A page with generated blocks (``<!-- generated: NAME ... -->``,
docs/gen_ref.py) is checked as the site builds it."""

from __future__ import annotations

import importlib.util
import re
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped,
    spaces to '-'."""
    h = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return h.replace(" ", "-")


@cache
def _gen_ref():
    """docs/gen_ref.py, the mkdocs hook that expands generated parts."""
    spec = importlib.util.spec_from_file_location("docs_gen_ref", ROOT / "docs" / "gen_ref.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their module
    spec.loader.exec_module(module)
    return module


def page_text(path: Path) -> str:
    """The page as the site renders it: generated parts expanded."""
    text = path.read_text()
    if path.suffix == ".md" and "<!-- generated: " in text:
        text = _gen_ref().expand(text)
    return text


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in page_text(path).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def _links() -> list[tuple[Path, str]]:
    found = []
    for doc in DOCS:
        for target in LINK.findall(_prose(doc.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                continue
            found.append((doc, target))
    return found


def test_the_docs_have_links_to_check() -> None:
    assert len(_links()) > 20


@pytest.mark.parametrize("doc, target", _links(),
                         ids=lambda v: v if isinstance(v, str) else v.name)
def test_relative_links_resolve(doc: Path, target: str) -> None:
    path, _, anchor = target.partition("#")
    dest = (doc.parent / path).resolve() if path else doc
    assert dest.exists(), f"{doc.relative_to(ROOT)}: no such path {path!r}"
    if anchor and dest.suffix == ".md":
        assert anchor in anchors(dest), \
            f"{doc.relative_to(ROOT)}: no heading #{anchor} in {dest.relative_to(ROOT)}"
