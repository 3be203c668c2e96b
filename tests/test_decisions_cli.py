"""report, agree and compare through the CLI, on results the real pipeline wrote."""

from __future__ import annotations

import json

from click.testing import CliRunner
from conftest import EXAMPLES, check_answer, make_request

from grader.cli import main
from grader.run.grading import run_grade

# five different check-pass answers (the fake rubric: 2 facts, 1 term), worst to best
PRESENT = ["nnn", "nny", "ynn", "yyn", "yyy"]


def _results(tmp_path, fake_backend_factory, name, facts):
    fake_backend_factory.replies = [check_answer(PRESENT[f]) for f in facts]
    out = tmp_path / f"{name}.jsonl"
    run_grade(*make_request(EXAMPLES / "qa.jsonl", out),
              backend_factory=fake_backend_factory)
    return out


def test_report_agree_and_compare_work_on_grade_results(tmp_path, fake_backend_factory):
    a = _results(tmp_path, fake_backend_factory, "a", [i % 5 for i in range(21)])
    b = _results(tmp_path, fake_backend_factory, "b", [(i + 1) % 5 for i in range(21)])
    runner = CliRunner()

    html = tmp_path / "report.html"
    done = runner.invoke(main, ["report", str(a), "-o", str(html), "--group-by", "category",
                                "--data", str(EXAMPLES / "qa.jsonl")])
    assert done.exit_code == 0, done.output
    page = html.read_text()
    assert "By category" in page and "data:image/png;base64," in page

    done = runner.invoke(main, ["agree", str(a), "--human", "human_score", "--data",
                                str(EXAMPLES / "qa.jsonl"), "--json", "--bootstrap", "200"])
    assert done.exit_code == 0, done.output
    stats = json.loads(done.output)
    assert stats["n"] == 24  # 21 graded + the 3 missing-context zeros, all with human labels
    for key in ("exact_agreement", "within_one", "quadratic_weighted_kappa", "spearman",
                "kendall", "pearson", "krippendorff_alpha"):
        assert key in stats and key in stats["intervals"]
    assert "kappa" in runner.invoke(main, ["agree", str(a), "--human", "human_score", "--data",
                                           str(EXAMPLES / "qa.jsonl"), "--bootstrap", "200"]).output

    # a results file that carries the human labels itself
    labelled = tmp_path / "labelled.jsonl"
    labels = {json.loads(l)["id"]: json.loads(l)["human_score"] for l in open(EXAMPLES / "qa.jsonl")}
    labelled.write_text("".join(
        json.dumps({**json.loads(l), "human_score": labels[json.loads(l)["id"]]}) + "\n"
        for l in open(a)
    ))
    own = runner.invoke(main, ["agree", str(labelled), "--human", "human_score", "--json",
                               "--bootstrap", "200"])
    assert own.exit_code == 0, own.output
    assert json.loads(own.output)["quadratic_weighted_kappa"] == stats["quadratic_weighted_kappa"]

    done = runner.invoke(main, ["compare", str(a), str(b), "--json", "--bootstrap", "200"])
    assert done.exit_code == 0, done.output
    compared = json.loads(done.output)
    assert compared["n"] == 24
    assert compared["wins"] + compared["ties"] + compared["losses"] == 24

    missing = runner.invoke(main, ["agree", str(a), "--human", "nope", "--data",
                                   str(EXAMPLES / "qa.jsonl")])
    assert missing.exit_code == 2 and "nope" in missing.output
