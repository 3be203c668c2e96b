"""read_items: JSONL / CSV / Parquet / stdin -> items, ids, --map, missing fields, errors."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES

from grader.io.dataset import (
    REQUIRED_FIELDS,
    Dataset,
    DatasetError,
    detect_format,
    parse_mapping,
    read_items,
)


def _missing(item):
    """The required fields a row leaves empty (its judge's missing_context)."""
    return [name for name in REQUIRED_FIELDS if not item.fields[name]]


SEED = ("input", "reference", "output_text")
ROWS = [
    {"id": "a", "input": "What is 2+2?", "reference": "4", "output_text": "four", "extra": "x"},
    {"id": "b", "input": "Capital?", "reference": "Paris", "output_text": "", "extra": "y"},
    {"id": "c", "input": "", "reference": "H2O", "output_text": "water is H2O", "extra": "z"},
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")
    return path


def _write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _write_parquet(path: Path, columns: dict[str, list]) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table(columns), path)
    return path


def _columns(rows: list[dict]) -> dict[str, list]:
    return {key: [r[key] for r in rows] for key in rows[0]}


def _error(path, **kwargs) -> DatasetError:
    with pytest.raises(DatasetError) as info:
        read_items(str(path), **kwargs)
    message = str(info.value)
    assert "\n" not in message and "\r" not in message, message
    assert message.startswith(f"{path}"), message
    return info.value


def _view(items) -> list[tuple]:
    return [(i.id, i.index, *(i.fields[name] for name in SEED), _missing(i)) for i in items]


# ---------------------------------------------------------------- formats


def test_every_format_gives_the_same_items(tmp_path):
    jsonl = read_items(str(_write_jsonl(tmp_path / "d.jsonl", ROWS)))
    csv_items = read_items(str(_write_csv(tmp_path / "d.csv", ROWS)))
    parquet = read_items(str(_write_parquet(tmp_path / "d.parquet", _columns(ROWS))))
    expected = [
        ("a", 0, "What is 2+2?", "4", "four", []),
        ("b", 1, "Capital?", "Paris", "", ["output_text"]),
        ("c", 2, "", "H2O", "water is H2O", []),
    ]
    assert _view(jsonl) == _view(csv_items) == _view(parquet) == expected
    # every column is visible to the template, not only the seed fields
    extras = [[i.fields["extra"] for i in items] for items in (jsonl, csv_items, parquet)]
    assert extras == [["x", "y", "z"]] * 3
    assert [i.line for i in jsonl] == [1, 2, 3]
    assert [i.line for i in csv_items] == [2, 3, 4]  # line 1 is the header
    assert [i.line for i in parquet] == [1, 2, 3]  # 1-based row numbers


def test_format_is_chosen_by_extension(tmp_path):
    assert detect_format("x.jsonl") == detect_format("x.NDJSON") == detect_format("-") == "jsonl"
    assert detect_format("dir/x.CSV") == "csv"
    assert detect_format("x.parquet") == "parquet"
    # JSONL text in a .csv file is read as CSV, not sniffed: one column, no seed fields
    path = tmp_path / "rows.csv"
    path.write_text("{a}\n{b}\n", encoding="utf-8")
    item = read_items(str(path))[0]
    assert item.fields["{a}"] == "{b}" and _missing(item) == ["reference", "output_text"]


def test_examples_jsonl_and_csv_agree():
    jsonl = read_items(str(EXAMPLES / "qa.jsonl"))
    mapping = parse_mapping(["output_text=response"])
    csv_items = read_items(str(EXAMPLES / "qa.csv"), mapping=mapping)
    assert len(jsonl) == len(csv_items) == 24
    assert [i.id for i in jsonl] == [i.id for i in csv_items] == [f"q{n:02d}" for n in range(1, 25)]
    for a, b in zip(jsonl, csv_items):
        for name in ("input", "reference", "output_text"):
            assert a.fields[name] == b.fields[name], (a.id, name)
        assert _missing(a) == _missing(b)
        assert a.fields["category"] == b.fields["category"]
    missing = {i.id: _missing(i) for i in jsonl if _missing(i)}
    assert missing == {"q10": ["output_text"], "q15": ["reference"], "q18": ["output_text"]}
    # multi-line CSV cells: the line is where the row starts, so later rows are not off by one
    assert csv_items[0].line == 2
    assert all(b.line > a.line for a, b in zip(csv_items, csv_items[1:]))


def test_stdin_is_jsonl(monkeypatch):
    data = "\ufeff" + "".join(json.dumps(r) + "\r\n" for r in ROWS)

    class FakeStdin:
        buffer = io.BytesIO(data.encode("utf-8"))

    monkeypatch.setattr(sys, "stdin", FakeStdin())
    items = read_items("-")
    assert [i.id for i in items] == ["a", "b", "c"]
    assert items[0].fields["reference"] == "4"


def test_stdin_errors_name_dash(monkeypatch):
    class FakeStdin:
        buffer = io.BytesIO(b'{"reference": "r", "output_text": "o"}\n{oops}\n')

    monkeypatch.setattr(sys, "stdin", FakeStdin())
    with pytest.raises(DatasetError, match=r"^-:2: invalid JSON"):
        read_items("-")


# ---------------------------------------------------------------- --map


def test_parse_mapping():
    assert parse_mapping(["output_text=response", " reference = gold "]) == {
        "output_text": "response",
        "reference": "gold",
    }
    assert parse_mapping([]) == {}
    for bad in ["output_text", "=response", "output_text=", " = "]:
        with pytest.raises(ValueError, match="FIELD=COLUMN"):
            parse_mapping([bad])


def test_map_renames_columns_and_keeps_the_originals(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [
        {"q": "question", "gold": "R", "response": "O", "input": "ignored?"},
    ])
    mapping = {"output_text": "response", "reference": "gold", "input": "q"}
    item = read_items(str(path), mapping=mapping)[0]
    assert [item.fields[name] for name in SEED] == ["question", "R", "O"]
    assert item.fields["response"] == "O" and _missing(item) == []


def test_map_applies_to_a_custom_prompts_own_fields(tmp_path):
    row = {"reference": "r", "output_text": "o", "q": "asked"}
    path = _write_jsonl(tmp_path / "d.jsonl", [row])
    item = read_items(str(path), mapping={"question": "q"})[0]
    assert item.fields["question"] == "asked"


def test_map_to_a_column_the_file_lacks_fails(tmp_path):
    for path in (_write_jsonl(tmp_path / "d.jsonl", ROWS), _write_csv(tmp_path / "d.csv", ROWS)):
        err = _error(path, mapping={"output_text": "response"})
        assert "response" in str(err) and "--map output_text=response" in str(err)
        assert err.line in (1, 2)  # the first row


def test_map_to_a_column_some_jsonl_rows_lack_flags_them_missing(tmp_path):
    # like q15's absent "reference" key: a JSONL row without the mapped key is an empty cell
    path = _write_jsonl(tmp_path / "d.jsonl", [
        {"id": 1, "reference": "r", "response": "o"},
        {"id": 2, "reference": "r"},
    ])
    items = read_items(str(path), mapping={"output_text": "response"})
    assert [_missing(i) for i in items] == [[], ["output_text"]]



def test_a_mapped_column_only_later_jsonl_rows_have_is_found_as_they_go(tmp_path):
    """Opening a JSONL file reads its first row only: a column a later row brings is the
    file's all the same, and one no row brings is refused, on the first row's line, once a
    full read has looked for it."""
    rows = [{"id": 1, "reference": "r"}, {"id": 2, "reference": "r", "response": "o"}]
    items = read_items(str(_write_jsonl(tmp_path / "d.jsonl", rows)),
                       mapping={"output_text": "response"})
    assert [_missing(i) for i in items] == [["output_text"], []]
    path = _write_jsonl(tmp_path / "e.jsonl", [{"id": 1, "reference": "r"}, {"id": 2, "x": 1}])
    with Dataset(str(path), mapping={"output_text": "response"}) as dataset:  # opens: no error
        with pytest.raises(DatasetError) as info:
            list(dataset)
    assert info.value.line == 1 and info.value.reason == "--map output_text=response: no column 'response'"
    assert [str(_error(path, mapping={"output_text": "response"}))] == [str(info.value)]

# ---------------------------------------------------------------- ids


def test_id_column_default_explicit_and_absent(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [
        {"id": "x1", "key": 10, "reference": "r", "output_text": "o"},
        {"id": "x2", "key": 20, "reference": "r", "output_text": "o"},
    ])
    assert [i.id for i in read_items(str(path))] == ["x1", "x2"]
    assert [i.id for i in read_items(str(path), id_column="key")] == [10, 20]
    no_ids = _write_csv(tmp_path / "n.csv", [{"reference": "r", "output_text": "o"}] * 3)
    assert [i.id for i in read_items(str(no_ids))] == [0, 1, 2]  # 0-based row number
    err = _error(path, id_column="nope")
    assert err.line == 1 and "'nope'" in err.reason


def test_ids_in_some_jsonl_rows_only_is_an_error(tmp_path):
    # a row without "id" must not silently take its row number (which can even clash with an id)
    path = _write_jsonl(tmp_path / "d.jsonl", [
        {"id": 1, "reference": "r", "output_text": "o"},
        {"reference": "r", "output_text": "o"},
    ])
    err = _error(path)
    assert err.line == 2 and "no value in id column 'id'" in err.reason
    path = _write_jsonl(tmp_path / "e.jsonl", [
        {"reference": "r", "output_text": "o"},
        {"id": "z", "reference": "r", "output_text": "o"},
    ])
    assert _error(path).line == 1


def test_duplicate_ids_name_both_lines(tmp_path):
    rows = [{"id": f"r{n}", "reference": "r", "output_text": "o"} for n in range(4)]
    rows[3]["id"] = "r1"
    err = _error(_write_jsonl(tmp_path / "d.jsonl", rows))
    assert err.line == 4
    assert str(err) == f"{tmp_path / 'd.jsonl'}:4: duplicate id 'r1' (first on line 2)"
    err = _error(_write_csv(tmp_path / "d.csv", rows))
    assert err.line == 5 and "first on line 3" in err.reason


def test_float_ids_become_ints(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [
        {"id": 3.0, "reference": "r", "output_text": "o"},
        {"id": 4, "reference": "r", "output_text": "o"},
    ])
    ids = [i.id for i in read_items(str(path))]
    assert ids == [3, 4] and all(type(i) is int for i in ids)
    parquet = _write_parquet(tmp_path / "d.parquet", {
        "id": [1.0, 2.0], "reference": ["r", "r"], "output_text": ["o", "o"],
    })
    assert [i.id for i in read_items(str(parquet))] == [1, 2]
    clash = _write_jsonl(tmp_path / "c.jsonl", [
        {"id": 3, "reference": "r", "output_text": "o"},
        {"id": 3.0, "reference": "r", "output_text": "o"},
    ])
    assert "duplicate id 3" in _error(clash).reason


@pytest.mark.parametrize("bad, reason", [
    (3.5, "must be a string or an integer"),
    (True, "must be a string or an integer"),  # bool is an int to Python
    ([1], "must be a string or an integer"),
    ({"a": 1}, "must be a string or an integer"),
    (None, "no value in id column"),
    ("  ", "no value in id column"),
])
def test_unusable_ids_are_errors(tmp_path, bad, reason):
    path = _write_jsonl(tmp_path / "d.jsonl", [
        {"id": "x", "reference": "r", "output_text": "o"},
        {"id": bad, "reference": "r", "output_text": "o"},
    ])
    err = _error(path)
    assert err.line == 2 and reason in err.reason


def test_nan_id_in_parquet_is_an_error(tmp_path):
    path = _write_parquet(tmp_path / "d.parquet", {
        "id": [1.0, float("nan")], "reference": ["r", "r"], "output_text": ["o", "o"],
    })
    err = _error(path)
    assert err.line == 2 and "no value in id column" in err.reason


# ---------------------------------------------------------------- malformed files


def test_bad_json_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    text = '{"reference": "r", "output_text": "o"}\n\n{"reference": "r",}\n'
    path.write_text(text, encoding="utf-8")
    err = _error(path)
    assert str(err).startswith(f"{path}:3: invalid JSON")
    assert (err.path, err.line) == (str(path), 3)


@pytest.mark.parametrize(
    "line, kind", [("[1, 2]", "list"), ('"text"', "str"), ("null", "NoneType"), ("7", "int")]
)
def test_a_json_line_that_is_not_an_object(tmp_path, line, kind):
    path = tmp_path / "d.jsonl"
    path.write_text('{"reference": "r", "output_text": "o"}\n' + line + "\n", encoding="utf-8")
    assert str(_error(path)) == f"{path}:2: expected a JSON object, got {kind}"


def test_invalid_utf8_in_jsonl_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(
        b'{"reference": "r", "output_text": "o"}\n{"reference": "caf\xe9", "output_text": "o"}\n'
    )
    err = _error(path)
    assert err.line == 2 and "UTF-8" in err.reason


def test_invalid_utf8_in_csv_names_the_line(tmp_path):
    path = tmp_path / "d.csv"
    # the bad byte is on line 4, after a quoted cell spanning lines 2-3
    path.write_bytes(b'reference,output_text\n"two\nlines",o\nr,caf\xe9\n')
    err = _error(path)
    assert err.line == 4 and "UTF-8" in err.reason


def test_csv_row_with_the_wrong_number_of_fields(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('id,reference,output_text\n1,r,o\n2,"a\nb",o,extra\n', encoding="utf-8")
    assert str(_error(path)) == f"{path}:3: row has 4 fields, the header has 3"


def test_csv_unclosed_quote_is_an_error_not_a_swallowed_file(tmp_path):
    # without strict parsing the rest of the file became row 2's last cell, silently
    path = tmp_path / "d.csv"
    path.write_text('id,reference,output_text\n1,r,"o\n2,r,o\n3,r,o\n', encoding="utf-8")
    err = _error(path)
    assert err.line == 2 and "never closed" in err.reason


def test_csv_text_after_a_closing_quote_is_an_error(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('id,reference,output_text\n1,r,o\n2,"r"x,o\n', encoding="utf-8")
    err = _error(path)
    assert err.line == 3 and "invalid CSV" in err.reason


def test_csv_duplicate_header(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("reference,reference,output_text\nr,r,o\n", encoding="utf-8")
    assert _error(path).line == 1


def test_csv_cells_longer_than_csvs_default_limit(tmp_path):
    long = "word " * 40_000  # 200 kB: more than the csv module's 128 KiB default field limit
    path = _write_csv(tmp_path / "d.csv", [{"reference": "r", "output_text": long}])
    assert read_items(str(path))[0].fields["output_text"] == long


@pytest.mark.parametrize("name, content, line", [
    ("empty.jsonl", b"", None),
    ("blank.jsonl", b"\n  \n\r\n", None),
    ("empty.csv", b"", 1),
    ("header.csv", b"reference,output_text\n", None),
])
def test_empty_files(tmp_path, name, content, line):
    path = tmp_path / name
    path.write_bytes(content)
    err = _error(path)
    assert err.line == line
    assert ("no rows" in err.reason) or ("empty" in err.reason)


def test_empty_parquet(tmp_path):
    path = _write_parquet(tmp_path / "d.parquet", {"reference": [], "output_text": []})
    assert "no rows" in _error(path).reason


def test_unknown_extension(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text("x", encoding="utf-8")
    err = _error(path)
    assert err.line is None and ".txt" in err.reason and ".jsonl" in err.reason
    assert ".gz" in _error(tmp_path / "d.jsonl.gz").reason


@pytest.mark.parametrize("name", ["missing.jsonl", "missing.csv", "missing.parquet"])
def test_a_file_that_does_not_exist(tmp_path, name):
    # a DatasetError (one line for the CLI), not a FileNotFoundError traceback
    err = _error(tmp_path / name)
    assert err.line is None


def test_a_directory_is_not_a_dataset(tmp_path):
    (tmp_path / "dir.jsonl").mkdir()
    (tmp_path / "dir.csv").mkdir()
    _error(tmp_path / "dir.jsonl")
    _error(tmp_path / "dir.csv")


def test_a_corrupt_parquet_file(tmp_path):
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1 this is not\nreally parquet")
    err = _error(path)
    assert "Parquet" in err.reason


# ---------------------------------------------------------------- encodings, line endings, values


def test_bom_is_ignored(tmp_path):
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_bytes(b"\xef\xbb\xbf" + b'{"id": "a", "reference": "r", "output_text": "o"}\n')
    assert read_items(str(jsonl))[0].id == "a"
    csv_path = tmp_path / "d.csv"
    csv_path.write_bytes(b"\xef\xbb\xbfid,reference,output_text\na,r,o\n")
    item = read_items(str(csv_path))[0]
    assert item.id == "a" and "id" in item.fields and "\ufeffid" not in item.fields


def test_crlf_line_endings(tmp_path):
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_bytes(
        b'{"id": "a", "reference": "r", "output_text": "o"}\r\n'
        b'{"id": "b", "reference": "r2", "output_text": "o2"}\r\n'
    )
    csv_path = tmp_path / "d.csv"
    csv_path.write_bytes(b'id,reference,output_text\r\na,r,o\r\nb,r2,"two\r\nlines"\r\n\r\n')
    j, c = read_items(str(jsonl)), read_items(str(csv_path))
    assert [(i.id, i.fields["reference"]) for i in j] == [(i.id, i.fields["reference"]) for i in c]
    assert not any(v.endswith("\r") for i in j + c for v in i.fields.values() if isinstance(v, str))
    # a quoted cell keeps its line break, normalised to \n like every text field
    assert c[1].fields["output_text"] == "two\nlines"
    assert [i.line for i in c] == [2, 3]


def test_whitespace_only_fields_are_missing(tmp_path):
    rows = [
        {"id": "a", "input": " ", "reference": "  \t", "output_text": "\n"},
        {"id": "b", "input": "q", "reference": "r", "output_text": " o "},
    ]
    for path in (_write_jsonl(tmp_path / "d.jsonl", rows), _write_csv(tmp_path / "d.csv", rows)):
        a, b = read_items(str(path))
        assert _missing(a) == ["reference", "output_text"]
        assert a.fields["input"] == ""  # optional, but blank all the same
        assert _missing(b) == [] and b.fields["output_text"] == " o "  # real text is kept as written


def test_absent_keys_and_nulls_are_missing(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [
        {"id": 1, "output_text": "o"},
        {"id": 2, "reference": None, "output_text": None},
        {"id": 3, "reference": "r", "output_text": "o"},
    ])
    items = read_items(str(path))
    assert [_missing(i) for i in items] == [["reference"], ["reference", "output_text"], []]
    assert items[1].fields["reference"] == "" and items[0].fields["input"] == ""


def test_numbers_and_structures_become_text(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [
        {"id": 1, "input": 7, "reference": 0, "output_text": 2.5},
        {"id": 2, "input": ["a", "b"], "reference": {"k": "é"}, "output_text": False},
    ])
    a, b = read_items(str(path))
    assert [a.fields[name] for name in SEED] == ["7", "0", "2.5"]
    assert _missing(a) == []  # 0 is an answer, not an empty cell
    assert [b.fields[name] for name in SEED] == ['["a", "b"]', '{"k": "é"}', "false"]  # as JSON writes it (issue 19)


def test_nan_in_parquet_is_missing(tmp_path):
    path = _write_parquet(tmp_path / "d.parquet", {
        "id": ["a", "b", "c"],
        "reference": [1.5, float("nan"), None],
        "output_text": ["o", "o", "o"],
    })
    items = read_items(str(path))
    assert [_missing(i) for i in items] == [[], ["reference"], ["reference"]]
    assert items[0].fields["reference"] == "1.5"


def test_index_counts_rows_not_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    row = '{"reference": "r", "output_text": "o"}\n'
    path.write_text("\n" + row + "\n" + row, encoding="utf-8")
    items = read_items(str(path))
    assert [(i.id, i.index, i.line) for i in items] == [(0, 0, 2), (1, 1, 4)]


def test_stdin_leaves_no_copy_behind(monkeypatch, tmp_path):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the copy of stdin goes

    class FakeStdin:
        buffer = io.BytesIO("".join(json.dumps(r) + "\n" for r in ROWS).encode())

    monkeypatch.setattr(sys, "stdin", FakeStdin())
    assert [i.id for i in read_items("-")] == ["a", "b", "c"]
    assert list(tmp_path.iterdir()) == []
    # nor when the data is bad
    FakeStdin.buffer = io.BytesIO(b"{oops}\n")
    with pytest.raises(DatasetError, match=r"^-:1: invalid JSON"):
        read_items("-")
    assert list(tmp_path.iterdir()) == []


def test_a_required_field_is_looked_for_in_every_jsonl_row_and_only_the_csv_header(tmp_path):
    """Dataset.require_field (the pairwise format's two answers): a column the first JSONL
    row lacks may come later; a CSV header without it is refused when the file opens."""
    rows = [{"id": 1, "output_a": "a"}, {"id": 2, "output_a": "a", "output_b": "b"}]
    with Dataset(str(_write_jsonl(tmp_path / "d.jsonl", rows))) as dataset:
        dataset.require_field("output_b", "no output_b")
        assert [item.fields.get("output_b") for item in dataset] == [None, "b"]
    with Dataset(str(_write_jsonl(tmp_path / "e.jsonl", rows[:1]))) as dataset:
        dataset.require_field("output_b", "no output_b")
        with pytest.raises(DatasetError, match=r"e\.jsonl: no output_b$"):
            list(dataset)
    with Dataset(str(_write_csv(tmp_path / "d.csv", rows[:1]))) as dataset:
        with pytest.raises(DatasetError, match=r"d\.csv: no output_b$"):
            dataset.require_field("output_b", "no output_b")
