"""The contract's dataclasses as JSON, both ways, strictly.

A field's annotation is its schema: ``int`` reads only an integer (never ``true``), ``float``
an integer or a finite number, ``str`` a string without NUL, a ``StrEnum`` one of its values,
``X | None`` also ``null``, ``list[T]``/``tuple[T, ...]`` a list, ``tuple[A, B]`` a list of
two, ``dict[str, T]`` an object, a dataclass an object with exactly its fields, ``Any`` any
JSON value. A field with a default may be absent (that is how a schema gains a field without
refusing the files written before it); a field nobody declared is refused by name.

Hooks, all optional:

- ``field(metadata=check(fn))``: ``fn(value)`` returns a problem (a string) or None; with
  ``check(fn, keys=True)`` it is asked about each key of a mapping instead;
- a classmethod ``_cross_check(values)`` on the dataclass: problems between its fields, as
  ``(field, problem)`` pairs, over the fields that were read (so every problem is reported,
  even when another field is broken);
- ``field(metadata=flat())`` on a field whose type is a dataclass: its fields are written and
  read among the parent's own, so a type can be split in two while its JSON stays as it was;
  with a class attribute ``_json_order`` (every key, in order) the parent fixes where they go.

Every problem is one line ``LABEL.path.to.field: problem``; reading goes on after a problem,
so one pass names every bad field.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, TypeVar

_CHECK = "edgectl.check"
_CHECK_KEYS = "edgectl.check_keys"
_FLAT = "edgectl.flat"

T = TypeVar("T")


def check(fn: Callable[[Any], str | None], *, keys: bool = False) -> dict[str, Any]:
    """Field metadata: one more rule for a field's value (or, ``keys=True``, a mapping's keys)."""
    return {_CHECK_KEYS if keys else _CHECK: fn}


def flat() -> dict[str, Any]:
    """Field metadata: the field (a dataclass) is written and read inline, among its parent's keys."""
    return {_FLAT: True}


def to_json(value: Any) -> Any:
    """A dataclass (and what it holds) as plain JSON values, fields in declaration order."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            written = to_json(getattr(value, f.name))
            if f.metadata.get(_FLAT):
                out.update(written)
            else:
                out[f.name] = written
        order: tuple[str, ...] | None = getattr(value, "_json_order", None)
        if order is None:
            return out
        if sorted(order) != sorted(out):
            raise TypeError(f"{type(value).__name__}._json_order does not name each of its keys once")
        return {key: out[key] for key in order}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    return value


class _Failed:
    """A value that could not be read (its problem is already recorded)."""


FAILED = _Failed()


def read(cls: type[T], data: Any, label: str) -> tuple[T | None, list[str]]:
    """``cls`` read from ``data``; (the object or None, every problem found)."""
    problems: list[str] = []
    value = _read(cls, data, label, problems)
    return (None if problems or value is FAILED else value), problems


def kind_of(value: Any) -> str:
    """A JSON value's kind, for a message: "an integer", "a string", "null", ..."""
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _got(value: Any) -> str:
    return "null" if value is None else f"{kind_of(value)} {value!r}"


def _read(tp: Any, value: Any, path: str, problems: list[str]) -> Any:
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(options) < len(typing.get_args(tp)):
            return None
        if len(options) != 1:
            raise TypeError(f"{path}: unions other than `X | None` are not supported")
        return _read(options[0], value, path, problems)
    if tp in (bool, int, float, str):
        return _read_scalar(tp, value, path, problems)
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(str(m.value) for m in tp)
            return _fail(problems, path, f"{value!r} is not one of {allowed}")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _read_dataclass(tp, value, path, problems)
    if origin in (list, tuple):
        return _read_sequence(tp, value, path, problems)
    if origin is dict:
        return _read_mapping(tp, value, path, problems)
    raise TypeError(f"{path}: cannot read a field annotated {tp!r}")


def _fail(problems: list[str], path: str, problem: str) -> _Failed:
    problems.append(f"{path}: {problem}")
    return FAILED


def _read_scalar(tp: type, value: Any, path: str, problems: list[str]) -> Any:
    """``bool``, ``int`` (never a boolean), ``float`` (an integer or a finite number), ``str`` (without NUL)."""
    if tp is bool:
        return value if isinstance(value, bool) else _fail(problems, path, f"expected a boolean, got {_got(value)}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return _fail(problems, path, f"expected an integer, got {_got(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return _fail(problems, path, f"expected a number, got {_got(value)}")
        return value
    if not isinstance(value, str):
        return _fail(problems, path, f"expected a string, got {_got(value)}")
    if "\0" in value:
        return _fail(problems, path, "contains a NUL character")
    return value


def _read_sequence(tp: Any, value: Any, path: str, problems: list[str]) -> Any:
    """``list[T]`` and ``tuple[T, ...]`` (any length), ``tuple[A, B]`` (exactly that many): a JSON list."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if not isinstance(value, list):
        return _fail(problems, path, f"expected a list, got {_got(value)}")
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            return _fail(problems, path, f"expected a list of {len(args)}, got {value!r}")
        items = [_read(a, v, f"{path}[{i}]", problems) for i, (a, v) in enumerate(zip(args, value))]
    else:
        items = [_read(args[0], v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if any(i is FAILED for i in items):
        return FAILED
    return tuple(items) if origin is tuple else items


def _read_mapping(tp: Any, value: Any, path: str, problems: list[str]) -> Any:
    """``dict[str, T]``: a JSON object."""
    key_type, value_type = typing.get_args(tp)
    if key_type is not str:
        raise TypeError(f"{path}: only dict[str, ...] is supported")
    if not isinstance(value, dict):
        return _fail(problems, path, f"expected an object, got {_got(value)}")
    out = {k: _read(value_type, v, f"{path}.{k}", problems) for k, v in value.items()}
    return FAILED if any(v is FAILED for v in out.values()) else out


def _read_dataclass(cls: type, value: Any, path: str, problems: list[str]) -> Any:
    if not isinstance(value, dict):
        return _fail(problems, path, f"expected an object, got {_got(value)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    inline = {name: {g.name for g in dataclasses.fields(hints[name]) if g.init}
              for name, f in fields.items() if f.metadata.get(_FLAT)}
    known = {name for name in fields if name not in inline}.union(*inline.values())
    for key in value:
        if key not in known:
            problems.append(f"{path}.{key}: unknown field (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {}
    failed = False
    for name, f in fields.items():
        where = f"{path}.{name}"
        if name in inline:  # read from the parent's own keys, named as they are written
            got = _read_dataclass(hints[name], {k: v for k, v in value.items() if k in inline[name]}, path, problems)
            failed = failed or got is FAILED
            if got is not FAILED:
                values[name] = got
            continue
        if name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append(f"{where}: missing")
                failed = True
            continue
        key_rule = f.metadata.get(_CHECK_KEYS)
        if key_rule is not None and isinstance(value[name], dict):
            bad = [problem for k in value[name] if (problem := key_rule(k))]
            problems.extend(f"{where}: {problem}" for problem in bad)
            failed = failed or bool(bad)
        got = _read(hints[name], value[name], where, problems)
        if got is FAILED:
            failed = True
            continue
        rule = f.metadata.get(_CHECK)
        problem = rule(got) if rule is not None and got is not None else None
        if problem:
            problems.append(f"{where}: {problem}")
            failed = True
            continue
        values[name] = got
    cross = getattr(cls, "_cross_check", None)
    if cross is not None:
        for name, problem in cross(values):
            problems.append(f"{path}.{name}: {problem}")
            failed = True
    if failed or any(k not in known for k in value):
        return FAILED
    return cls(**values)
