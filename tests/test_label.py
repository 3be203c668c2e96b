"""grader label without a browser: the labels file (grader.io.labels), the session's resume,
order and stale answers, the server's token, and each refusal as one line and an exit code.
The page in a real browser: tests/test_label_browser.py."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from grader.cli import main
from grader.io.labels import (
    LabelFileError,
    TextsNotFound,
    answer_digest,
    is_label_file,
    labels_of_run,
    read_labels,
    results_key,
)
from grader.io.lock import OutputLock
from grader.label.estimate import estimate_mean
from grader.label.server import LabelServer
from grader.label.session import LabelError, open_session

ROWS = [
    {"id": f"q{i}", "input": f"question {i}", "reference": f"reference {i}",
     "output_text": f"answer {i}"}
    for i in range(8)
]


def write_run(directory: Path, rows=ROWS, scores=None) -> tuple[Path, Path]:
    """A dataset and its results file (seed records; row 3 failed: no score)."""
    data = directory / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    results = directory / "results.jsonl"
    lines = []
    for i, row in enumerate(rows):
        score = (scores or {}).get(row["id"], i % 6)
        failed = i == 3
        lines.append(json.dumps({"id": row["id"], "status": "truncated" if failed else "ok",
                                 "score": None if failed else score, "format": "seed"}))
    results.write_text("\n".join(lines) + "\n")
    return data, results


def texts(rows=ROWS):
    return {r["id"]: (r["input"], r["reference"], r["output_text"]) for r in rows}


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the file format -------------------------------------------------------------------------


def test_answer_digest_is_sha256_of_the_three_texts_joined_by_nul():
    import hashlib

    assert answer_digest("q", "r", "a") == hashlib.sha256(b"q\0r\0a").hexdigest()
    # the NUL keeps the parts apart: moving text between them changes the digest
    assert answer_digest("qr", "", "a") != answer_digest("q", "r", "a")


def test_results_key_depends_on_the_ids_not_their_order():
    assert results_key(["a", "b"]) == results_key(["b", "a"])
    assert results_key(["a", "b"]) != results_key(["a", "c"])


def test_labels_are_appended_as_given_and_read_back(tmp_path):
    data, results = write_run(tmp_path)
    out = tmp_path / "labels.jsonl"
    session = open_session(results, out, data=str(data), seed=7)
    order = session.order
    session.label(0, 4, "fine")
    session.label(1, None, None)  # skipped
    session.label(2, 1, None)
    session.label(0, 5, None)  # a later line replaces an earlier one
    # on disk at once, before close: a kill -9 now loses nothing
    written = lines(out)
    assert written[0]["grader_labels"] == 1 and written[0]["seed"] == 7
    assert written[0]["order"] == list(order) and written[0]["sample"] is None
    assert [e["human"] for e in written[1:]] == [4, None, 1, 5]
    assert written[2]["skipped"] is True and written[1]["note"] == "fine"
    session.close()

    labels = read_labels(out, texts(), results_key=results_key(texts()))
    assert labels.scores == {order[0]: 5, order[2]: 1}
    assert labels.skipped == (order[1],)
    assert labels.stale == () and labels.unknown == ()
    assert labels.seed == 7 and labels.order == order and labels.random is True


def test_resume_goes_on_in_the_same_order_where_it_stopped(tmp_path):
    data, results = write_run(tmp_path)
    out = tmp_path / "labels.jsonl"
    first = open_session(results, out, data=str(data), seed=3, sample=5)
    assert len(first.order) == 5
    first.label(0, 2, None)
    first.label(1, 3, None)
    order = first.order
    first.close()

    again = open_session(results, out, data=str(data))  # seed and sample from the file
    assert again.order == order
    assert again.state()["next"] == 2 and again.state()["labeled"] == 2
    again.label(2, 4, None)
    again.close()
    assert len(lines(out)) == 1 + 3  # one header, three labels: nothing rewritten


def test_a_label_after_the_first_open_row_is_refused(tmp_path):
    # the rows labeled stay the first ones of the random order: a random sample
    data, results = write_run(tmp_path)
    session = open_session(results, tmp_path / "l.jsonl", data=str(data))
    with pytest.raises(LabelError, match="label or skip that one first"):
        session.label(2, 3, None)
    with pytest.raises(LabelError, match="0-5"):
        session.label(0, 6, None)
    session.close()


def test_a_changed_answer_makes_its_label_stale_and_offers_the_row_again(tmp_path):
    data, results = write_run(tmp_path)
    out = tmp_path / "labels.jsonl"
    session = open_session(results, out, data=str(data))
    first, second = session.order[:2]
    session.label(0, 4, None)
    session.label(1, 2, None)
    session.close()

    changed = [dict(r, output_text="a new answer") if r["id"] == first else r for r in ROWS]
    data.write_text("".join(json.dumps(r) + "\n" for r in changed))
    labels = read_labels(out, texts(changed))
    assert labels.stale == (first,) and labels.scores == {second: 2}
    # the first position is open again: the person labels the new answer
    again = open_session(results, out, data=str(data))
    assert again.stale == (first,) and again.state()["next"] == 0
    again.close()


def test_unknown_ids_are_named_and_not_used(tmp_path):
    data, results = write_run(tmp_path)
    out = tmp_path / "labels.jsonl"
    session = open_session(results, out, data=str(data))
    session.label(0, 4, None)
    name = session.order[0]
    session.close()
    fewer = {k: v for k, v in texts().items() if k != name}
    labels = read_labels(out, fewer)
    assert labels.unknown == (name,) and labels.scores == {}


def test_a_torn_last_line_is_left_out_and_cut_on_resume(tmp_path):
    data, results = write_run(tmp_path)
    out = tmp_path / "labels.jsonl"
    session = open_session(results, out, data=str(data))
    session.label(0, 4, None)
    session.close()
    with open(out, "a") as stream:
        stream.write('{"id": "q1", "dig')  # a kill -9 in the middle of a write
    assert len(read_labels(out, texts()).scores) == 1
    again = open_session(results, out, data=str(data))
    again.label(1, 3, None)
    again.close()
    assert [e["human"] for e in lines(out)[1:]] == [4, 3]


@pytest.mark.parametrize(("line", "reason"), [
    ('{"id": "q0", "digest": "d", "human": 6, "skipped": false, "note": null, "position": 0, '
     '"at": "t"}', "human 6 is not a score 0-5"),
    ('{"id": "q0", "digest": "d", "human": 2.5, "skipped": false, "note": null, "position": 0, '
     '"at": "t"}', "is not a score 0-5"),
    ('{"id": "q0", "digest": "d", "human": null, "skipped": false, "note": null, "position": 0, '
     '"at": "t"}', "not both or neither"),
    ('{"id": "q0", "human": 3, "skipped": false, "note": null, "position": 0, "at": "t"}',
     "digest is missing"),
    ("not json", "not JSON"),
])
def test_a_bad_label_line_names_the_file_and_line(tmp_path, line, reason):
    out = tmp_path / "labels.jsonl"
    header = {"grader_labels": 1, "results": "r", "results_key": "k", "seed": 0,
              "sample": None, "order": ["q0"]}
    out.write_text(json.dumps(header) + "\n" + line + "\n")
    with pytest.raises(LabelFileError, match=rf"labels.jsonl:2: .*{reason}"):
        read_labels(out, texts())


def test_labels_of_run_reads_them_as_agree_and_report_will(tmp_path):
    # the texts from the dataset the run recorded; the key checked against the run's rows
    data, results = write_run(tmp_path)
    (tmp_path / "results.summary.json").write_text(json.dumps({"run": {"data": str(data)}}))
    out = tmp_path / "labels.jsonl"
    session = open_session(results, out, sample=3)
    session.label(0, 5, None)
    name = session.order[0]
    session.close()
    labels = labels_of_run(out, results)
    assert labels.scores == {name: 5} and labels.sample == 3 and labels.random
    (tmp_path / "results.summary.json").unlink()  # nowhere to read the texts now
    with pytest.raises(TextsNotFound, match="give the graded data with --data"):
        labels_of_run(out, results)
    assert labels_of_run(out, results, data=str(data)).scores == {name: 5}


def test_labels_not_at_the_start_of_the_order_are_not_a_random_sample(tmp_path):
    data, results = write_run(tmp_path)
    out = tmp_path / "labels.jsonl"
    open_session(results, out, data=str(data)).close()
    header = json.loads(out.read_text())
    last = header["order"][-1]  # a label given out of order, by hand
    row = ROWS[int(last[1:])]
    event = {"id": last, "digest": answer_digest(row["input"], row["reference"],
                                                 row["output_text"]),
             "human": 3, "skipped": False, "note": None, "position": 7, "at": "t"}
    with open(out, "a") as stream:
        stream.write(json.dumps(event) + "\n")
    labels = read_labels(out, texts())
    assert labels.scores == {last: 3} and labels.random is False


def test_label_imports_no_model_library(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    data, results = write_run(tmp_path)
    code = ("import sys; from click.testing import CliRunner; from grader.cli import main; "
            f"r = CliRunner().invoke(main, ['label', {str(results)!r}, '-o', {str(results)!r}, "
            f"'--data', {str(data)!r}, '--no-browser']); assert r.exit_code == 2, r.output; "
            "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert done.stdout.strip() == "[]"


def test_is_label_file(tmp_path):
    _, results = write_run(tmp_path)
    assert not is_label_file(results)
    assert not is_label_file(tmp_path / "missing.jsonl")
    with pytest.raises(LabelFileError, match="results.jsonl:1: not a grader labels file"):
        read_labels(results, texts())


def test_the_interval_is_students_t_of_the_labels():
    from scipy import stats

    assert estimate_mean({"a": 3}, {}) is None  # one label: no spread yet
    values = [2, 3, 3, 4, 3, 2, 4, 3]
    estimate = estimate_mean({str(i): v for i, v in enumerate(values)}, {})
    low, high = stats.t.interval(0.95, 7, loc=3, scale=stats.sem(values))
    assert 0 < low < high < 5 and estimate.mean == 3 and estimate.n == 8
    assert estimate.low == pytest.approx(low) and estimate.high == pytest.approx(high)
    assert estimate.width == pytest.approx(high - low)
    # two labels: a t interval wider than the scale, cut to 0-5
    wide = estimate_mean({"a": 2, "b": 5}, {})
    assert (wide.low, wide.high) == (0, 5) and wide.mean == 3.5


def test_from_ten_labels_the_page_shows_the_calibrated_interval_as_agree_computes_it():
    from grader.analysis.calibration import calibrated_mean

    rng = np.random.default_rng(0)
    truth = rng.integers(0, 6, 400)
    judge = {str(i): int(min(5, t + 1)) for i, t in enumerate(truth)}  # overrates by about 1
    human = {str(i): int(truth[i]) for i in range(40)}
    estimate = estimate_mean(human, judge)
    expected = calibrated_mean(list(human.values()), [judge[k] for k in human],
                               [judge[str(i)] for i in range(40, 400)])
    assert expected.fallback is None and "calibrated" in estimate.method and estimate.n == 40
    assert estimate.mean == pytest.approx(expected.mean)
    assert (estimate.low, estimate.high) == pytest.approx(expected.interval)
    # nine labels: the labels alone
    nine = estimate_mean({k: human[k] for k in list(human)[:9]}, judge)
    assert nine.method.startswith("labels only") and nine.n == 9


# --- the server ------------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path):
    data, results = write_run(tmp_path)
    session = open_session(results, tmp_path / "labels.jsonl", data=str(data))
    server = LabelServer(0)
    thread = threading.Thread(target=server.serve, args=(session,),
                              kwargs={"open_browser": False}, daemon=True)
    thread.start()
    yield server, session
    server.shutdown()
    thread.join()
    session.close()


def fetch(url: str, body: dict | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_a_request_without_the_token_is_refused(served):
    server, _ = served
    base = f"http://127.0.0.1:{server.server_address[1]}"
    for path in ("/", "/api/state", "/api/row?position=0", "/?token=wrong"):
        assert fetch(base + path)[0] == 403
    status, _ = fetch(base + "/api/label?token=wrong", {"position": 0, "human": 3})
    assert status == 403
    assert server.session.path.read_text().count("\n") == 1  # the header only: nothing written
    assert fetch(server.url)[0] == 200


def test_the_page_is_offline_and_hides_the_judge_until_labeled(served):
    server, session = served
    status, page = fetch(server.url)
    text = page.decode()
    assert status == 200 and "http://" not in text and "https://" not in text  # no CDN, no fonts
    base = f"http://127.0.0.1:{server.server_address[1]}"
    token = f"token={server.token}"
    row = json.loads(fetch(f"{base}/api/row?position=0&{token}")[1])
    assert row["judge"] is None and row["label"] is None and row["answer"].startswith("answer")
    status, body = fetch(f"{base}/api/label?{token}", {"position": 0, "human": 3, "note": "n"})
    answer = json.loads(body)
    name = session.order[0]
    assert status == 200 and answer["row"]["id"] == name
    assert answer["row"]["judge"]["score"] == (None if name == "q3" else int(name[1:]) % 6)
    assert answer["state"]["labeled"] == 1 and answer["state"]["next"] == 1
    status, body = fetch(f"{base}/api/label?{token}", {"position": 1, "human": 7})
    assert status == 400 and "0-5" in json.loads(body)["error"]


def test_rows_without_a_judge_score_are_offered_and_counted_apart(served):
    server, session = served
    failed = session.order.index("q3")  # row 3 was truncated: no judge score
    for position in range(failed + 1):
        answer = session.label(position, 2, None)
    assert answer["row"]["judge"] == {"score": None, "status": "truncated", "items": []}
    assert answer["state"]["without_judge"] == 1
    assert answer["state"]["labeled"] == failed + 1


# --- the command's refusals ------------------------------------------------------------------


def run(*args):
    return CliRunner().invoke(main, ["label", *args, "--no-browser"])


def test_results_without_scores_are_refused(tmp_path):
    results = tmp_path / "pairs.jsonl"
    results.write_text(json.dumps({"id": "p0", "status": "ok", "format": "pairwise",
                                   "winner": "A"}) + "\n")
    result = run(str(results), "-o", "labels.jsonl")
    assert result.exit_code == 2
    assert "pairs.jsonl: holds no 0-5 scores" in result.output
    assert not Path("labels.jsonl").exists()


def test_rows_without_texts_are_refused(tmp_path):
    _, results = write_run(tmp_path)  # no summary: no recorded dataset
    result = run(str(results), "-o", "labels.jsonl")
    assert result.exit_code == 2 and "give the graded data with --data" in result.output
    assert not Path("labels.jsonl").exists()


def test_texts_from_the_dataset_the_run_recorded(tmp_path):
    data, results = write_run(tmp_path)
    (tmp_path / "results.summary.json").write_text(json.dumps({"run": {"data": str(data)}}))
    session = open_session(results, tmp_path / "labels.jsonl")
    assert session.row(0)["input"].startswith("question")
    session.close()


def test_a_labels_file_of_other_rows_is_refused(tmp_path):
    data, results = write_run(tmp_path)
    other_rows = [dict(r, id=f"x{i}") for i, r in enumerate(ROWS)]
    (tmp_path / "other").mkdir()
    other_data, other_results = write_run(tmp_path / "other", other_rows)
    session = open_session(other_results, tmp_path / "labels.jsonl", data=str(other_data))
    session.label(0, 1, None)
    session.close()
    before = (tmp_path / "labels.jsonl").read_bytes()
    result = run(str(results), "-o", "labels.jsonl", "--data", str(data))
    assert result.exit_code == 2 and "holds labels for other rows" in result.output
    assert (tmp_path / "labels.jsonl").read_bytes() == before
    with pytest.raises(LabelFileError, match="labels for other rows"):
        read_labels("labels.jsonl", texts(), results_key=results_key(texts()))


def test_another_file_at_output_is_refused_unless_overwrite(tmp_path):
    data, results = write_run(tmp_path)
    Path("notes.jsonl").write_text("my own notes\n")
    result = run(str(results), "-o", "notes.jsonl", "--data", str(data))
    assert result.exit_code == 2 and "is not a grader labels file" in result.output
    assert "--overwrite" in result.output
    assert Path("notes.jsonl").read_text() == "my own notes\n"
    results_before = results.read_bytes()
    for read in (results, data):  # files the command reads: never written, even with --overwrite
        result = run(str(results), "-o", str(read), "--data", str(data), "--overwrite")
        assert result.exit_code == 2 and "which this command reads" in result.output
    assert results.read_bytes() == results_before
    session = open_session(results, Path("notes.jsonl"), data=str(data), overwrite=True)
    session.close()
    assert is_label_file("notes.jsonl")


def test_a_resume_with_another_seed_is_refused(tmp_path):
    data, results = write_run(tmp_path)
    open_session(results, tmp_path / "labels.jsonl", data=str(data), seed=1).close()
    result = run(str(results), "-o", "labels.jsonl", "--data", str(data), "--seed", "2")
    assert result.exit_code == 2
    assert "was started with --seed 1; this run has --seed 2" in result.output


def test_a_bad_labels_file_stops_the_resume_with_its_line(tmp_path):
    data, results = write_run(tmp_path)
    open_session(results, tmp_path / "labels.jsonl", data=str(data)).close()
    with open("labels.jsonl", "a") as stream:
        stream.write(json.dumps({"id": "q0", "digest": "d", "human": 9, "skipped": False,
                                 "note": None, "position": 0, "at": "t"}) + "\n")
    result = run(str(results), "-o", "labels.jsonl", "--data", str(data))
    assert result.exit_code == 2
    assert result.output.strip() == "error: labels.jsonl:2: human 9 is not a score 0-5 or null"


def test_two_label_servers_on_one_file_are_refused(tmp_path):
    data, results = write_run(tmp_path)
    with OutputLock(tmp_path / "labels.jsonl"):  # as the first server holds it
        result = run(str(results), "-o", "labels.jsonl", "--data", str(data))
    assert result.exit_code == 75 and "is being written by another grader run" in result.output


def test_a_second_server_on_the_same_port_is_refused(tmp_path):
    first = LabelServer(0)
    try:
        with pytest.raises(Exception, match="in use by another program"):
            LabelServer(first.server_address[1])
    finally:
        first.server_close()


def test_a_port_in_use_is_refused_before_anything_is_written(tmp_path):
    import socket

    data, results = write_run(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(str(results), "-o", "labels.jsonl", "--data", str(data),
                     "--port", str(port))
    assert result.exit_code == 2
    assert result.output.strip().startswith(f"error: --port {port}: in use")
    assert not Path("labels.jsonl").exists()


def test_a_kill_9_loses_no_label_given_and_a_rerun_resumes(tmp_path):
    # the browser test does this through the page; this one needs no browser
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    data, results = write_run(tmp_path)
    out = tmp_path / "labels.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "grader", "label", str(results), "-o", str(out),
               "--data", str(data), "--no-browser"]

    def start():
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        for line in process.stdout:
            if line.startswith("labeling page: "):
                return process, line.split(": ", 1)[1].strip()
        raise AssertionError(f"no URL; exit {process.wait()}")

    process, url = start()
    base, token = url.split("/?")
    for position, human in enumerate([2, 5]):
        assert fetch(f"{base}/api/label?{token}", {"position": position, "human": human})[0] == 200
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stdout.close()

    process, url = start()
    base, token = url.split("/?")
    state = json.loads(fetch(f"{base}/api/state?{token}")[1])
    assert state["next"] == 2 and state["labeled"] == 2
    process.send_signal(signal.SIGINT)  # Ctrl-C: exit 0, everything is on disk already
    assert process.wait(timeout=10) == 0
    process.stdout.close()
    assert [e["human"] for e in lines(out)[1:]] == [2, 5]


# --- the labels read by agree and rank --------------------------------------------------------


def test_agree_reads_a_label_file_as_a_random_sample_and_names_labels_of_changed_answers(tmp_path):
    data, results = write_run(tmp_path)
    (tmp_path / "results.summary.json").write_text(json.dumps({"run": {"data": str(data)}}))
    out = tmp_path / "labels.jsonl"
    session = open_session(results, out)
    first = session.order[0]
    for position in range(4):
        session.label(position, 3, None)
    session.close()
    changed = [dict(r, output_text="a new answer") if r["id"] == first else r for r in ROWS]
    data.write_text("".join(json.dumps(r) + "\n" for r in changed))

    done = CliRunner().invoke(main, ["agree", str(results), "--human", "human", "--data", str(out),
                                     "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.output[done.output.index("{"):])
    assert result["labels_not_used"] == {"stale": [first], "skipped": 0}
    assert result["calibration"]["random_sample"] is True
    assert result["calibration"]["assumption"] is None
    # the three labels of unchanged answers, less a row the judge gave no score (q3)
    assert result["calibrated"]["labeled"] == sum(i != "q3" for i in session.order[1:4])
    text = CliRunner().invoke(main, ["agree", str(results), "--human", "human", "--data", str(out)])
    assert "labels of changed answers" in text.output and first in text.output


def test_rank_reads_label_files_for_its_calibrated_fit(tmp_path):
    from grader.analysis.agreement import load_records
    from grader.analysis.rank import _labels

    data, results = write_run(tmp_path)
    (tmp_path / "results.summary.json").write_text(json.dumps({"run": {"data": str(data)}}))
    out = tmp_path / "labels.jsonl"
    session = open_session(results, out)
    session.label(0, 4, None)
    session.label(1, 1, None)
    order = session.order
    session.close()
    records = load_records(results)
    assert _labels(results, records, str(out), "human", None, None) == {order[0]: 4, order[1]: 1}
