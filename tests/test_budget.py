"""The pre-flight token budget: cut_middle, TokenBudget, and grade runs with a budgeted fake."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import FakeBackend, make_request

from grader.backends.budget import MARKER, Fitted, Overflow, TokenBudget, cut_middle
from grader.io.results import read_records
from grader.run.grading import run_grade

CUT = re.compile(r"\[\.\.\. (\d+) characters cut by grader to fit the judge's context \.\.\.\]")


def conversation(fields: dict) -> list[dict]:
    return [
        {"role": "system", "content": "Grade it."},
        {"role": "user", "content": f"<reference>{fields['reference']}</reference>"
                                    f"<model_output>{fields['output_text']}</model_output>"},
    ]


def count_chars(conversations) -> list[int]:
    """One token per character: exact, so the budget's arithmetic can be checked to the token."""
    return [sum(len(m["content"]) for m in c) for c in conversations]


def count_words(conversations) -> list[int]:
    return [sum(len(m["content"].split()) for m in c) for c in conversations]


def fit_one(budget: TokenBudget, fields: dict) -> Fitted | Overflow:
    return budget.fit([conversation(fields)], lambda _, cut: conversation(fields | cut), [fields])[0]


BASE = len("Grade it.<reference></reference><model_output></model_output>")  # 61 tokens


def test_cut_middle_keeps_head_and_tail_and_says_how_much_it_cut():
    text = "H" * 60 + "T" * 40
    cut = cut_middle(text, 11)
    head, marker, tail = cut[:6], cut[6 : len(cut) - 5], cut[len(cut) - 5 :]
    assert (head, tail) == ("H" * 6, "T" * 5)
    assert marker == MARKER.format(cut=89)
    assert int(CUT.search(cut).group(1)) + len(head) + len(tail) == len(text)  # kept + cut = all
    assert cut_middle(text, 100) == text and cut_middle(text, 10**9) == text
    assert cut_middle(text, 0) == MARKER.format(cut=100)
    assert cut_middle(text, 1) == "H" + MARKER.format(cut=99)


def test_a_row_that_fits_is_left_alone():
    budget = TokenBudget(count_chars, context_length=1000, max_tokens=100)
    fields = {"reference": "r" * 400, "output_text": "o" * 400}
    result = fit_one(budget, fields)
    assert isinstance(result, Fitted)
    assert result.messages == conversation(fields) and result.truncation is None
    assert result.prompt_tokens == BASE + 800
    # exactly at the limit still fits: prompt + max_tokens == context
    fields = {"reference": "r" * (900 - BASE - 400), "output_text": "o" * 400}
    assert isinstance(fit_one(budget, fields), Fitted)
    assert budget.describe() == {
        "context_length": 1000, "max_tokens": 100, "prompt_limit": 900, "truncate": [],
        "counted": "every row",
    }


class Counting:
    """count_chars that remembers which conversations it was asked to count."""

    def __init__(self):
        self.asked: list[list[dict]] = []

    def __call__(self, conversations):
        self.asked.extend(conversations)
        return count_chars(conversations)


def test_rows_whose_upper_bound_fits_are_not_tokenized_and_the_rest_are_counted_exactly():
    counter = Counting()
    # an upper bound 50 tokens above the exact count: rows within 50 of the limit are counted
    budget = TokenBudget(counter, context_length=1000, max_tokens=100,
                         upper_bounds=lambda cs: [n + 50 for n in count_chars(cs)])
    far = {"reference": "r" * 100, "output_text": "o" * 100}        # 261 tokens
    near = {"reference": "r" * 400, "output_text": "o" * 400}       # 861: bound 911 > 900
    over = {"reference": "r" * 500, "output_text": "o" * 400}       # 961
    rows = [far, near, over]
    fitted = budget.fit([conversation(r) for r in rows], lambda i, cut: conversation(rows[i] | cut), rows)
    assert counter.asked == [conversation(near), conversation(over)]
    assert isinstance(fitted[0], Fitted) and fitted[0].prompt_tokens is None
    assert isinstance(fitted[1], Fitted) and fitted[1].prompt_tokens == BASE + 800
    assert isinstance(fitted[2], Overflow) and fitted[2].prompt_tokens == BASE + 900
    assert budget.describe()["counted"] == "near the limit"


