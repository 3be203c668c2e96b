"""A score with a confidence (issue #14): the pure distribution, reading the choices from
tokens, the record through run_grade / rescore / the CLI, and both real backends.

The real-engine tests share one vLLM engine (module scope) and one transformers backend.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec
import pytest
from answers import itemized_answer
from click.testing import CliRunner
from conftest import TINY_VLLM_ENGINE, make_request
from msgspec import to_builtins

from grader.backends import Completion
from grader.cli import main
from grader.config import SamplingConfig
from grader.io.results import read_records
from grader.judge.confidence import (
    ChoiceProbabilities,
    Unreadable,
    confidence,
    poisson_binomial,
    read_choices,
    score_distribution,
    shortest_interval,
)
from grader.judge.parsing import parse_itemized
from grader.judge.scoring import Counts, compute_score
from grader.run.grading import run_grade
from grader.run.rescore import rescore


def _close(a: Any, b: Any) -> bool:
    """Equal, floats within 1e-9 (pytest.approx takes no nested containers)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _choices(facts=(), conclusions=(), terms=(), organization=1.0) -> ChoiceProbabilities:
    return ChoiceProbabilities(
        {"facts": list(facts), "conclusions": list(conclusions), "terms": list(terms)},
        organization,
    )


# ------------------------------------------------------------------------- the distribution


def test_poisson_binomial_by_hand():
    assert poisson_binomial([0.5, 0.5]) == [0.25, 0.5, 0.25]
    assert poisson_binomial([]) == [1.0]
    assert poisson_binomial([1.0, 0.0, 0.25]) == [0.0, 0.75, 0.25, 0.0]


def test_two_facts_at_one_half_by_hand():
    # no conclusions, no terms (terms_ratio 1), organization surely matched:
    # 0 facts: 5 × 0.21 = 1.05 -> 1; 1 fact: 5 × (0.7/2 + 0.21 + 0.09) = 3.25 -> 3; 2: 5 -> 5
    result = confidence(_choices(facts=[0.5, 0.5]), reported=3)
    assert score_distribution(_choices(facts=[0.5, 0.5])) == {
        Fraction(21, 20): 0.25, Fraction(13, 4): 0.5, Fraction(5): 0.25
    }
    assert result["distribution"] == {"0": 0.0, "1": 0.25, "2": 0.0, "3": 0.5, "4": 0.0, "5": 0.25}
    assert result["p_score"] == 0.5
    assert result["score_expected"] == pytest.approx(0.25 * 1.05 + 0.5 * 3.25 + 0.25 * 5)
    assert result["interval"] == [1, 5]  # 3..5 hold 0.75 only
    assert result["items_read"] == 3  # two facts and the organization


def test_a_certain_judge_gives_its_own_score_with_probability_one():
    raw = itemized_answer()
    parsed = parse_itemized(raw)
    choices = _choices(
        facts=[float(e.present) for e in parsed.items.facts],
        conclusions=[float(e.present) for e in parsed.items.conclusions],
        terms=[float(e.present) for e in parsed.items.terms],
        organization=1.0,
    )
    reported = compute_score(parsed.counts)
    result = confidence(choices, reported.rounded)
    assert result["p_score"] == 1.0
    assert result["interval"] == [reported.rounded, reported.rounded]
    assert result["score_expected"] == float(reported.exact)


def test_distribution_equals_enumerating_every_answer():
    # 3 facts, 2 conclusions, 2 terms, organization 0.3: 2**8 answers, each scored exactly
    choices = _choices([0.9, 0.4, 0.15], [0.7, 0.2], [0.55, 0.05], organization=0.3)
    expected: dict[int, float] = dict.fromkeys(range(6), 0.0)
    mean = 0.0
    probabilities = [*choices.present["facts"], *choices.present["conclusions"],
                     *choices.present["terms"], choices.organization]
    for answer in itertools.product((True, False), repeat=8):
        p = math.prod(q if a else 1 - q for q, a in zip(probabilities, answer))
        counts = Counts(sum(answer[:3]), 3, sum(answer[3:5]), 2, sum(answer[5:7]), 2,
                        "matched" if answer[7] else "mismatched")
        score = compute_score(counts)
        expected[score.rounded] += p
        mean += p * float(score.exact)
    result = confidence(choices, reported=2)
    assert sum(result["distribution"].values()) == pytest.approx(1.0)
    for k in range(6):
        assert result["distribution"][str(k)] == pytest.approx(expected[k])
    assert result["score_expected"] == pytest.approx(mean)
    assert result["p_score"] == pytest.approx(expected[2])
    lo, hi = result["interval"]
    assert sum(expected[k] for k in range(lo, hi + 1)) >= 0.9 - 1e-9
    for width in range(hi - lo):  # no narrower range holds 90%
        assert all(sum(expected[k] for k in range(a, a + width + 1)) < 0.9
                   for a in range(6 - width))


