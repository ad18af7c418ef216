"""Merging the public schemas several holders of one table drafted (FedForge's branches,
each with its own rows of the same columns) into the one schema they all run with.

One branch drafts the schema from its file (``psfl vfl schema --role active``, the label
included); each other branch drafts its own, or reviews the first and extends it; then
:func:`merge_schemas` takes the widest declaration of each column: the union of the
declared categories (in first-seen order), the widest numeric range and date years, the
most hash buckets, the union of date parts, a missing-value indicator where any branch
has one; a numeric column's ``fill`` and ``log`` and a date's ``fill`` are the first
branch's. Different kinds or date formats for one column are refused, naming the column
and each branch's declaration.

What the merge discloses: the merged file lists every category and range any branch
declared, so whoever receives it learns them (each branch's draft is computed from its
rows until reviewed). The merged schema is as private as the reviewed drafts it merges:
review each draft before it leaves its branch.

Owns: :func:`merge_schemas`, :class:`SchemaMergeError`. May import :mod:`parties.data.schema`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from parties.data.schema import (DATE_PARTS, CategoricalColumn, Column, DateColumn, HashedColumn,
                                 NumericColumn, PublicSchema, SchemaError)


class SchemaMergeError(SchemaError):
    """Two schemas declare one column in ways no single declaration covers.

    Attributes:
        column: the column.
        declarations: each schema's declaration of it (its source name and kind or format).
    """

    def __init__(self, column: str, declarations: Sequence[str], why: str) -> None:
        self.column = column
        self.declarations = tuple(declarations)
        super().__init__(f"{why}: {'; '.join(declarations)}", key=column)


def _merge_column(name: str, cols: Sequence[tuple[str, Column]]) -> tuple[Column, str]:
    """One column's widest declaration, and a note of what the merge changed ("" if
    nothing)."""
    kinds = {c.kind for _, c in cols}
    if len(kinds) > 1:
        raise SchemaMergeError(name, [f"{src}: {c.kind}" for src, c in cols],
                               "declared with different kinds")
    first = cols[0][1]
    changed = len({repr(c) for _, c in cols}) > 1
    if isinstance(first, NumericColumn):
        nums = [c for _, c in cols if isinstance(c, NumericColumn)]
        merged: Column = replace(first, lo=min(c.lo for c in nums), hi=max(c.hi for c in nums),
                                 missing_indicator=any(c.missing_indicator for c in nums))
        what = f"range [{merged.lo:g}, {merged.hi:g}] (the widest)"
    elif isinstance(first, CategoricalColumn):
        cats: dict[str, None] = {}
        for _, c in cols:
            cats.update(dict.fromkeys(c.categories))  # type: ignore[union-attr]
        merged = replace(first, categories=tuple(cats))
        what = f"{len(cats)} categories (the union)"
    elif isinstance(first, DateColumn):
        dates = [c for _, c in cols if isinstance(c, DateColumn)]
        if len({c.format for c in dates}) > 1:
            raise SchemaMergeError(name, [f"{src}: format {c.format!r}" for src, c in cols],
                                   "declared with different date formats")
        parts = {p for c in dates for p in c.parts}
        years = [c for c in dates if "year" in c.parts]
        merged = replace(first, parts=tuple(p for p in DATE_PARTS if p in parts),
                         year_lo=min((c.year_lo for c in years), default=0),
                         year_hi=max((c.year_hi for c in years), default=0),
                         missing_indicator=any(c.missing_indicator for c in dates))
        what = f"parts {list(merged.parts)}" + (f", years {merged.year_lo}-{merged.year_hi}"
                                                 if years else "")
    else:
        hashed = [c for _, c in cols if isinstance(c, HashedColumn)]
        merged = replace(first, buckets=max(c.buckets for c in hashed))
        what = f"{merged.buckets} buckets (the most)"
    return merged, (f"merged from {len(cols)} declarations: {what}" if changed else "")


def merge_schemas(schemas: Sequence[tuple[str, PublicSchema]]
                  ) -> tuple[PublicSchema, dict[str, str]]:
    """The widest schema covering every ``(source name, schema)`` (module docstring), and
    per column a note of what merging changed or which sources lack it.

    Raises:
        SchemaMergeError: a column declared with different kinds or date formats.
        ValueError: fewer than one schema.
    """
    if not schemas:
        raise ValueError("nothing to merge")
    order: dict[str, list[tuple[str, Column]]] = {}
    for src, schema in schemas:
        for col in schema.columns:
            order.setdefault(col.name, []).append((src, col))
    columns, notes = [], {}
    for name, cols in order.items():
        merged, note = _merge_column(name, cols)
        columns.append(merged)
        missing = [src for src, s in schemas if name not in s.names]
        if missing:
            note = (note + "; " if note else "") + f"not declared by {', '.join(missing)}"
        if note:
            notes[name] = note
    first = schemas[0][1]
    return PublicSchema(columns=tuple(columns), dataset=first.dataset,
                        description=f"merged from {len(schemas)} schemas: "
                                    + ", ".join(src for src, _ in schemas)), notes


__all__ = ["SchemaMergeError", "merge_schemas"]