def test_a_backend_without_a_bound_has_every_row_counted():
    counter = Counting()
    budget = TokenBudget(counter, context_length=1000, max_tokens=100, upper_bounds=lambda cs: None)
    fields = {"reference": "r", "output_text": "o"}
    assert isinstance(fit_one(budget, fields), Fitted)
    assert counter.asked == [conversation(fields)]


def test_overflow_says_how_many_tokens_against_what():
    budget = TokenBudget(count_chars, context_length=1000, max_tokens=100)
    result = fit_one(budget, {"reference": "r" * 500, "output_text": "o" * 400})
    assert isinstance(result, Overflow)
    assert result.prompt_tokens == BASE + 900 == 961
    assert result.reason == (
        "the prompt is 961 tokens; with max_tokens 100 it needs 1061 of the judge's 1000"
    )


def test_only_the_overflowing_rows_of_a_batch_are_cut_or_refused():
    budget = TokenBudget(count_chars, context_length=1000, max_tokens=100)
    rows = [{"reference": "r", "output_text": "o" * n} for n in (10, 5000, 20)]
    results = budget.fit(
        [conversation(r) for r in rows], lambda i, cut: conversation(rows[i] | cut), rows
    )
    assert [type(r) for r in results] == [Fitted, Overflow, Fitted]


def test_truncating_one_field_cuts_only_that_field_to_the_largest_size_that_fits():
    budget = TokenBudget(count_chars, context_length=1000, max_tokens=100, truncate=["output_text"])
    fields = {"reference": "R" * 300, "output_text": "".join(chr(97 + i % 26) for i in range(5000))}
    result = fit_one(budget, fields)
    assert isinstance(result, Fitted)
    [(name, record)] = result.truncation.items()
    assert name == "output_text" and record.chars == 5000
    kept = record.kept
    content = result.messages[1]["content"]
    assert "R" * 300 in content  # the reference is whole
    assert MARKER.format(cut=5000 - kept) in content  # visible, and kept + cut = chars
    assert result.prompt_tokens == count_chars([result.messages])[0] <= 900
    # the largest that fits: one more character kept would overflow
    bigger = conversation(fields | {"output_text": cut_middle(fields["output_text"], kept + 1)})
    assert count_chars([bigger])[0] > 900
    # head and tail of the answer both survive
    output = content.split("<model_output>")[1].split("</model_output>")[0]
    head, tail = output.split(MARKER.format(cut=5000 - kept))
    assert fields["output_text"].startswith(head) and fields["output_text"].endswith(tail)
    assert len(head) + len(tail) == kept and len(head) - len(tail) in (0, 1)


def test_truncating_both_cuts_the_longest_first_and_keeps_a_short_reference_whole():
    budget = TokenBudget(
        count_chars, context_length=2000, max_tokens=100, truncate=["output_text", "reference"]
    )
    fields = {"reference": "The sky is blue.", "output_text": "blue " * 200_000}
    result = fit_one(budget, fields)
    assert isinstance(result, Fitted)
    assert "<reference>The sky is blue.</reference>" in result.messages[1]["content"]
    assert list(result.truncation) == ["output_text"]
    assert result.prompt_tokens <= 1900

    # both long: each keeps the same number of characters, as many as fit
    fields = {"reference": "r" * 3000, "output_text": "o" * 6000}
    result = fit_one(budget, fields)
    assert isinstance(result, Fitted)
    ref, out = result.truncation["reference"], result.truncation["output_text"]
    assert (ref.chars, out.chars) == (3000, 6000)
    assert ref.kept == out.kept
    content = result.messages[1]["content"]
    assert MARKER.format(cut=3000 - ref.kept) in content
    assert MARKER.format(cut=6000 - out.kept) in content
    keep_one_more = {name: cut_middle(text, ref.kept + 1) for name, text in fields.items()}
    assert count_chars([conversation(fields | keep_one_more)])[0] > 1900


