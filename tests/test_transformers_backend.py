"""The transformers backend on the tiny model: order, padding, truncation, chat templates."""

from __future__ import annotations

import json
import shutil

import pytest

from grader.config import SamplingConfig, TransformersConfig
from grader.judge.records import judged_record
from grader.judge.schema import max_answer_chars, verdict_schema

pytestmark = pytest.mark.slow


def _backend(model, *, batch_size=4, max_tokens=None, checklist=False, **sampling):
    from grader.backends.transformers_backend import TransformersBackend

    return TransformersBackend(
        str(model),
        schema=verdict_schema(checklist),
        sampling=SamplingConfig(**sampling),
        max_tokens=max_tokens or max_answer_chars(checklist),
        config=TransformersConfig(batch_size=batch_size, device="cpu"),
    )


def _requests(conversations, schemas=None):
    from grader.backends import requests_of

    return requests_of(conversations, schemas)


def _conversations(n):
    # different lengths, so a batch needs left padding
    return [
        [
            {"role": "system", "content": "You grade answers. Reply in JSON."},
            {"role": "user", "content": f"Question {i}: " + "why is the sky blue? " * (1 + 3 * i)},
        ]
        for i in range(n)
    ]


def test_batched_greedy_answers_equal_one_by_one_answers(tiny_model):
    conversations = _conversations(5)
    batched = _backend(tiny_model, batch_size=5).generate(_requests(conversations))
    single = _backend(tiny_model, batch_size=1)
    one_by_one = [single.generate(_requests([c]))[0] for c in conversations]
    assert [c.text for c in batched] == [c.text for c in one_by_one]
    assert [c.prompt_tokens for c in batched] == [c.prompt_tokens for c in one_by_one]
    # and they come back in input order: prompt lengths grow with i
    assert [c.prompt_tokens for c in batched] == sorted(c.prompt_tokens for c in batched)
    for completion in batched:
        assert completion.finish_reason == "stop"
        json.loads(completion.text)


def test_an_answer_cut_at_max_tokens_is_truncated_never_graded(tiny_model):
    [completion] = _backend(tiny_model, max_tokens=12).generate(_requests(_conversations(1)))
    assert completion.finish_reason == "length"
    assert completion.output_tokens == 12
    record = judged_record("x", completion.text, completion.finish_reason)
    assert record.status == "truncated" and record.score is None


def test_seeded_sampling_is_reproducible(tiny_model):
    conversations = _conversations(3)
    first = _backend(tiny_model, temperature=1.0, seed=7).generate(_requests(conversations))
    again = _backend(tiny_model, temperature=1.0, seed=7).generate(_requests(conversations))
    other = _backend(tiny_model, temperature=1.0, seed=8).generate(_requests(conversations))
    assert [c.text for c in first] == [c.text for c in again]
    assert [c.text for c in first] != [c.text for c in other]


def test_a_chat_template_without_system_role_gets_the_system_text_in_the_user_turn(
    tiny_model, tmp_path
):
    model = tmp_path / "no-system"
    shutil.copytree(tiny_model, model)
    template_file = model / "chat_template.jinja"
    rejecting = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    template_file.write_text(rejecting)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = rejecting
    (model / "tokenizer_config.json").write_text(json.dumps(config))

    backend = _backend(model)
    assert backend.formatter.merges_system
    prompt = backend.formatter.prompt(_conversations(1)[0])
    assert "<|im_start|>system" not in prompt
    assert "<|im_start|>user\nYou grade answers. Reply in JSON.\n\nQuestion 0:" in prompt
    [completion] = backend.generate(_requests(_conversations(1)))
    assert completion.finish_reason == "stop"


def test_rubrics_of_any_size_compile_and_a_refused_schema_fails_its_row_alone(tiny_model):
    """xgrammar fails a regex repetition above 128: a rubric of 129+ items made every row of
    its batch an engine error (issue 29, item 7). The labels' pattern is split, so any size
    compiles, and a schema xgrammar does refuse fails only its own row."""
    from grader.judge.schema import check_schema
    from grader.status import Status

    backend = _backend(tiny_model, max_tokens=400)
    # what check_schema(300) was before it split its pattern
    refused = {"type": "object", "properties": {"l": {"type": "string", "pattern": "^[yn]{300}$"}}}
    out = backend.generate(_requests(_conversations(3), [check_schema(3), refused, check_schema(300)]))
    assert out[1].finish_reason == "error" and out[1].failure == Status.INVALID_INPUT
    assert "xgrammar rejects the JSON schema" in out[1].error
    for completion, size in ((out[0], 3), (out[2], 300)):
        assert completion.finish_reason in ("stop", "length"), completion
        if completion.finish_reason == "stop":
            assert len(json.loads(completion.text)["l"]) == size