def test_no_facts_is_zero_whatever_the_rest():
    result = confidence(_choices(terms=[0.5], organization=0.5), reported=0)
    assert result["p_score"] == 1.0 and result["score_expected"] == 0.0


def test_interval_prefers_the_range_that_holds_most():
    assert shortest_interval({0: 0.05, 1: 0.45, 2: 0.46, 3: 0.04}) == [1, 2]
    assert shortest_interval({4: 1.0}) == [4, 4]


# ----------------------------------------------------------------- reading choices from tokens

_PIECES = re.compile(r'mismatched|matched|true|false|[":,{}\[\]]|[^":,{}\[\]]{1,5}')


def _tokens(raw: str, present: list[float], matched: float = 0.8):
    """``raw`` cut into tokens, each value a token of its own with two alternatives, the
    present values' P(true) taken in order from ``present``."""
    tokens = _PIECES.findall(raw)
    assert "".join(tokens) == raw
    top: list[dict[str, float]] = []
    ps = iter(present)
    for token in tokens:
        if token in ("true", "false"):
            p = next(ps)
            top.append({"true": math.log(p), "false": math.log1p(-p)})
        elif token in ("matched", "mismatched"):
            top.append({"matched": math.log(matched), "mismatched": math.log1p(-matched)})
        else:
            top.append({token: 0.0})
    return tokens, top


def test_choices_are_read_at_each_value_token():
    raw = itemized_answer()  # facts T F, conclusion T, terms T F, matched
    parsed = parse_itemized(raw)
    tokens, top = _tokens(raw, [0.9, 0.2, 0.6, 0.7, 0.1], matched=0.8)
    choices = read_choices(raw, tokens, top, parsed.items, "matched")
    assert _close(choices.present,
                  {"facts": [0.9, 0.2], "conclusions": [0.6], "terms": [0.7, 0.1]})
    assert choices.organization == pytest.approx(0.8)


def test_a_token_that_starts_before_the_value_and_one_that_stops_short():
    # ':tr' holds the colon and the choice; ':' (no letter yet) is left out, the rest renormalised
    raw = itemized_answer(facts=(("f", "", True),), conclusions=(), terms=())
    tokens, top = _tokens(raw, [0.5])
    at = tokens.index("true")
    tokens[at - 1 : at + 1] = [tokens[at - 1][:-1], ":tr", "ue"]
    assert "".join(tokens) == raw
    top[at - 1 : at + 1] = [{tokens[at - 1]: 0.0},
                           {":tr": math.log(0.6), ":f": math.log(0.2), ":": math.log(0.2)},
                           {"ue": 0.0}]
    # organization split as '"m' + 'atched"': the letters part at 'a' / 'i'
    org = tokens.index("matched")
    tokens[org - 1 : org + 1] = ['"m', "atched"]
    top[org - 1 : org + 1] = [{'"m': 0.0}, {"atched": math.log(0.3), "ismatched": math.log(0.1)}]
    choices = read_choices(raw, tokens, top, parse_itemized(raw).items, "matched")
    assert choices.present["facts"] == [pytest.approx(0.75)]
    assert choices.organization == pytest.approx(0.75)


def test_tokens_that_say_otherwise_than_the_answer_are_unreadable():
    raw = itemized_answer()
    tokens, top = _tokens(raw, [0.9, 0.2, 0.6, 0.7, 0.1])
    items = parse_itemized(raw).items
    items.facts[0] = msgspec.structs.replace(items.facts[0], present=False)
    with pytest.raises(Unreadable, match="facts 0"):
        read_choices(raw, tokens, top, items, "matched")
    no_mass = [dict(step) for step in top]
    no_mass[tokens.index("true")] = {"x": 0.0}
    with pytest.raises(Unreadable, match="no probability"):
        read_choices(raw, tokens, no_mass, parse_itemized(raw).items, "matched")


# --------------------------------------------------------------- records: grade, rescore, CLI


