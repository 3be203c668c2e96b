"""The HTML report: one self-contained file, right numbers, every result string escaped."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from grader.analysis.report import write_report
from grader.analysis.summary import summarize
from grader.cli import main
from grader.judge.judges import SeedJudge
from grader.judge.records import failed_record, judged_record, missing_context_record
from grader.records import Record, parse_record
from grader.status import Status, in_status_order

EVIL = "<script>alert(1)</script>"
EVIL_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


def answer(facts, conclusions, terms, organization="matched", *, said, note="", checklist=None):
    """A seed-format judge answer: ``facts`` etc. are ``(matched, total)``; ``said``: its score."""
    return json.dumps(
        {
            "checklist": checklist or ["Find the facts", "Find the conclusions", "Find the terms"],
            "score": said,
            "rationale": [
                f"Fact: {facts[0]} of {facts[1]} correctly matched.{' ' + note if note else ''}",
                f"Conclusion: {conclusions[0]} of {conclusions[1]} correctly matched.",
                f"Terminology: {terms[0]} of {terms[1]} terms correctly matched.",
                f"Organization: {organization}",
                f"Score: {said}",
            ],
        },
        ensure_ascii=False,
    )


def edited(record: Record, **fields) -> Record:
    """``record`` with ``fields`` written over it, as a hand edit of its line would make it."""
    return parse_record({**record.to_dict(), **fields}, ("edited", 1))


def judged(item_id, facts, conclusions, terms, organization="matched", *, said, **extra):
    """A record as grade builds it from the judge's answer (the score recomputed from counts)."""
    note, checklist = extra.pop("note", ""), extra.pop("checklist", None)
    raw = answer(facts, conclusions, terms, organization, said=said, note=note, checklist=checklist)
    return judged_record(item_id, raw, "stop", **extra)


# Recomputed scores (exact): a1 5, a2 2 (2.31), a3 0 (0.26), b1 4 (4.33), b2 2 (1.64), c4 3
# (3.14); the judge said 3 for a2 and 4 for c4.
RECORDS = [
    judged("a1", (3, 3), (1, 1), (4, 4), said=5, model="alpha"),
    judged("a2", (2, 3), (0, 1), (2, 4), said=3, model="alpha"),
    judged("a3", (0, 3), (0, 1), (1, 4), "mismatched", said=0, model="alpha"),
    judged("b1", (2, 3), (1, 1), (4, 4), said=4, note=EVIL, model="beta"),
    judged("b2", (1, 3), (0, 1), (2, 4), said=2, model="beta"),
    edited(missing_context_record("b3", ["output_text"]), model="beta"),
    judged(
        "c1",
        (9, 3),
        (1, 1),
        (2, 4),
        said=5,
        checklist=["Check the dose", EVIL, "Check the units"],
        model="gamma",
    ),
    failed_record("c2", Status.ENGINE_ERROR, f"CUDA error {EVIL}", model="gamma"),
    judged_record("c3", answer((1, 3), (0, 1), (2, 4), said=2)[:60], "length", model="gamma"),
    judged("c4", (1, 3), (1, 1), (2, 4), said=4, model="gamma"),
]
# The dataset holds a column the records do not: category.
CATEGORIES = {
    "a1": "science",
    "a2": "science",
    "a3": "law",
    "b1": "law",
    "b2": "law",
    "b3": "science",
    "c1": "law",
    "c2": "science",
    "c3": "law",
    "c4": "science",
}


def write_results(directory: Path, records=RECORDS, *, summary: bool = True) -> Path:
    results = directory / "results.jsonl"
    results.write_text(
        "".join((json.dumps(r, ensure_ascii=False) if isinstance(r, dict) else r.to_json()) + "\n"
                for r in records), encoding="utf-8"
    )
    if summary:
        run = {
            "grader_version": "0.1.0",
            "model": {
                "name": "/models/judge",
                "weights": [{"file": "model.safetensors", "bytes": 123}],
            },
            "sampling": {"temperature": 0.0},
            "prompt": {"name": "seed", "sha256": "abc"},
            "note": EVIL,
            "checklist": True,
        }
        (directory / "results.summary.json").write_text(
            json.dumps({"rows": len(records), "run": run}), encoding="utf-8"
        )
    return results