def test_a_row_that_cannot_fit_even_cut_to_nothing_overflows():
    budget = TokenBudget(count_chars, context_length=300, max_tokens=200, truncate=["output_text"])
    # the reference alone is over the 100-token limit, and only the output may be cut
    result = fit_one(budget, {"reference": "r" * 150, "output_text": "o" * 1000})
    assert isinstance(result, Overflow)
    assert result.prompt_tokens == BASE + 1150
    assert result.reason.startswith(f"the prompt is {BASE + 1150} tokens; with max_tokens 200")
    assert "output_text cut entirely" in result.reason
    # nothing to cut: an empty truncatable field cannot help either
    budget = TokenBudget(count_chars, context_length=300, max_tokens=200, truncate=["output_text"])
    assert isinstance(fit_one(budget, {"reference": "r" * 150, "output_text": ""}), Overflow)


def test_budget_works_with_any_monotone_count():
    budget = TokenBudget(count_words, context_length=500, max_tokens=100, truncate=["output_text"])
    fields = {"reference": "a b c", "output_text": "word " * 10_000}
    result = fit_one(budget, fields)
    assert isinstance(result, Fitted) and result.prompt_tokens <= 400
    assert result.truncation["output_text"].chars == 50_000


def test_unknown_truncate_field_is_refused():
    with pytest.raises(ValueError, match="unknown field"):
        TokenBudget(count_chars, context_length=10, max_tokens=1, truncate=["input"])


# --- grade runs with a fake backend that has a context and counts tokens -------------------