def _data(tmp_path: Path, rows: int = 2) -> Path:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(
        json.dumps({"id": f"r{i}", "input": "Q?", "reference": "Water boils at 100 C.",
                    "output_text": "It boils at 100 °C."}) + "\n" for i in range(rows)))
    return data


def _completion(raw: str, present: list[float], matched: float = 0.8) -> Completion:
    tokens, top = _tokens(raw, present, matched)
    return Completion(raw, "stop", 10, len(tokens), tokens=tuple(tokens), top_logprobs=tuple(top))


def test_confidence_is_recorded_only_when_asked_and_survives_rescore(tmp_path,
                                                                     fake_backend_factory):
    raw = itemized_answer()
    fake_backend_factory.replies = [_completion(raw, [0.9, 0.2, 0.6, 0.7, 0.1]),
                                    Completion("{", "stop", 10, 1, tokens=("{",),
                                               top_logprobs=({"{": 0.0},))]
    out = tmp_path / "c.jsonl"
    summary = run_grade(*make_request(_data(tmp_path), out, format="itemized",
                                     sampling=SamplingConfig(logprobs=5)),
                        backend_factory=fake_backend_factory)
    assert summary["run"]["sampling"]["logprobs"] == 5
    (_, good), (_, bad) = read_records(out)
    assert good.score == 3
    expected = confidence(_choices([0.9, 0.2], [0.6], [0.7, 0.1], 0.8), 3)
    assert _close(to_builtins(good.confidence), expected) and good.confidence_error is None
    assert bad.status == "parse_error"
    assert bad.confidence is None and "no score" in bad.confidence_error

    rescored = tmp_path / "rescored.jsonl"
    rescore(out, rescored)
    (_, again), _ = read_records(rescored)
    assert _close(to_builtins(again.confidence), to_builtins(good.confidence))

    # without logprobs: the records, and the resume key, are what they always were
    fake_backend_factory.replies = [raw] * 2
    plain = tmp_path / "plain.jsonl"
    plain_summary = run_grade(*make_request(_data(tmp_path), plain, format="itemized"),
                              backend_factory=fake_backend_factory)
    assert all(not r.has("confidence") for _, r in read_records(plain))
    assert "logprobs" not in plain_summary["run"]["sampling"]
    assert plain_summary["run"]["run_key"] != summary["run"]["run_key"]


def test_without_confidence_the_sampling_settings_dump_as_before():
    # the resume key and the manifest hash this dump: a run without --confidence keeps its key
    assert SamplingConfig().model_dump() == {
        "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "max_tokens": None, "n": 1}
    assert "logprobs" not in SamplingConfig().to_vllm_kwargs(10)
    assert SamplingConfig(logprobs=5).model_dump()["logprobs"] == 5
    assert SamplingConfig(logprobs=5).to_vllm_kwargs(10)["logprobs"] == 5
    assert SamplingConfig.model_validate(SamplingConfig(logprobs=5).model_dump()).logprobs == 5


def test_unreadable_tokens_give_no_confidence_and_a_reason(tmp_path, fake_backend_factory):
    raw = itemized_answer()
    tokens, top = _tokens(raw, [0.9, 0.2, 0.6, 0.7, 0.1])
    fake_backend_factory.replies = [Completion(raw, "stop", 10, 5, tokens=tuple(tokens[:-9]),
                                               top_logprobs=tuple(top[:-9]))]
    out = tmp_path / "c.jsonl"
    run_grade(*make_request(_data(tmp_path, 1), out, format="itemized",
                           sampling=SamplingConfig(logprobs=5)),
              backend_factory=fake_backend_factory)
    ((_, record),) = read_records(out)
    assert record.score == 3 and record.confidence is None
    assert record.confidence_error


def test_cli_refuses_confidence_outside_the_itemized_format(tmp_path, tiny_model):
    data = _data(tmp_path)
    for extra, says in ((["--format", "seed"], "needs --format rubric, itemized or pairwise"),
                        (["--samples", "2", "--temperature", "1"], "one answer")):
        result = CliRunner().invoke(main, ["grade", str(data), "-m", str(tiny_model), "-o",
                                           str(tmp_path / "o.jsonl"), "--confidence", *extra])
        assert result.exit_code != 0
        assert says in result.output, result.output
        assert not (tmp_path / "o.jsonl").exists()


# ------------------------------------------------------------------------ the real backends
# The transformers backend grading a few rows of the example data at temperature 1 with
# --confidence; the vLLM backend's twin is in test_vllm_engine.py, beside the run's one tiny vLLM
# engine (a session fixture: test_vllm_engine.py is the last test file, so the engine's process
# is not alive beside the tests that count processes or start engines of their own).

VLLM_ENGINE = TINY_VLLM_ENGINE
# What may follow `"present":` under the grammar: a prefix of `true}...` or `false}...`.
_ALLOWED_AFTER_PRESENT = re.compile(r"^(t(r(u(e(\}.*)?)?)?)?|f(a(l(s(e(\}.*)?)?)?)?)?)$", re.S)


def _present_steps(completion: Completion):
    """Per `present` value of an answer: (the text its token starts with before the value,
    that step's top-k)."""
    text = "".join(completion.tokens)
    starts = list(itertools.accumulate((len(t) for t in completion.tokens), initial=0))
    for match in re.finditer(r'"present":', text):
        at = match.end()
        step = max(i for i, s in enumerate(starts[:-1]) if s <= at)
        yield text[starts[step]:at], completion.top_logprobs[step]


def _grade_real(tmp_path, backend: str, factory=None, limit: int = 6,
                **options) -> tuple[list, list[dict]]:
    """``limit`` example rows graded with logprobs=5; the completions the backend returned."""
    from conftest import EXAMPLES

    from grader.run.ahead import Runner

    completions: list[Completion] = []
    # the run's calls, as the runner around the backend answers them (a streaming backend's
    # rows come from its stream, not from generate())
    real = Runner.generate

    def generate(runner, requests, watch=None):
        out = real(runner, requests, watch)
        completions.extend(out)
        return out

    out = tmp_path / f"{backend}.jsonl"
    options.setdefault("format", "itemized")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Runner, "generate", generate)
        run_grade(*make_request(EXAMPLES / "qa.jsonl", out, model=options.pop("model"),
                               backend=backend, limit=limit,
                               sampling=SamplingConfig(temperature=1.0, seed=0, logprobs=5),
                               **options),
                  backend_factory=factory)
    return completions, [r for _, r in read_records(out)]


