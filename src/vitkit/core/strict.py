"""Strict conversion of plain dicts (JSON, TOML, command-line overrides) into dataclasses.

Unknown keys and values of the wrong type are errors that name the field. Used by the model config
and the training config alike, so that every config file vitkit reads is checked the same way.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import reprlib
import types
import typing
from typing import Any, get_args, get_origin

from .errors import ConfigError

_BRIEF = reprlib.Repr()
_BRIEF.maxstring, _BRIEF.maxlong, _BRIEF.maxother = 80, 40, 80


def brief(value: Any) -> str:
    """``value``'s repr for an error line: long text, numbers (10**400) and lists shortened in the middle."""
    return _BRIEF.repr(value)


INT64 = 2**63  # a whole-number field holds a signed 64-bit value (as torch does): |n| < 2**63


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Return ``value`` converted to type ``tp`` (ints to floats, lists to tuples), or raise ConfigError."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is typing.Union or origin is types.UnionType:
        return _coerce_union(value, tp, where)
    if origin is typing.Literal:
        if value in get_args(tp):
            return value
        choices = ", ".join(repr(a) for a in get_args(tp))
        raise ConfigError(f"{where}: expected one of {choices}, got {brief(value)}")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {brief(value)}")
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"{where}: expected {len(args)} values, got {len(value)}")
            out = [coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args))]
        else:
            elem = args[0] if args else Any
            out = [coerce(v, elem, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table/dict, got {brief(value)}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {brief(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool) and -INT64 <= value < INT64:
            return value
        if isinstance(value, float) and value.is_integer() and -INT64 <= value < INT64:
            return int(value)
        raise ConfigError(f"{where}: expected an integer{' of 64 bits' if isinstance(value, int) else ''}, got "
                          f"{brief(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(finite(value, where))
        raise ConfigError(f"{where}: expected a number, got {brief(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {brief(value)}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{where}: expected null, got {brief(value)}")
    raise ConfigError(f"{where}: unsupported type {_type_name(tp)}")


def _coerce_union(value: Any, tp: Any, where: str) -> Any:
    """``value`` as the first of the union ``tp``'s types that takes it (None for an optional's 'none')."""
    if isinstance(value, str) and value.lower() in ("none", "null") and type(None) in get_args(tp):
        if str not in get_args(tp):  # `--set key=none` on an optional, non-string field
            return None
    if isinstance(value, float) and float in get_args(tp):
        finite(value, where)  # said as such, not as a value of none of the types
    for arg in get_args(tp):
        if arg is type(None):
            if value is None:
                return None
            continue
        try:
            return coerce(value, arg, where)
        except ConfigError:
            continue
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {brief(value)}")


def is_finite_real(value) -> bool:
    """True for a real number (not a bool) that a float holds finitely: NaN, the infinities and whole numbers
    too large for a float (10**400, which JSON and TOML carry) are not, and never raise OverflowError."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def finite(value: float, where: str) -> float:
    """``value`` when it is a finite number; NaN or an infinity is a ConfigError naming ``where`` (no setting
    means anything by them, and a comparison with NaN is always false, so range checks would let it by)."""
    if not is_finite_real(value):
        raise ConfigError(f"{where}: expected a finite number, got {brief(value)}")
    return value


def from_dict(cls: type, data: Any, where: str = "config"):
    """Build dataclass ``cls`` from ``data``; unknown keys and ill-typed values raise ConfigError."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a table/dict, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; known fields: {', '.join(fields)}"
        )
    kwargs = {k: coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    return cls(**kwargs)


def to_dict(obj: Any) -> dict:
    """Dataclass to a JSON-ready dict (tuples become lists)."""

    def conv(v):
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v

    return conv(obj)


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value`` into (["a","b","c"], value); the value is read as JSON when it parses."""
    import json

    if "=" not in text:
        raise ConfigError(f"override {brief(text)}: expected KEY=VALUE, e.g. optim.lr=0.001")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override {brief(text)}: empty key")
    try:
        value = json.loads(raw)
    except ValueError:
        low = raw.strip().lower()
        # 'none' stays a string here: a string field may take it as a choice ('augment.auto=none');
        # coerce() reads it as None for optional fields that take no string
        value = {"true": True, "false": False}.get(low, raw)
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply dotted ``KEY=VALUE`` overrides to a nested dict (a copy is returned)."""
    import copy

    out = copy.deepcopy(data)
    for text in overrides:
        keys, value = parse_override(text)
        node = out
        for k in keys[:-1]:
            nxt = node.get(k)
            if nxt is None:
                nxt = node[k] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {brief(text)}: {k!r} is not a section")
            node = nxt
        node[keys[-1]] = value
    return out


MAX_NESTING = 64  # the deepest nesting of lists and tables a config file (JSON, TOML) may have; vitkit's own
#   go 3 deep. Deeper would only make the parsers and every recursive use of the result exhaust the stack.


def check_nesting(data, limit: int = MAX_NESTING) -> None:
    """ValueError if ``data`` (parsed JSON or TOML) nests lists and dicts more than ``limit`` levels deep;
    walked without recursion."""
    stack = [(data, 1)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, (dict, list)):
            if depth > limit:
                raise ValueError(f"nested more than {limit} levels deep")
            stack.extend((v, depth + 1) for v in (obj.values() if isinstance(obj, dict) else obj))


def parse_json(text: str | bytes):
    """``json.loads(text)``, where nesting beyond MAX_NESTING levels is a ValueError, as any other bad JSON
    (json itself would raise RecursionError, or leave it to whatever walks the result)."""
    import json

    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_NESTING} levels deep") from None
    check_nesting(data)
    return data


def read_json_object(file, error: type[Exception] = ConfigError) -> dict:
    """The JSON object in ``file`` as a dict; text that is not JSON, or JSON that is not an object, is
    ``error`` naming the file."""
    from .files import NotRegularFile, open_regular

    try:
        with open_regular(file) as f:
            data = parse_json(f.read().decode("utf-8"))
    except NotRegularFile as e:
        raise error(f"{file}: {e.strerror}") from None
    except ValueError as e:  # UnicodeDecodeError included
        raise error(f"{file}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise error(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def _whole(x) -> bool:
    """A whole number (Python's or numpy's), not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def real_in(value, where: str, lo: float, hi: float, *, open_lo: bool = False, open_hi: bool = False,
            error: type[Exception] = ConfigError) -> float:
    """``value`` as a float where it is a finite number (not a bool) in the range; else ``error`` in one line
    naming ``where`` and the range taken (``[lo, hi]``, an end left out with ``open_lo`` / ``open_hi``)."""
    if is_finite_real(value) and (lo < value if open_lo else lo <= value) and (value < hi if open_hi else value <= hi):
        return float(value)
    span = f"{'(' if open_lo else '['}{lo:g}, {hi:g}{')' if open_hi else ']'}"
    raise error(f"{where}: expected a finite number in {span}, got {reprlib.repr(value)}")


def reals_in(value, where: str, lo: float, hi: float, error: type[Exception] = ConfigError) -> tuple[float, ...]:
    """``value`` (a list of numbers, or one number) as a tuple of floats, each finite and in [lo, hi]; an
    empty list, another type or a value out of range is ``error`` naming ``where`` and the range."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in items):
        raise error(f"{where}: expected a number or a list of numbers in [{lo:g}, {hi:g}], got {reprlib.repr(value)}")
    return tuple(real_in(v, f"{where}[{i}]" if len(items) > 1 else where, lo, hi, error=error)
                 for i, v in enumerate(items))


def whole_in(value, where: str, lo: int, hi: int | None = None, error: type[Exception] = ConfigError) -> int:
    """``value`` as an int where it is a whole number (not a bool, not a float) in [lo, hi] (>= lo without
    ``hi``); else ``error`` naming ``where`` and the range."""
    if _whole(value) and lo <= value and (hi is None or value <= hi):
        return int(value)
    span = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    raise error(f"{where}: expected a whole number {span}, got {reprlib.repr(value)}")


def to_hw(value, what: str = "img_size", error: type[Exception] = ConfigError) -> tuple[int, int]:
    """An image size as (H, W): N -> (N, N); (H, W) or [H, W] as given; 'N', 'HxW' or 'H,W' from text.

    Sizes are positive whole numbers; anything else raises ``error`` in one line naming ``what``. Text
    is told the forms a command line takes (N or HxW), other values the forms code takes (N or (H, W)).
    """
    v = value
    if isinstance(v, str):
        try:
            v = tuple(int(p) for p in v.lower().replace("x", ",").split(","))
        except ValueError:
            v = value
        if isinstance(v, tuple) and len(v) == 1:
            v = (v[0], v[0])
    elif _whole(v):
        v = (v, v)
    elif isinstance(v, (list, tuple)):
        v = tuple(v)
    if not (isinstance(v, tuple) and len(v) == 2 and all(_whole(x) for x in v)):
        forms = "N or HxW" if isinstance(value, str) else "N or (H, W)"
        raise error(f"{what}: expected {forms}, got {brief(value)}")
    if min(v) < 1:
        raise error(f"{what}: sizes must be positive, got {brief(value)}")
    return int(v[0]), int(v[1])