def write_dataset(directory: Path) -> Path:
    data = directory / "answers.jsonl"
    with open(data, "w", encoding="utf-8") as stream:
        for item_id, category in CATEGORIES.items():
            row = {
                "id": item_id,
                "category": category,
                "input": "q",
                "reference": "r",
                "output_text": "" if item_id == "b3" else f"answer {EVIL}",
            }
            stream.write(json.dumps(row) + "\n")
    return data


class Tables(HTMLParser):
    """Every <table> as (class, rows of cell texts); and every section's text by id."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: list[tuple[str, list[list[str]]]] = []
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append((dict(attrs).get("class", ""), []))
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def table(self, name: str) -> list[list[str]]:
        found = [rows for cls, rows in self.tables if cls == name]
        assert len(found) == 1, f"{len(found)} tables of class {name!r}"
        return found[0]

    def rows_by_first(self, name: str) -> dict[str, list[str]]:
        return {row[0]: row[1:] for row in self.table(name)[1:]}


def section(text: str, anchor: str) -> str:
    match = re.search(rf"<section id='{anchor}'>(.*?)</section>", text, re.DOTALL)
    assert match, f"no section {anchor}"
    return match.group(1)


def card_ids(fragment: str) -> list[str]:
    return re.findall(
        r"<div class='card [a-z]+'>\s*<div class='head'><code>(.*?)</code>", fragment
    )


@pytest.fixture
def report(tmp_path) -> tuple[str, dict]:
    results = write_results(tmp_path)
    written = write_report(results, tmp_path / "out" / "report.html", group_by="model")
    return (tmp_path / "out" / "report.html").read_text(encoding="utf-8"), written


def test_one_self_contained_file(report, tmp_path):
    text, written = report
    assert written["output"] == str(tmp_path / "out" / "report.html")
    assert written["rows"] == 10 and written["groups"] == 3 and written["charts"] >= 3
    assert written["bytes"] == len(text.encode("utf-8"))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html"]
    lowered = text.lower()
    for outside in (
        "http://",
        "https://",
        "<script",
        "<link",
        "<iframe",
        "@import",
        "url(",
        "//cdn",
    ):
        assert outside not in lowered, outside
    for attribute, value in re.findall(r"""\b(src|href)\s*=\s*['"]([^'"]*)""", text):
        allowed = "data:image/png;base64," if attribute == "src" else "#"
        assert value.startswith(allowed), (attribute, value[:40])
    assert "<title>grader report: results.jsonl</title>" in text