class BudgetedFake(FakeBackend):
    """A FakeBackend with a context: the pipeline checks every row against it before sending."""

    def __init__(self, *args, context_length: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.context_length = context_length
        self.counted: list[int] = []

    def count_tokens(self, conversations):
        self.counted.append(len(conversations))
        return [-(-sum(len(m["content"]) for m in c) // 4) for c in conversations]  # chars / 4


class BudgetedFactory:
    def __init__(self, context_length: int):
        self.context_length = context_length
        self.backend: BudgetedFake | None = None

    def __call__(self, name, **options):
        self.options = options
        self.backend = BudgetedFake(context_length=self.context_length)
        return self.backend


def _write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


HUGE = "".join(f"sentence {i} of a very long answer. " for i in range(4000))  # ~130 k chars


def _rows() -> list[dict]:
    return [
        {"id": "a", "reference": "Paris is the capital.", "output_text": "Paris."},
        {"id": "huge", "reference": "Paris is the capital.", "output_text": HUGE},
        {"id": "c", "reference": "Water boils at 100 C.", "output_text": "At 100 degrees."},
    ]


def _grade(tmp_path, factory, **request):
    data = _write_rows(tmp_path / "d.jsonl", _rows())
    out = tmp_path / "r.jsonl"
    summary = run_grade(
        *make_request(data, out, chunk_size=8, **request),
        backend_factory=factory,
    )
    return summary, {r.id: r for _, r in read_records(out)}


def test_an_overflowing_row_is_context_overflow_and_never_sent(tmp_path):
    factory = BudgetedFactory(context_length=4000)
    summary, records = _grade(tmp_path, factory)
    assert {k: r.status for k, r in records.items()} == {
        "a": "ok", "huge": "context_overflow", "c": "ok"
    }
    huge = records["huge"]
    assert huge.score is None and huge.raw_output is None and huge.truncation is None
    assert huge.usage.prompt_tokens > 30_000
    assert f"the prompt is {huge.usage.prompt_tokens} tokens" in huge.error
    assert "of the judge's 4000" in huge.error
    # one generate() call for the chunk, holding the two other rows only
    [call] = factory.backend.calls
    assert len(call) == 2 and all("sentence 3999" not in m["content"] for c in call for m in c)
    assert factory.backend.counted[-1] == 3  # the check pass's chunk is counted in one call
    assert summary["statuses"]["context_overflow"] == 1 and summary["statuses"]["ok"] == 2
    # max_tokens: the rubric format's longest answer, its rubric pass's (schema.format_max_chars)
    assert summary["run"]["token_budget"] == {
        "context_length": 4000, "max_tokens": 1380, "prompt_limit": 2620, "truncate": [],
        "counted": "every row",
    }


def test_with_truncate_the_row_is_sent_cut_with_the_marker_and_recorded(tmp_path):
    factory = BudgetedFactory(context_length=4000)
    summary, records = _grade(tmp_path, factory, truncate=("output_text", "reference"))
    assert {k: r.status for k, r in records.items()} == {"a": "ok", "huge": "ok", "c": "ok"}
    truncation = records["huge"].truncation
    assert list(truncation) == ["output_text"]  # the short reference is not cut
    chars, kept = truncation["output_text"].chars, truncation["output_text"].kept
    assert chars == len(HUGE) and 0 < kept < chars
    assert records["a"].truncation is None and records["c"].truncation is None

    [call] = factory.backend.calls
    assert len(call) == 3
    sent = call[1][1]["content"]
    assert MARKER.format(cut=chars - kept) in sent
    assert "Paris is the capital." in sent
    assert HUGE[: kept // 2] in sent and HUGE[len(HUGE) - kept // 2 :] in sent
    assert factory.backend.count_tokens([call[1]])[0] <= 4000 - 1380
    assert summary["run"]["token_budget"]["truncate"] == ["output_text", "reference"]


def test_a_tokenizer_failure_costs_its_rows_not_the_run(tmp_path):
    class Failing(BudgetedFake):
        def count_tokens(self, conversations):
            if any("Water" in m["content"] for c in conversations for m in c):
                raise TypeError("TextEncodeInput must be Union[TextInputSequence, ...]")
            return super().count_tokens(conversations)

    class Factory(BudgetedFactory):
        def __call__(self, name, **options):
            self.backend = Failing(context_length=4000)
            return self.backend

    _, records = _grade(tmp_path, Factory(4000))
    assert records["c"].status == "engine_error" and "TextEncodeInput" in records["c"].error
    assert records["a"].status == "ok"


def test_a_backend_that_overrides_only_generate_has_no_token_budget_and_nothing_to_close():
    from grader.backends import Backend, Completion
    from grader.run.request import GradeRequest
    from grader.run.rows import open_backend

    class Minimal(Backend):
        name = "minimal"

        def generate(self, requests):
            return [Completion("", "stop") for _ in requests]

    backend, budget = open_backend(
        GradeRequest(model="m"), "minimal", {}, 10,
        lambda name, **options: Minimal(options["model"], schema=options["schema"],
                                        sampling=options["sampling"],
                                        max_tokens=options["max_tokens"]),
    )
    assert budget is None and backend.max_tokens == 10 and backend.chunk_size > 0
    assert backend.token_upper_bounds([[]]) is None
    backend.close()


def _byte_level_formatter():
    """A real ChatFormatter over a byte-level BPE built here (no model): bounded by bytes."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from grader.backends.chat import ChatFormatter

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # one token per byte, no merges
    vocab = {"[UNK]": 0, **{symbol: i + 1 for i, symbol in enumerate(alphabet)}}
    tokenizer = Tokenizer(models.BPE(vocab, [], unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                          "<|im_end|>\n{% endfor %}")
    formatter = ChatFormatter(fast)
    assert formatter.bounded_by_bytes
    return formatter


def test_a_rows_token_check_tokenizes_only_the_rows_its_byte_bound_does_not_clear(tmp_path):
    # grader's own cost per row was mostly tokenizing: a backend whose chat formatter bounds
    # prompts by their bytes must have only the rows near the context counted exactly. Here
    # the huge row alone (its bytes exceed the limit); the two short rows never.
    class Formatted(BudgetedFake):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.formatter = _byte_level_formatter()
            self.tokenized: list[str] = []

        def count_tokens(self, conversations):
            self.tokenized += [c[-1]["content"] for c in conversations]
            return self.formatter.count_many(conversations)

    class Factory(BudgetedFactory):
        def __call__(self, name, **options):
            self.backend = Formatted(context_length=self.context_length)
            return self.backend

    factory = Factory(4000)
    summary, records = _grade(tmp_path, factory)
    assert records["a"].status == records["c"].status == "ok"
    assert records["huge"].status == "context_overflow"
    assert len(factory.backend.tokenized) == 1 and HUGE[:100] in factory.backend.tokenized[0]
    assert summary["run"]["token_budget"]["counted"] == "near the limit"


def test_a_backend_without_a_byte_bound_counts_every_row_and_says_so(tmp_path):
    factory = BudgetedFactory(context_length=4000)
    summary, _ = _grade(tmp_path, factory)
    assert factory.backend.counted == [2, 3]  # the 2 references' drafts, then the 3 rows
    assert summary["run"]["token_budget"]["counted"] == "every row"
