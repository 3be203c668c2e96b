"""grader.io.jsonlines: the fast decoder gives json.loads's value or declines; the encoder is
json.dumps(ensure_ascii=False, allow_nan=False) byte for byte."""

from __future__ import annotations

import json
import math
import random
import struct

import pytest

from grader.io.jsonlines import NOT_DECODED, fast_loads
from grader.records import dumps_record


def _same(a, b) -> bool:
    """Equal values of the same types, floats bit for bit, dict keys in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


def _check(data: bytes) -> str:
    """'fast' when fast_loads decoded it (and agrees with json), else 'declined'."""
    fast = fast_loads(data)
    if fast is NOT_DECODED:
        return "declined"
    slow = json.loads(data.decode("utf-8"))  # must not raise where msgspec accepted
    assert _same(fast, slow), (data[:200], fast, slow)
    return "fast"


_TEXT = "aé€😀\"\\/\b\f\n\r\t\x00\x1f\x7f\u2028 ,:{}[]"


def _value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth < 4 and roll < 0.15:
        return {
            "".join(rng.choices(_TEXT, k=rng.randint(0, 4))): _value(rng, depth + 1)
            for _ in range(rng.randint(0, 4))
        }
    if depth < 4 and roll < 0.3:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if roll < 0.45:
        return "".join(rng.choices(_TEXT, k=rng.randint(0, 12)))
    if roll < 0.6:
        return rng.choice((0, -1, 7, 2**63 - 1, 2**63, 2**64, -(2**64), 10**30, -(10**200)))
    if roll < 0.8:
        bits = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        return bits if math.isfinite(bits) else rng.random()
    return rng.choice((None, True, False, 0.0, -0.0, 4.0375, 1e-7, 1e16))


def _number_texts(rng: random.Random) -> list[bytes]:
    texts = [b"-0", b"-0.0", b"0e999999", b"1e-400", b"2.4703282292062327e-324", b"1E+2",
             b"9007199254740993", b"9007199254740993.0", b"123456789012345678901234567890.5"]
    for _ in range(3000):
        digits = "".join(rng.choices("0123456789", k=rng.randint(1, 25)))
        fraction = "".join(rng.choices("0123456789", k=rng.randint(0, 25)))
        text = digits.lstrip("0") or "0"
        if fraction:
            text += "." + fraction
        if rng.random() < 0.5:
            text += f"e{rng.choice('+-')}{rng.randint(0, 330)}"
        texts.append(("-" if rng.random() < 0.3 else "").encode() + text.encode())
    return texts


def test_fast_loads_agrees_with_json_or_declines():
    rng = random.Random(0)
    outcomes = {"fast": 0, "declined": 0}
    documents = [
        json.dumps(_value(rng), ensure_ascii=rng.random() < 0.3, separators=rng.choice(
            ((",", ":"), (", ", ": "), (" ,\n", " :\t")))).encode()
        for _ in range(4000)
    ]
    documents += [b"[" + n + b"]" for n in _number_texts(rng)]
    for document in list(documents):
        outcomes[_check(document)] += 1
        for _ in range(3):  # and broken variants of it: a byte changed, dropped or added
            mutated = bytearray(document)
            position = rng.randrange(len(mutated) + 1)
            action = rng.random()
            if action < 0.4 and position < len(mutated):
                mutated[position] = rng.randrange(256)
            elif action < 0.7 and position < len(mutated):
                del mutated[position]
            else:
                mutated.insert(position, rng.choice(b'"\\{}[],:0-.eE \t\n\x0c\xa0\xff\xc3'))
            try:
                outcomes[_check(bytes(mutated))] += 1
            except (UnicodeDecodeError, ValueError, RecursionError):
                pytest.fail(f"fast_loads accepted what json refuses: {bytes(mutated)[:200]!r}")
    assert outcomes["fast"] > 10_000 and outcomes["declined"] > 1_000  # both paths exercised


@pytest.mark.parametrize(
    "data",
    [
        b"NaN", b"[Infinity]", b"-Infinity", b"1e999", b"[1.7976931348623159e308]",
        b'"\\ud800"', b'"\\udc00\\ud800"', b"\xef\xbb\xbf{}", b'"\xff"', b'"\xed\xa0\x80"',
        b'"a\tb"', b'"a\x00b"', b"\x0c1", b"[1,]", b"01", b"", b"  ", b"1" * 4301,
        "\"\ud800\"",  # a str holding a lone surrogate: json.loads takes it, msgspec cannot
    ],
)
def test_what_only_json_accepts_or_nobody_does_is_declined(data):
    assert fast_loads(data) is NOT_DECODED


def test_str_and_bytes_decode_alike():
    text = '{"rationale": ["Fact: 1 of 2 é 😀"], "score": 3}'
    assert _same(fast_loads(text), json.loads(text))
    assert _same(fast_loads(text.encode()), json.loads(text))


def _max_depth(load, extra_frames: int) -> int:
    def nested(frames: int) -> int:
        if frames:
            return nested(frames - 1)
        low, high = 0, 20_001  # low decodes, high does not (Python 3.13's C limit is 10,000)
        while high - low > 1:
            depth = (low + high) // 2
            try:
                load(b"[" * depth + b"]" * depth)
                low = depth
            except RecursionError:
                high = depth
        return low

    return nested(extra_frames)


@pytest.mark.parametrize("extra_frames", [0, 40, 120])
def test_nothing_nested_too_deeply_for_json_is_decoded(extra_frames):
    def fast(data):
        if fast_loads(data) is NOT_DECODED:
            raise RecursionError
    json_deepest = _max_depth(lambda d: json.loads(d.decode()), extra_frames)
    fast_deepest = _max_depth(fast, extra_frames)
    assert 0 < fast_deepest <= json_deepest < 20_000


class _Text(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {"id": "row-1", "status": "ok", "score": 4, "score_exact": 4.0375, "x": None,
         "grade": {"rationale": ["Fact: 1 of 2", "é 😀 \u2028 \x00 \x7f \"q\" \\"]},
         "nested": [[1, 2.5e-07, -0.0, True, False], {}, []], "big": 10**40},
        {1: "int key", 2.5: "float key", False: "bool", None: "none"},
        {"t": (1, 2), "s": _Text("sub")},
        "a bare string é",
        [1e16, 1e-05, 123456789.123456789],
    ],
)
def test_dumps_record_is_json_dumps(value):
    assert dumps_record(value) == json.dumps(value, ensure_ascii=False, allow_nan=False)


@pytest.mark.parametrize("value", [{"x": float("nan")}, {"x": [float("inf")]}, {"x": {1, 2}}])
def test_dumps_record_fails_as_json_dumps_does(value):
    with pytest.raises((ValueError, TypeError)) as expected:
        json.dumps(value, ensure_ascii=False, allow_nan=False)
    with pytest.raises(expected.type, match=str(expected.value)[:30]):
        dumps_record(value)


def test_dumps_record_reports_a_circular_record_as_json_does():
    circular: dict = {"id": 1}
    circular["self"] = circular
    with pytest.raises(ValueError, match="Circular reference detected"):
        dumps_record(circular)
