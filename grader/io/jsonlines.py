"""JSON on the hot paths (records, dataset rows, judge answers): exactly what the standard
library's ``json`` gives, decoded by msgspec where it can.

Decoding tries msgspec first: at 10^6 results records it is about half of ``json.loads``'s
time (docs/benchmarks.md, "JSON decoding"). msgspec refuses everything the standard library
refuses (invalid UTF-8, bad syntax, ints past ``sys.get_int_max_str_digits``) and also a
little it accepts (``NaN``/``Infinity``, numbers that overflow to inf, lone surrogate escapes,
a BOM, raw lone surrogates in a str): whatever msgspec refuses, the caller decodes again with
``json``, so results, errors and their messages are the standard library's own. Where msgspec
accepts, its value is ``json.loads``'s (tests/test_jsonlines.py checks this on thousands of
generated documents).

Records are encoded by ``grader.records.dumps_record``: ``json.dumps(record,
ensure_ascii=False, allow_nan=False)``, byte for byte.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec

NOT_DECODED: Any = object()  # fast_loads could not decide: decode with ``json``

_decode = msgspec.json.Decoder().decode
# Both decoders nest against the interpreter's recursion limit (a fixed C limit from Python
# 3.12), each with its own few frames of margin, so near that limit one may decode what the
# other refuses. msgspec takes only documents that cannot nest _SHALLOW levels (fewer
# brackets than that), far below any limit json meets; deeper ones, and the rare wide ones
# with as many brackets, are json's to decide.
_SHALLOW = 256


def _brackets(data: bytes | str) -> int:
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")


def fast_loads(data: bytes | str) -> Any:
    """``json.loads(data)`` when msgspec can decode ``data``; otherwise ``NOT_DECODED``.

    Bytes must be what the caller would decode as UTF-8 and hand to ``json.loads``.
    """
    # A document shorter than 2 * _SHALLOW cannot hold _SHALLOW opening brackets.
    if len(data) >= 2 * _SHALLOW and _brackets(data) >= _SHALLOW:
        return NOT_DECODED
    try:
        return _decode(data)
    except Exception:  # msgspec.DecodeError, ValidationError, UnicodeDecodeError, RecursionError
        return NOT_DECODED


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
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        digits = sys.get_int_max_str_digits()
        raise JSONError(f"invalid JSON: an integer of more than {digits} digits") from None
    except RecursionError:  # json's decoder recurses once per [ or {
        raise JSONError("invalid JSON: nested too deeply") from None