def test_histogram_is_an_embedded_png(report):
    text, _ = report
    scores = section(text, "scores")
    data = re.search(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", scores).group(1)
    assert base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n")
    # ok rows: 5, 2, 0, 4, 2, 3
    assert Tables(scores).table("hist") == [
        ["score", "0", "1", "2", "3", "4", "5"],
        ["ok rows", "1", "0", "2", "1", "1", "1"],
    ]


def test_summary_and_status_table(report):
    text, _ = report
    tables = Tables(text)
    summary = dict(tables.tables[0][1])  # the first table is the summary
    assert summary["rows"] == "10"
    assert summary["graded (ok)"] == "6"
    assert summary["mean score (ok rows)"] == "2.67"  # 16 / 6
    assert summary["judge score ≠ recomputed"] == "2 of 6 ok rows (33%)"
    statuses = {row[0]: row[1:3] for row in tables.table("statuses")[1:]}
    assert statuses == {
        "ok": ["6", "60%"],
        "missing_context": ["1", "10%"],
        "invalid_counts": ["1", "10%"],
        "truncated": ["1", "10%"],
        "engine_error": ["1", "10%"],
    }
    assert "<img" in section(text, "statuses")


def test_judge_vs_recompute_matrix(report):
    text, _ = report
    matrix = Tables(text).rows_by_first("matrix")
    assert list(matrix) == [f"judge {j}" for j in range(6)]
    expected = {(5, 5): 1, (3, 2): 1, (0, 0): 1, (4, 4): 1, (2, 2): 1, (4, 3): 1}
    for judge in range(6):
        assert matrix[f"judge {judge}"] == [str(expected.get((judge, s), 0)) for s in range(6)]


def test_groups_from_the_records(report):
    text, _ = report
    table = Tables(section(text, "groups")).table("groups")
    head = table[0]
    assert head[:3] == ["model", "rows", "mean score"]
    rows = {row[0]: dict(zip(head[1:], row[1:])) for row in table[1:]}
    assert rows["alpha"] == {
        "rows": "3",
        "mean score": "2.33",
        "ok": "3",
        "missing_context": "0",
        "invalid_counts": "0",
        "truncated": "0",
        "engine_error": "0",
    }
    assert rows["beta"]["rows"] == "3" and rows["beta"]["mean score"] == "3.00"
    assert rows["beta"]["missing_context"] == "1"
    assert rows["gamma"]["mean score"] == "3.00" and rows["gamma"]["ok"] == "1"
    assert [rows["gamma"][s] for s in ("invalid_counts", "truncated", "engine_error")] == ["1"] * 3
    assert "taken from the records" in text


def test_groups_joined_from_the_dataset(tmp_path):
    results = write_results(tmp_path)
    data = write_dataset(tmp_path)
    written = write_report(results, tmp_path / "r.html", group_by="category", data=str(data))
    assert written["groups"] == 2
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    table = Tables(section(text, "groups")).table("groups")
    rows = {row[0]: dict(zip(table[0][1:], row[1:])) for row in table[1:]}
    # science: a1 5, a2 2, c4 3 ok; b3 missing; c2 engine error. law: a3 0, b1 4, b2 2 ok; c1, c3.
    assert rows["science"]["rows"] == "5" and rows["science"]["mean score"] == "3.33"
    assert rows["science"]["missing_context"] == "1" and rows["science"]["engine_error"] == "1"
    assert rows["law"]["rows"] == "5" and rows["law"]["mean score"] == "2.00"
    assert rows["law"]["invalid_counts"] == "1" and rows["law"]["truncated"] == "1"
    assert "taken from the dataset" in text


def test_dataset_column_wins_and_unmatched_ids_are_flagged(tmp_path):
    records = [*RECORDS, judged("zz", (1, 3), (1, 1), (2, 4), said=3, model="alpha")]
    results = write_results(tmp_path, records)
    data = write_dataset(tmp_path)
    write_report(results, tmp_path / "r.html", group_by="category", data=str(data))
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    rows = Tables(section(text, "groups")).rows_by_first("groups")
    assert rows["(not in dataset)"][0] == "1"
    assert "1 of 11 rows have an id that is not in the dataset" in text
    # A column only the records have is still found when a dataset is given.
    write_report(results, tmp_path / "m.html", group_by="model", data=str(data))
    assert "taken from the records" in (tmp_path / "m.html").read_text(encoding="utf-8")


def test_unknown_group_column_is_a_clear_error(tmp_path):
    results = write_results(tmp_path)
    with pytest.raises(ValueError, match="no column 'judge_model'.*pass the dataset"):
        write_report(results, tmp_path / "r.html", group_by="judge_model")
    data = write_dataset(tmp_path)
    with pytest.raises(
        ValueError, match=r"no column 'judge_model' in the dataset .*answers\.jsonl"
    ):
        write_report(results, tmp_path / "r.html", group_by="judge_model", data=str(data))
    assert not (tmp_path / "r.html").exists()


def test_worst_rows_in_order_and_failed_rows(report, tmp_path):
    text, _ = report
    # Lowest score first; ties (a2 2.4, b2 1.6) by the exact score.
    assert card_ids(section(text, "worst")) == ["a3", "b2", "a2", "c4", "b1", "a1"]
    assert card_ids(section(text, "failed")) == ["b3", "c1", "c2", "c3"]
    failed = section(text, "failed")
    assert "CUDA error" in failed and "Check the dose" in failed
    assert "Terminology: 2 of 4 terms correctly matched." in section(text, "worst")
    write_report(write_results(tmp_path), tmp_path / "two.html", worst=2)
    two = (tmp_path / "two.html").read_text(encoding="utf-8")
    assert card_ids(section(two, "worst")) == ["a3", "b2"]


def test_result_text_is_only_ever_escaped(report):
    text, _ = report
    assert "<script" not in text.lower()
    # In the rationale (b1), the error and checklist (c1), and the manifest.
    assert text.count(EVIL_ESCAPED) >= 4
    assert EVIL_ESCAPED in section(text, "worst")
    assert EVIL_ESCAPED in section(text, "manifest")


def test_hostile_ids_and_group_values_are_escaped(tmp_path):
    records = [
        judged(EVIL, (1, 3), (1, 1), (2, 4), said=3, model=EVIL),
        judged_record("x", "not a verdict", "stop", model="<b>"),
    ]
    results = write_results(tmp_path, records)
    write_report(results, tmp_path / "r.html", group_by="model")
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<script" not in text.lower() and "<b>" not in text
    assert EVIL_ESCAPED in section(text, "groups") and "&lt;b&gt;" in text


def test_manifest_table_and_missing_summary(report, tmp_path):
    text, _ = report
    manifest = dict(Tables(section(text, "manifest")).tables[0][1])
    assert manifest["model.name"] == "/models/judge"
    assert manifest["model.weights[0].bytes"] == "123"
    assert manifest["sampling.temperature"] == "0.0"
    assert manifest["checklist"] == "true"
    bare = tmp_path / "bare"
    bare.mkdir()
    write_report(write_results(bare, summary=False), bare / "r.html")
    assert "No results.summary.json beside the results file." in (bare / "r.html").read_text()
    (bare / "results.summary.json").write_text("{not json", encoding="utf-8")
    write_report(bare / "results.jsonl", bare / "r.html")
    assert "could not be read" in (bare / "r.html").read_text()


# Counts the seed's formula scores as 0, 2, 3 and 4.
COUNTS = {
    0: ((0, 3), (0, 1), (1, 4), "mismatched"),
    2: ((1, 3), (0, 1), (2, 4), "matched"),
    3: ((1, 3), (1, 1), (2, 4), "matched"),
    4: ((2, 3), (1, 1), (4, 4), "matched"),
}


def test_rows_where_samples_disagree(tmp_path):
    judge = SeedJudge()

    def sampled(item_id, values):
        samples = [judged(item_id, *COUNTS[v], said=v) for v in values]
        samples.append(judged_record(item_id, answer(*COUNTS[3][:3], said=3)[:60], "length"))
        return judge.aggregate(samples, "median")

    records = [
        sampled("s1", [3, 3]),
        sampled("s2", [0, 4]),
        sampled("s3", [2, 3, 4]),
        judged("plain", *COUNTS[4], said=4),
    ]
    write_report(write_results(tmp_path, records), tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    table = Tables(section(text, "samples")).table("spread")
    assert [row[0] for row in table[1:]] == ["s2", "s3", "s1"]  # widest range first
    assert table[1][2:4] == ["2", "4.00"]  # s2: the median of 0 and 4, its range
    assert table[1][-1] == "0, 4, – (truncated)"
    assert "3 of 3 rows with samples" in text


def test_score_model_results(tmp_path):
    def graded(item_id, result, passed):
        return {
            "id": item_id,
            "status": "ok",
            "result": result,
            "passed": passed,
            "raw_output": json.dumps({"result": result}),
            "finish_reason": "stop",
            "error": None,
            "truncation": None,
        }

    records = [
        graded("r1", 0.9, True),
        graded("r2", 0.2, False),
        graded("r3", 0.7, True),
        {
            "id": "r4",
            "status": "parse_error",
            "result": None,
            "passed": None,
            "raw_output": "oops",
            "finish_reason": "stop",
            "error": 'no numeric "result"',
            "truncation": None,
        },
    ]
    written = write_report(write_results(tmp_path, records, summary=False), tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "id='scores'" not in text  # no 0-5 histogram
    results = section(text, "results")
    assert "pass rate <b>66.7%</b> (2 of 3 rows with a result)" in results
    assert "data:image/png;base64," in results and written["charts"] >= 2
    assert card_ids(section(text, "worst")) == ["r2", "r3", "r1"]
    assert card_ids(section(text, "failed")) == ["r4"]


def test_importing_the_report_loads_no_heavy_module():
    code = (
        "import sys, grader.analysis.report; "
        "print(sorted(m for m in ('matplotlib', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_lone_surrogate_in_a_record_is_shown_not_a_failed_report(tmp_path):
    # grade writes one as a JSON escape (an engine's error text); the page shows that escape
    results = tmp_path / "r.jsonl"
    results.write_text(
        '{"id": "a", "status": "engine_error", "score": null, "error": "x \\udfff y"}\n'
        '{"id": 2, "status": "ok", "score": 3, "raw_output": "z \\ud801"}\n'
    )
    written = write_report(results, tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert written["rows"] == 2 and "x \\udfff y" in page


def test_hostile_text_is_escaped_by_the_cli(tmp_path):
    records = [
        judged(EVIL, *COUNTS[2], said=2),  # an id
        failed_record("e1", Status.ENGINE_ERROR, EVIL),  # an error
        judged_record("p1", EVIL, "stop"),  # the judge's raw text (not a verdict)
    ]
    results = write_results(tmp_path, records, summary=False)
    out = tmp_path / "r.html"
    result = CliRunner().invoke(main, ["report", str(results), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    assert "<script" not in text.lower()
    assert f"<code>{EVIL_ESCAPED}</code>" in section(text, "worst")
    failed = section(text, "failed")
    assert f"<div class='error'>{EVIL_ESCAPED}</div>" in failed
    assert f"judge output: <code>{EVIL_ESCAPED}</code>" in failed
    # A browser shows each as the text it is.
    shown = Text(text)
    assert "script" not in shown.tags and shown.text.count(EVIL) >= 3


class Text(HTMLParser):
    """The tags of a page and its text as a browser shows it (entities decoded)."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.parts: list[str] = []
        self.feed(text)
        self.text = "".join(self.parts)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)

    def handle_data(self, data):
        self.parts.append(data)


def test_status_table_and_counts_are_the_summarys(tmp_path):
    records = [
        *RECORDS,
        judged_record("p1", "not a verdict", "stop", model="beta"),
        edited(failed_record("u1", Status.ENGINE_ERROR, "x", model="alpha"), status="other_tool"),
    ]
    summary = summarize(records)
    results = write_results(tmp_path, records)
    write_report(results, tmp_path / "r.html", group_by="model")
    tables = Tables((tmp_path / "r.html").read_text(encoding="utf-8"))

    shown = [(row[0], row[1]) for row in tables.table("statuses")[1:]]
    listed = [(s, str(n)) for s, n in summary["statuses"].items() if n or s == Status.OK]
    assert shown == listed
    assert [s for s, _ in shown] == in_status_order(s for s, _ in listed)
    assert shown[-1] == ("other_tool", "1")  # another tool's status, after grader's own
    assert tables.table("groups")[0][3:] == [s for s, _ in shown]  # the same columns

    facts = dict(tables.tables[0][1])
    assert facts["rows"] == str(summary["rows"])
    assert facts["graded (ok)"] == str(summary["graded"])
    assert facts["mean score (ok rows)"] == f"{summary['mean_score']:.2f}"
    disagreement = summary["judge_disagreement"]
    assert facts["judge score ≠ recomputed"].startswith(
        f"{disagreement['disagree']} of {disagreement['rows']} ok rows"
    )
    assert tables.table("hist")[1][1:] == [str(n) for n in summary["histogram"].values()]
