"""JSON on the hot paths (records, dataset rows, judge answers): fast, and exactly what the
standard library's ``json`` gives.

Decoding tries msgspec first. msgspec refuses everything the standard library refuses
(invalid UTF-8, bad syntax, ints past ``sys.get_int_max_str_digits``) and also a little it
accepts (``NaN``/``Infinity``, numbers that overflow to inf, lone surrogate escapes, a BOM,
raw lone surrogates in a str): whatever msgspec refuses, the caller decodes again with
``json``, so results, errors and their messages are the standard library's own. Where
msgspec accepts, its value is ``json.loads``'s (tests/test_jsonlines.py checks this on
thousands of generated documents).

Encoding is ``json.dumps(record, ensure_ascii=False, allow_nan=False)``, byte for byte, with
the encoder object built directly rather than through ``JSONEncoder`` on every record.
"""

from __future__ import annotations

import json
import sys
import threading
from json.encoder import JSONEncoder, c_encode_basestring, c_make_encoder
from typing import Any

import msgspec

NOT_DECODED: Any = object()  # fast_loads could not decide: decode with ``json``

_decode = msgspec.json.Decoder().decode
_getlimit, _setlimit = sys.getrecursionlimit, sys.setrecursionlimit
# msgspec counts nesting against the recursion limit as json's C scanner does, but json's
# Python frames (loads, decode, raw_decode) leave it a few levels less: run msgspec under a
# limit lowered by this much, so that any document msgspec accepts is one json accepts too.
_DEPTH_MARGIN = 16
_limit_lock = threading.Lock()  # two threads lowering and restoring the limit must not interleave
# From Python 3.12 both decoders nest against a fixed C recursion limit instead (1500 in 3.12,
# 10000 in 3.13) that the margin above does not move, and msgspec goes one level deeper than
# json: decline a document that could nest _DEEP levels (that takes 2 * _DEEP bytes at least).
_C_RECURSION = sys.version_info >= (3, 12)
_DEEP = 1000


def _brackets(data: bytes | str) -> int:
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")


def fast_loads(data: bytes | str) -> Any:
    """``json.loads(data)`` when msgspec can decode ``data``; otherwise ``NOT_DECODED``.

    Bytes must be what the caller would decode as UTF-8 and hand to ``json.loads``.
    """
    if _C_RECURSION and len(data) >= 2 * _DEEP and _brackets(data) >= _DEEP:
        return NOT_DECODED
    with _limit_lock:
        limit = _getlimit()
        try:
            _setlimit(limit - _DEPTH_MARGIN)
        except RecursionError:  # already deeper than that: let json decide
            return NOT_DECODED
        try:
            return _decode(data)
        except Exception:  # msgspec.DecodeError, ValidationError, UnicodeDecodeError, RecursionError
            return NOT_DECODED
        finally:
            _setlimit(limit)


class JSONError(ValueError):
    """A document :func:`loads` cannot decode; the message is one line, without the document."""


def loads(data: bytes | str, *, bom: bool = False) -> Any:
    """``json.loads(data)``, msgspec first; every failure is a :class:`JSONError`.

    The standard library fails in four ways, not all of them a ``JSONDecodeError``: bad
    syntax, bytes that are not UTF-8 (``UnicodeDecodeError``), an integer past
    ``sys.get_int_max_str_digits`` (a plain ``ValueError``), and nesting deeper than the
    recursion limit (``RecursionError``, not a ``ValueError`` at all): a hand-edited results
    file or a hostile dataset row must be one line naming its line, never a traceback.
    ``bom``: bytes may start with a UTF-8 BOM (the first line of a file an editor saved).
    """
    value = fast_loads(data)
    if value is not NOT_DECODED:
        return value
    try:
        if isinstance(data, bytes):
            data = data.decode("utf-8-sig" if bom else "utf-8")
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise JSONError(f"invalid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise JSONError(f"invalid JSON: not valid UTF-8 (byte {exc.start})") from None
    except ValueError as exc:  # "Exceeds the limit (4300 digits) for integer string conversion"
        digits = sys.get_int_max_str_digits()
        raise JSONError(f"invalid JSON: an integer of more than {digits} digits") from None
    except RecursionError:  # json's decoder recurses once per [ or {
        raise JSONError("invalid JSON: nested too deeply") from None


_default = JSONEncoder().default  # TypeError: Object of type X is not JSON serializable


def dumps_record(record: Any) -> str:
    """``json.dumps(record, ensure_ascii=False, allow_nan=False)``, exactly."""
    if c_make_encoder is None or c_encode_basestring is None:  # no C accelerator: json itself
        return json.dumps(record, ensure_ascii=False, allow_nan=False)
    if isinstance(record, str):  # what JSONEncoder.encode does for a str
        return c_encode_basestring(record)
    # JSONEncoder.iterencode(_one_shot=True) with the C encoder: a fresh markers dict, so a
    # circular structure is still "ValueError: Circular reference detected".
    encode = c_make_encoder({}, _default, c_encode_basestring, None, ": ", ", ", False, False, False)
    return "".join(encode(record, 0))
