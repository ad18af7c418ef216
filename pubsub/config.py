"""Config loading for frozen dataclasses: TOML files plus ``--set a.b=v`` overrides.

Unknown keys are rejected with an error that names them, so a typo never
silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is invalid.

    Attributes:
        key: the offending dotted key ("" if not key-specific).
    """

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        super().__init__(f"config {key!r}: {reason}" if key else f"config: {reason}")


def parse_value(text: str) -> Any:
    """Parse an override value as a TOML value (``3``, ``1e-3``, ``true``, ``[1, 2]``, ``"s"``);
    anything that is not valid TOML is taken as a plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=x"]`` into a nested dict ``{"a": {"b": 1}, "c": "x"}``.

    Raises:
        ConfigError: an item has no ``=`` or an empty key.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(item, "expected KEY=VALUE")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(key, f"{part!r} is both a value and a section")
            node = nxt
        node[parts[-1]] = parse_value(value.strip())
    return out


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Recursively merge ``over`` into a copy of ``base``."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file.

    Raises:
        ConfigError: missing file or invalid TOML (naming the path).
    """
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError("", f"config file {str(p)!r} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"{str(p)!r} is not valid TOML: {exc}") from None


def _coerce(key: str, tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(key, args[0], value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    if origin is tuple:
        if isinstance(value, str):  # "a,b" or "[a,b]" (unquoted items) from --set
            value = [v.strip().strip("'\"") for v in value.strip().strip("[]").split(",")
                     if v.strip()]
        if not isinstance(value, list | tuple):
            raise ConfigError(key, f"expected a list, got {value!r}")
        args = typing.get_args(tp)
        elem = args[0] if args else Any
        return tuple(_coerce(key, elem, v) for v in value)
    return value


def expand_dotted(data: Mapping[str, Any]) -> dict[str, Any]:
    """``{"dp.mu": 8, "epochs": 3}`` as ``{"dp": {"mu": 8}, "epochs": 3}`` (nested tables
    merged, as TOML reads ``dp.mu = 8``).

    Raises:
        ConfigError: a key is both a value and a table.
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        parts = key.split(".") if isinstance(key, str) else [key]
        if isinstance(value, Mapping):
            value = expand_dotted(value)
        node = out
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(key, f"{part!r} is both a value and a table")
            node = nxt
        last = parts[-1]
        if isinstance(value, Mapping) and isinstance(node.get(last), Mapping):
            node[last] = deep_merge(node[last], value)
        elif last in node and (isinstance(node[last], Mapping) or isinstance(value, Mapping)):
            raise ConfigError(key, f"{last!r} is both a value and a table")
        else:
            node[last] = value
    return out


def refuse_moved(data: Mapping[str, Any], moved: Mapping[str, str], *, section: str) -> None:
    """Refuse the keys of ``data`` (one section's table) that moved: ``moved`` maps an old
    key to its new dotted place under ``section`` (``{"dp_mu": "dp.mu"}``). An old key
    that is now the name of a table (``{"engine": "engine.name"}``) is refused only with a
    value that is not a table.

    Raises:
        ConfigError: keyed by the first old key, naming every old key's new place, in a
            file, on the command line and in a Python mapping.
    """
    found = [(old, moved[old]) for old, value in data.items()
             if old in moved and not isinstance(value, Mapping)]
    if not found:
        return
    old, new = found[0]
    table, _, leaf = new.rpartition(".")
    where = f"[{section}.{table}] {leaf} = ..." if table else f"[{section}] {leaf} = ..."
    more = "".join(f"; {section}.{o} moved to {section}.{n}" for o, n in found[1:])
    raise ConfigError(f"{section}.{old}", f"this key moved to {section}.{new} (in a file: "
                      f"{where}; on the command line: --set {section}.{new}=...; in a "
                      f"Python mapping: {new!r}){more}")


def migrate_moved(data: Mapping[str, Any], moved: Mapping[str, str]) -> dict[str, Any]:
    """A table written before keys moved, with each old key of ``moved`` at its new
    dotted place (for saved configurations read back; a user's own file is refused by
    :func:`refuse_moved` instead)."""
    flat = {moved.get(k, k) if isinstance(k, str) and not isinstance(v, Mapping) else k: v
            for k, v in data.items()}
    return expand_dotted(flat)


def from_mapping(cls: type[T], data: Mapping[str, Any], *, section: str = "",
                 old_names: Mapping[str, str] | None = None) -> T:
    """Build the frozen dataclass ``cls`` from ``data``, rejecting unknown keys.

    Nested dataclass fields take nested tables; a dotted key (``"dp.mu"``) is the same
    as the nested table. Values are type-checked against the field annotations (int,
    float, bool, str, tuple[...], optional).

    Raises:
        ConfigError: unknown key, or a value of the wrong type (naming the dotted key).
    """
    if any(isinstance(k, str) and "." in k for k in data):
        data = expand_dotted(data)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    moved = getattr(cls, "MOVED_KEYS", None)
    if moved:
        refuse_moved(data, moved, section=section)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{section}." if section else ""
        renamed = (old_names or {}).get(unknown[0])
        hint = f"; this table calls it {renamed!r}" if renamed else ""
        raise ConfigError(
            where + unknown[0],
            f"unknown key{hint} (known keys: {', '.join(sorted(fields))})",
        )
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        tp = hints[name]
        key = f"{section}.{name}" if section else name
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, Mapping):
                keys = ", ".join(f.name for f in dataclasses.fields(tp))  # type: ignore[arg-type]
                raise ConfigError(key, f"expected a table ([{key}] with keys {keys}), "
                                  f"got {value!r}")
            # an old flat key written inside its new table under its old name
            inside = {old: new.split(".", 1)[1] for old, new in (moved or {}).items()
                      if new.startswith(name + ".")}
            kwargs[name] = from_mapping(tp, value, section=key,  # type: ignore[arg-type]
                                        old_names=inside)
        else:
            kwargs[name] = _coerce(key, tp, value)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(section, str(exc)) from None


def load_section(cls: type[T], section: str, path: str | Path | None = None,
                 sets: Iterable[str] = (), extra: Mapping[str, Any] | None = None) -> T:
    """Effective config of one ``[section]`` table: ``cls``'s defaults, then the TOML file's
    table, then ``--set`` items (``section.key=v`` or just ``key=v``), then ``extra`` (from
    dedicated CLI flags).

    Raises:
        ConfigError: unknown section or key, wrong type, or an invalid value.
    """
    data: dict[str, Any] = load_toml(path) if path else {}
    unknown = set(data) - {section}
    if unknown:
        raise ConfigError(sorted(unknown)[0], f"unknown section (expected [{section}])")
    return section_from_data(cls, section, data, sets, extra)


def section_from_data(cls: type[T], section: str, data: Mapping[str, Any],
                      sets: Iterable[str] = (), extra: Mapping[str, Any] | None = None) -> T:
    """:func:`load_section` of a document already read (``data``: its top-level tables;
    tables other than ``[section]`` are the caller's to check).

    Raises:
        ConfigError: unknown key, wrong type, or an invalid value.
    """
    over = parse_overrides(sets)
    flat = {k: v for k, v in over.items() if k != section}
    table = deep_merge(dict(data.get(section, {})), over.get(section, {}))
    table = deep_merge(table, flat)
    if extra:
        table = deep_merge(table, dict(extra))
    return from_mapping(cls, table, section=section)


def to_mapping(obj: Any) -> dict[str, Any]:
    """A frozen dataclass as a TOML-ready dict (tuples become lists, None dropped)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if v is None:
            continue
        if dataclasses.is_dataclass(v):
            out[f.name] = to_mapping(v)
        elif isinstance(v, tuple):
            out[f.name] = list(v)
        else:
            out[f.name] = v
    return out


def dump_toml(data: Mapping[str, Any]) -> str:
    """Serialise a dict of scalars, lists and nested tables to TOML text (a nested
    table as ``[a.b]``)."""

    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list | tuple):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        raise TypeError(f"cannot write {v!r} as TOML")

    lines: list[str] = []

    def table(name: str, body: Mapping[str, Any]) -> None:
        subs = [(k, v) for k, v in body.items() if isinstance(v, Mapping)]
        values = [(k, v) for k, v in body.items() if not isinstance(v, Mapping)]
        if name and (values or not subs):
            if lines:
                lines.append("")
            lines.append(f"[{name}]")
        lines.extend(f"{k} = {fmt(v)}" for k, v in values)
        for k, v in subs:
            table(f"{name}.{k}" if name else k, v)

    table("", data)
    return "\n".join(lines) + "\n"