def _check_post_mask_and_records(completions: list[Completion], records: list[dict]) -> None:
    present_steps = 0
    for completion in completions:
        assert completion.tokens is not None and len(completion.tokens) == len(
            completion.top_logprobs)
        for prefix, top in _present_steps(completion):
            present_steps += 1
            finite = {t: lp for t, lp in top.items() if lp > -math.inf}
            for token in finite:  # only what the grammar allows here
                if len(token) <= len(prefix):
                    assert prefix.startswith(token), (prefix, token, top)
                else:
                    assert token.startswith(prefix), (prefix, token, top)
                    assert _ALLOWED_AFTER_PRESENT.match(token[len(prefix):]), (prefix, token, top)
            # post-mask: the allowed tokens hold (nearly) all the mass; before the mask a
            # random-weight model gives them a few in 2,000 (its vocabulary)
            assert sum(math.exp(lp) for lp in finite.values()) > 0.5, top
    assert present_steps > 0
    read = [r for r in records if r.field("confidence")]
    assert read, [r.field("confidence_error") for r in records]
    for record in read:
        c = to_builtins(record.confidence)
        assert sum(c["distribution"].values()) == pytest.approx(1.0)
        assert c["p_score"] == c["distribution"][str(record.score)]
        assert 0.0 <= c["score_expected"] <= 5.0
        assert c["interval"][0] <= c["interval"][1]
        items = len(record.items.labels())
        assert c["items_read"] == items + 1
    for record in records:
        if record.status in ("ok", "ambiguous"):
            assert record.has("confidence") and record.has("confidence_error")


@pytest.mark.slow
def test_transformers_logprobs_under_the_grammar_are_post_mask(tiny_model, tmp_path):
    from grader.config import TransformersConfig

    # two rows: generate() runs to the longest answer, ~10 ms a step on 2 cores
    completions, records = _grade_real(tmp_path, "transformers", limit=2, model=str(tiny_model),
                                       transformers=TransformersConfig(batch_size=2))
    _check_post_mask_and_records(completions, records)


# ------------------------------------------------------------------ grader report, grader agree


