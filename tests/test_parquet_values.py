"""Parquet values JSON has no kind for (dates, timestamps, decimals, binary, maps), at any depth,
become JSON's kinds; a row's non-string values reach the judge as JSON writes them; ``grade -``
with stdin closed is one line (issue 19, item 9)."""

from __future__ import annotations

import datetime
import decimal
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grader.io.dataset import read_items
from grader.judge.prompts import compile_prompt, render_messages

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _table_with_every_kind(path: Path) -> Path:
    table = pa.table({
        "id": [1, 2],
        "reference": ["The sky is blue.", "r"],
        "output_text": pa.array([b"blue \xff sky", "héllo".encode()], pa.binary()),
        "times": pa.array([[datetime.datetime(2024, 1, 1, 12, 30)], []], pa.list_(pa.timestamp("ns"))),
        "prices": pa.array([[decimal.Decimal("1.10")], None], pa.list_(pa.decimal128(5, 2))),
        "blobs": pa.array([[b"a", b"\xff"], []], pa.list_(pa.binary())),
        "meta": pa.array([{"day": datetime.date(2024, 1, 2), "ok": True}, None],
                         pa.struct([("day", pa.date32()), ("ok", pa.bool_())])),
        "flag": [True, False],
        "counts": pa.array([[("k", 1)], []], pa.map_(pa.string(), pa.int64())),
        "wait": pa.array([datetime.timedelta(seconds=90), None], pa.duration("s")),
    })
    pq.write_table(table, path)
    return path


def test_parquet_values_become_json_values(tmp_path):
    items = read_items(str(_table_with_every_kind(tmp_path / "d.parquet")))
    first, second = (item.fields for item in items)
    assert first["output_text"] == "base64:" + "Ymx1ZSD/IHNreQ=="  # not UTF-8: Base64
    assert second["output_text"] == "héllo"  # UTF-8 binary is its text, never b'...'
    assert first["times"] == ["2024-01-01T12:30:00"]
    assert first["prices"] == ["1.10"]
    assert first["blobs"] == ["a", "base64:/w=="]
    assert first["meta"] == {"day": "2024-01-02", "ok": True}
    assert first["counts"] == [["k", 1]]
    assert first["wait"] == "0:01:30"
    json.dumps([item.fields for item in items])  # every value JSON can hold


def test_non_string_values_reach_the_judge_as_json(tmp_path):
    items = read_items(str(_table_with_every_kind(tmp_path / "d.parquet")),
                       mapping={"reference": "flag"})
    assert [item.fields["reference"] for item in items] == ["true", "false"]  # not True/False
    prompt = compile_prompt("p", Path("p.yaml"), "0", [(
        "user", "{{ item.flag }} {{ item.meta }} {{ item.blobs }} {{ item.prices }} {{ item.none }}")])
    [message] = render_messages(prompt, {**items[0].fields, "none": None})
    assert message["content"] == 'true {"day": "2024-01-02", "ok": true} ["a", "base64:/w=="] ["1.10"] null'


def test_grading_stdin_when_it_is_closed_is_one_line(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    command = (f"exec 0<&-; exec {sys.executable} -m grader grade - -m {model} "
               f"-o {tmp_path / 'r.jsonl'} --backend transformers")
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == ("error: -: stdin is closed: pipe the data in "
                                     "(grader grade - < FILE) or pass the file's path")
