"""grader.results: the summary of a results file, whole or merged from consecutive parts."""

from __future__ import annotations

import random

from grader.results import Tally, summarize


def _records(rng: random.Random, count: int) -> list[dict]:
    records = []
    for index in range(count):
        roll = rng.random()
        if roll < 0.5:
            score = rng.randint(0, 5)
            records.append({"id": index, "status": "ok", "score": score,
                            "model_score": rng.choice((None, score, (score + 1) % 6))})
        elif roll < 0.6:
            records.append({"id": index, "status": "ok", "result": rng.random() * 7,
                            "passed": rng.choice((None, True, False))})
        elif roll < 0.65:
            records.append({"id": index, "status": rng.choice(("later_status", "other"))})
        else:
            records.append({"id": index, "status": rng.choice(
                ("missing_context", "ambiguous", "invalid_counts", "parse_error", "truncated"))})
    return records


def _seed_only(records: list[dict]) -> list[dict]:
    return [r for r in records if "result" not in r]


def test_a_tally_merged_from_parts_is_the_summary_of_the_whole():
    rng = random.Random(4)
    for trial in range(200):
        records = _records(rng, rng.randint(0, 60))
        if trial % 2:
            records = _seed_only(records)
        cuts = sorted(rng.sample(range(len(records) + 1), k=min(3, len(records) + 1)))
        parts = [records[a:b] for a, b in zip([0, *cuts], [*cuts, len(records)])]
        merged = Tally()
        for part in parts:
            tally = Tally()
            tally.add(iter(part))
            merged.merge(tally)
        whole = summarize(iter(records), run={"x": 1})
        assert merged.summary(run={"x": 1}) == whole
        # the same order of statuses too: a status first seen late is listed late
        assert list(merged.summary()["statuses"]) == list(whole["statuses"])


def test_summary_of_seed_records():
    records = [
        {"id": 1, "status": "ok", "score": 3, "model_score": 3},
        {"id": 2, "status": "ok", "score": 4, "model_score": 2},
        {"id": 3, "status": "ok", "score": 4},
        {"id": 4, "status": "ambiguous", "score": 0},
    ]
    summary = summarize(records)
    assert summary["rows"] == 4 and summary["graded"] == 3
    assert summary["statuses"]["ambiguous"] == 1
    assert summary["mean_score"] == round(11 / 3, 4)
    assert summary["histogram"] == {"0": 0, "1": 0, "2": 0, "3": 1, "4": 2, "5": 0}
    assert summary["judge_disagreement"] == {"rows": 2, "disagree": 1, "rate": 0.5}