def _confident_record(item_id: str, facts: list[float], human: int | None = None) -> dict:
    """An itemized record (its items present where P > 0.5) with the confidence of ``facts``."""
    from grader.judge.confidence import record_confidence
    from grader.judge.records import itemized_record

    raw = itemized_answer(facts=tuple((f"fact {i}", "", p > 0.5) for i, p in enumerate(facts)),
                          conclusions=(), terms=())
    record = itemized_record(item_id, raw, "stop")
    probabilities = {"facts": facts, "conclusions": [], "terms": [], "organization": 1.0}
    record.confidence, record.confidence_error = record_confidence(record,
                                                                   probabilities=probabilities)
    line = record.to_dict()
    if human is not None:
        line["human"] = human
    return line


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_report_lists_the_least_confident_rows_first(tmp_path):
    from grader.analysis.report import write_report

    records = [
        _confident_record("sure", [0.99, 0.01]),
        _confident_record("torn", [0.5, 0.5]),
        _confident_record("leaning", [0.8, 0.3]),
        {**_confident_record("unread", [0.9]), "confidence": None, "confidence_error": "why"},
    ]
    write_report(_write(tmp_path / "r.jsonl", records), tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text(encoding="utf-8")
    body = re.search(r"<section id='confidence'>(.*?)</section>", text, re.S).group(1)
    rows = re.findall(r"<tr><td><code>(.*?)</code>.*?</tr>", body, re.S)
    assert rows == ["torn", "leaning", "sure"]
    torn = confidence(_choices([0.5, 0.5]), reported=records[1]["score"])
    assert torn["p_score"] == 0.25  # both absent: score 1, one chance in four
    assert "<td class='n'>0.25</td>" in body
    assert "1 scored row(s) have none" in body

    plain = [{k: v for k, v in r.items() if not k.startswith("confidence")} for r in records]
    write_report(_write(tmp_path / "p.jsonl", plain), tmp_path / "p.html")
    assert "id='confidence'" not in (tmp_path / "p.html").read_text(encoding="utf-8")


def test_agree_reports_whether_confidence_predicts_agreement(tmp_path):
    from grader.analysis.confidence import auc

    records = [
        _confident_record("sure", [0.99, 0.01], human=3),  # score 3, p_score 0.9802: agrees
        _confident_record("leaning", [0.8, 0.3], human=3),  # 3, 0.62: agrees
        _confident_record("torn", [0.5, 0.5], human=4),  # 1, 0.25: disagrees
        _confident_record("unsure", [0.6, 0.45], human=2),  # 3, 0.51: disagrees
        {**_confident_record("unread", [0.9], human=5), "confidence": None},
    ]
    assert [r["score"] for r in records[:4]] == [3, 3, 1, 3]
    results = _write(tmp_path / "r.jsonl", records)
    out = CliRunner().invoke(main, ["agree", str(results), "--human", "human", "--json",
                                    "--bootstrap", "100"])
    assert out.exit_code == 0, out.output
    c = json.loads(out.output)["confidence"]
    assert (c["n"], c["without"]) == (4, 1)
    assert c["auc"] == 1.0  # both agreeing rows are surer than both disagreeing ones
    assert [h["exact_agreement"] for h in c["halves"]] == [0.0, 1.0]
    assert c["halves"][0]["p_score_max"] == pytest.approx(0.51)
    assert c["mean_p_score"] == pytest.approx((0.9802 + 0.62 + 0.25 + 0.51) / 4)
    assert c["exact_agreement"] == 0.5
    text = CliRunner().invoke(main, ["agree", str(results), "--human", "human",
                                     "--bootstrap", "100"]).output
    assert "confidence (p_score) vs exact agreement: 4 rows, 1 without a confidence" in text
    assert "AUC (agreeing rows surer)" in text

    # ties count one half; without both kinds there is no AUC
    assert auc([0.5, 0.5, 0.9], [True, False, True]) == 0.75
    assert auc([0.1, 0.2], [True, True]) is None

    plain = _write(tmp_path / "p.jsonl", [
        {k: v for k, v in r.items() if not k.startswith("confidence")} for r in records])
    out = CliRunner().invoke(main, ["agree", str(plain), "--human", "human", "--json",
                                    "--bootstrap", "100"])
    assert "confidence" not in json.loads(out.output)


@pytest.mark.slow
def test_transformers_thinking_judge_reads_the_answers_tokens_only(tiny_think_model, tmp_path):
    # the grammar's phase records its log-probabilities; the thinking's tokens are not the answer's
    from grader.config import TransformersConfig

    completions, records = _grade_real(
        tmp_path, "transformers", limit=2, model=str(tiny_think_model),
        transformers=TransformersConfig(batch_size=2, reasoning_parser="deepseek_r1",
                                        thinking_budget=4))
    assert all(c.reasoning is not None for c in completions)
    _check_post_mask_and_records(completions, records)
