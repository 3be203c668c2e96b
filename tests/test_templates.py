"""Judge prompts: the seed (golden + verbatim), prompt files, the sandbox, rendering, merging."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT

from grader.backends.chat import merge_system_into_user
from grader.io.dataset import DatasetError, read_items
from grader.judge.judges import SeedJudge
from grader.judge.prompts import (
    PromptError,
    RenderError,
    builtin_prompts,
    load_prompt,
    render_messages,
    renders,
)
from grader.run.rows import prepare_jobs

GOLDEN = ROOT / "tests" / "golden" / "seed_rendered.json"
SEED_TEXT = Path("/work/shared/seed/judge_prompt.txt")  # the user's original, where present
SEED_FIELDS = ("input", "reference", "output_text")
# a row whose values are the template's own placeholders: rendering gives the template text back
PLACEHOLDERS = {name: f"{{{{ item.{name} }}}}" for name in SEED_FIELDS}
ROW = {"input": "Q?", "reference": "The reference.", "output_text": "The answer."}


def _prompt_file(tmp_path: Path, content: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    return path


def _user_prompt(tmp_path: Path, template: str) -> Path:
    spec = {"messages": [{"role": "user", "content": template}]}
    return _prompt_file(tmp_path, json.dumps(spec), "u.json")


def _render_one(tmp_path: Path, template: str, item: dict | None = None) -> str:
    prompt = load_prompt(str(_user_prompt(tmp_path, template)))
    return render_messages(prompt, item if item is not None else dict(ROW))[0]["content"]


def _verbatim_template() -> str:
    import yaml

    data = yaml.safe_load((ROOT / "prompts" / "seed-verbatim.yaml").read_text(encoding="utf-8"))
    return data["messages"][0]["content"]


# ---------------------------------------------------------------- the seed


def test_seed_renders_as_the_golden_file():
    """The exact messages the judge gets for a real row; GRADER_UPDATE_GOLDEN=1 rewrites them."""
    if os.environ.get("GRADER_UPDATE_GOLDEN") == "1":
        q01 = read_items(str(EXAMPLES / "qa.jsonl"))[0]
        assert q01.id == "q01"
        row = {name: q01.fields[name] for name in SEED_FIELDS}
        messages = render_messages(load_prompt("seed"), row, checklist=True)
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        golden = {"prompt": "seed", "checklist": True, "row": row, "messages": messages}
        GOLDEN.write_text(json.dumps(golden, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    prompt = load_prompt(golden["prompt"])
    rendered = render_messages(prompt, golden["row"], checklist=golden["checklist"])
    assert rendered == golden["messages"]
    assert [m["role"] for m in rendered] == ["system", "user"]


def test_seed_verbatim_reproduces_the_seed_text():
    prompt = load_prompt("seed-verbatim")
    assert prompt.roles == ("user",)
    for checklist in (True, False):  # the verbatim seed has no checklist switch
        (message,) = render_messages(prompt, PLACEHOLDERS, checklist=checklist)
        assert message["role"] == "user"
        # the row's "{{ item.input }}" is printed, not evaluated: the template comes back whole
        assert message["content"] == _verbatim_template()
        assert message["content"].startswith("Developer:\n## Role and Objective\n")


@pytest.mark.skipif(not SEED_TEXT.is_file(), reason="the user's seed text is not on this machine")
def test_seed_verbatim_is_the_users_text():
    (message,) = render_messages(load_prompt("seed-verbatim"), PLACEHOLDERS, checklist=False)
    assert message["content"] == SEED_TEXT.read_text(encoding="utf-8")


def test_seed_split_loses_nothing():
    """system + user of `seed` put back in the seed's order give the verbatim text exactly."""
    system, user = render_messages(load_prompt("seed"), PLACEHOLDERS, checklist=False)
    assert (system["role"], user["role"]) == ("system", "user")
    (verbatim,) = render_messages(load_prompt("seed-verbatim"), PLACEHOLDERS, checklist=False)
    verbatim = verbatim["content"]
    head, marker, tail = system["content"].partition("## Output Format")
    assert marker, "the system message lost its Output Format section"
    assert verbatim == "Developer:\n" + head + user["content"] + "\n" + marker + tail
    # and line by line: every line of the seed is in one of the two messages
    lines = set((system["content"] + user["content"]).splitlines())
    assert [line for line in verbatim.splitlines() if line not in lines] == ["Developer:"]
    # the row lives only in the user message, so the system message is a shared prefix
    assert "{{ item" not in system["content"] and user["content"].startswith("## Context\n")


def test_checklist_switch():
    prompt = load_prompt("seed")
    with_checklist = render_messages(prompt, ROW, checklist=True)
    without = render_messages(prompt, ROW, checklist=False)
    assert with_checklist[1] == without[1]  # the user message does not change
    paragraph = (
        "\n## Checklist inside the JSON\n"
        "Write the concise checklist inside the JSON itself: "
        'a "checklist" array of 3-7 short strings, placed before "score".\n'
    )
    assert without[0]["content"].endswith("or escalate if required context is missing.\n")
    assert "checklist\" array" not in without[0]["content"]
    assert with_checklist[0]["content"] == without[0]["content"] + paragraph
    # the default is the checklist
    assert render_messages(prompt, ROW) == with_checklist


def test_seed_user_message_carries_the_row():
    _, user = render_messages(load_prompt("seed"), ROW)
    assert user["content"] == (
        "## Context\n<input>\nQ?\n</input>\n<reference>\nThe reference.\n</reference>\n"
        "<model_output>\nThe answer.\n</model_output>\n"
    )


def test_builtin_prompts():
    builtin = builtin_prompts()
    assert {"seed", "seed-verbatim"} <= set(builtin)
    assert all(path.is_file() for path in builtin.values())
    assert load_prompt().name == "seed"  # the default
    prompt = load_prompt("seed")
    assert prompt.roles == ("system", "user")  # the seed's "developer" is the system role
    assert prompt.sha256 == hashlib.sha256(builtin["seed"].read_bytes()).hexdigest()


def test_unknown_prompt_name_lists_the_builtins():
    with pytest.raises(PromptError) as info:
        load_prompt("sede")
    assert "'sede'" in str(info.value) and "seed, seed-check, seed-itemized, seed-pairwise, seed-rubric, seed-verbatim" in str(info.value)


def test_missing_prompt_file(tmp_path):
    with pytest.raises(PromptError, match="not found") as info:
        load_prompt(str(tmp_path / "nope.yaml"))
    assert str(tmp_path / "nope.yaml") in str(info.value)


# ---------------------------------------------------------------- row text is data


@pytest.mark.parametrize("text", [
    "{{ 7*7 }}",
    "{% for x in range(3) %}{{ x }}{% endfor %}",
    "{% for %}",
    "{{ item.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% raw %}{{ x }}{% endraw %} {# comment #} }}",
])
def test_row_text_is_printed_not_evaluated(text):
    row = {"input": text, "reference": text, "output_text": text}
    _, user = render_messages(load_prompt("seed"), row)
    assert user["content"].count(text) == 3
    assert "49" not in user["content"] and "012" not in user["content"]


def test_sample_output_text_openai_style(tmp_path):
    path = _prompt_file(tmp_path, json.dumps({
        "name": "openai-style",
        "messages": [
            {"type": "message", "role": "developer", "content": "Grade it."},
            {"role": "user", "content": "ref={{ item.reference }} answer={{ sample.output_text }}"},
        ],
    }), "grader.json")
    prompt = load_prompt(str(path))
    assert prompt.name == "openai-style" and prompt.roles == ("system", "user")
    assert render_messages(prompt, ROW) == [
        {"role": "system", "content": "Grade it."},
        {"role": "user", "content": "ref=The reference. answer=The answer."},
    ]


def test_yaml_prompt_file_and_checklist_variable(tmp_path):
    path = _prompt_file(tmp_path, (
        "messages:\n"
        "- role: system\n  content: \"S{% if checklist %} +checklist{% endif %}\"\n"
        "- role: assistant\n  content: ok\n"
        "- role: user\n  content: \"{{ item.extra | upper }}\"\n"
    ), "mine.yml")
    prompt = load_prompt(str(path))
    assert prompt.name == "mine"  # the file's stem when it has no name
    assert render_messages(prompt, {**ROW, "extra": "x"}, checklist=False) == [
        {"role": "system", "content": "S"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "X"},
    ]
    assert render_messages(prompt, {**ROW, "extra": "x"})[0]["content"] == "S +checklist"


# ---------------------------------------------------------------- the sandbox, render errors


@pytest.mark.parametrize("template", [
    "{{ item.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ item.input.__class__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ item.update({'input': 'x'}) }}",  # the environment is immutable
    "{{ item.pop('input') }}",
])
def test_sandbox_escapes_are_render_errors(tmp_path, template):
    row = dict(ROW)
    with pytest.raises(RenderError, match="blocked by the sandbox") as info:
        _render_one(tmp_path, template, row)
    assert "prompt u:" in str(info.value)
    assert row == ROW  # nothing was changed


@pytest.mark.parametrize("template, kind", [
    ("{{ item.input + 1 }}", "TypeError"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{{ range(10**9) | list }}", "OverflowError"),  # the sandbox's range limit
    ('{% include "other.txt" %}', "TypeError"),  # no loader: no files can be read
])
def test_template_runtime_errors_are_render_errors(tmp_path, template, kind):
    with pytest.raises(RenderError, match=kind) as info:
        _render_one(tmp_path, template)
    assert "\n" not in str(info.value)


def test_missing_field_names_it(tmp_path):
    with pytest.raises(RenderError, match="'question'"):
        _render_one(tmp_path, "Q: {{ item.question }}")
    with pytest.raises(RenderError, match="'question'"):
        _render_one(tmp_path, "{{ item.question.text }}")
    # a filter or test does not hide it either (StrictUndefined)
    with pytest.raises(RenderError, match="'question'"):
        _render_one(tmp_path, "{{ item.question | upper }}")
    # `is defined` is the way to make a field optional
    optional = "{% if item.question is defined %}q{% else %}none{% endif %}"
    assert _render_one(tmp_path, optional) == "none"


def test_prepare_jobs_turns_render_errors_into_dataset_errors(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(
        '{"id": "a", "reference": "r", "output_text": "o", "question": "q"}\n'
        '{"id": "b", "reference": "", "output_text": "o"}\n'
        '{"id": "c", "reference": "r", "output_text": "o"}\n',
        encoding="utf-8",
    )
    items = read_items(str(data))
    judge = SeedJudge(str(_user_prompt(tmp_path, "{{ item.question }}")))
    with pytest.raises(DatasetError) as info:
        prepare_jobs(str(data), items, judge)
    # row b is missing its reference, so it is never rendered: the error is row c's
    assert str(info.value).startswith(f"{data}:3: ") and "'question'" in str(info.value)


# ---------------------------------------------------------------- prompt file errors


@pytest.mark.parametrize("name, content, expected", [
    ("bad.yaml", "messages:\n- role: user\n  content: ok\n- role: [user\n",
     r"bad\.yaml:\d+: invalid YAML"),
    ("role.yaml", "messages:\n- role: tool\n  content: x\n", r"role\.yaml: messages\.0\.role: "),
    ("none.yaml", "name: x\n", r"none\.yaml: messages: Field required"),
    ("empty-list.yaml", "messages: []\n", r"empty-list\.yaml: messages is empty"),
    ("typo.yaml", "messages:\n- role: user\n  contents: x\n", r"typo\.yaml: messages\.0\."),
    ("empty.yaml", "", r"empty\.yaml: expected a mapping .* got an empty file"),
    ("list.yaml", "- role: user\n", r"list\.yaml: expected a mapping .* got a list"),
    ("bad.json", '{"messages": [\n  {"role": "user",}\n]}', r"bad\.json:2: invalid JSON"),
    ("syntax.yaml", "messages:\n- role: user\n  content: |\n    one\n    {% for %}\n",
     r"syntax\.yaml: messages\[0\]\.content line 2: "),
    ("filter.yaml",
     "messages:\n- role: system\n  content: ok\n"
     "- role: user\n  content: '{{ item.input | nope }}'\n",
     r"filter\.yaml: messages\[1\]\.content line 1: .*nope"),
])
def test_prompt_file_errors_name_the_file(tmp_path, name, content, expected):
    path = _prompt_file(tmp_path, content, name)
    with pytest.raises(PromptError, match=expected) as info:
        load_prompt(str(path))
    message = str(info.value)
    assert message.startswith(str(path)) and "\n" not in message


def test_invalid_yaml_names_the_line(tmp_path):
    text = "messages:\n- role: user\n  content: ok\n  content: [\n"
    path = _prompt_file(tmp_path, text, "l.yaml")
    with pytest.raises(PromptError, match=r"l\.yaml:5: invalid YAML"):
        load_prompt(str(path))


# ---------------------------------------------------------------- merge_system_into_user


def test_merge_system_into_user():
    messages = [
        {"role": "system", "content": "S1"},
        {"role": "user", "content": "U1"},
        {"role": "system", "content": "S2"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "U2"},
    ]
    before = json.loads(json.dumps(messages))
    assert merge_system_into_user(messages) == [
        {"role": "user", "content": "S1\n\nS2\n\nU1"},
        {"role": "assistant", "content": "A"},
        {"role": "user", "content": "U2"},
    ]
    assert messages == before  # the input is not changed


def test_merge_without_system_or_without_user():
    plain = [{"role": "user", "content": "U"}]
    merged = merge_system_into_user(plain)
    assert merged == plain and merged[0] is not plain[0]
    no_user = [{"role": "system", "content": "S"}, {"role": "assistant", "content": "A"}]
    assert merge_system_into_user(no_user) == [
        {"role": "user", "content": "S"},
        {"role": "assistant", "content": "A"},
    ]


def test_merged_seed_is_the_system_text_then_the_context():
    system, user = render_messages(load_prompt("seed"), ROW)
    (merged,) = merge_system_into_user([system, user])
    assert merged == {"role": "user", "content": system["content"] + "\n\n" + user["content"]}


# ---------------------------------------------------------------- rendering what is static once


@pytest.mark.parametrize("template, static", [
    ("Plain instructions.", True),
    ("A{% if checklist %} with a checklist{% else %} without{% endif %}.", True),
    ("{% if not checklist %}no checklist{% endif %}", True),
    ("checklist is {{ checklist }}", True),  # the value's text: one rendering per value
    ("Q: {{ item.input }}", False),
    ("{{ sample.output_text }}", False),
    ("{{ lipsum(1) }}", False),  # random text each time
    ("{{ [1, 2, 3] | random }}", False),
    ("{% set x = 1 %}{{ x }}", False),
    ("{{ 1 / 0 }}", False),
    ("{% for i in range(2) %}{{ i }}{% endfor %}", False),
    ("{% if checklist %}{{ item.input }}{% endif %}", False),
])
def test_templates_that_depend_only_on_the_checklist_switch(tmp_path, template, static):
    prompt = load_prompt(str(_user_prompt(tmp_path, template)))
    assert prompt.static == (static,)


def test_seed_system_message_is_rendered_once_per_checklist_value():
    import dataclasses

    prompt = load_prompt("seed")
    assert prompt.static == (True, False)
    uncached = dataclasses.replace(prompt, static=())
    rows = [dict(ROW), {**ROW, "input": "</reference> other"}, dict(PLACEHOLDERS)]
    for checklist in (True, False, True):
        for row in rows:
            assert render_messages(prompt, row, checklist=checklist) == render_messages(
                uncached, row, checklist=checklist
            )
    first = render_messages(prompt, ROW)[0]["content"]
    assert render_messages(prompt, ROW)[0]["content"] is first  # served from the cache
    assert render_messages(prompt, ROW, checklist=False)[0]["content"] != first
    assert uncached._rendered == {}


# ---------------------------------------------------------------- vouching without a render


@pytest.mark.parametrize(("template", "vouched"), [
    ("{{ item.input }} and {{ sample.output_text }}{% if checklist %} ok{% endif %}", True),
    ("{{ item.missing }}", False),  # only a render can say (it fails)
    ("{{ item.items }}", False),  # the dict's method, not a field
    ("{{ item.n }}", False),  # not text: printed as JSON
    ("{{ sample.reference }}", False),
    ("{{ item.input | upper }}", False),
    ("{% for c in item.input %}{{ c }}{% endfor %}", False),
    ("{{ item }}", False),
    ('{{ "\\u0000" }}', False),  # a NUL the template itself prints
])
def test_a_prompt_vouches_for_a_row_only_where_its_render_cannot_fail(tmp_path, template, vouched):
    prompt = load_prompt(str(_user_prompt(tmp_path, template)))
    row = {**ROW, "n": 1}
    assert renders(prompt, row) is vouched
    if vouched:
        render_messages(prompt, row)


def test_a_row_past_the_render_bound_is_not_vouched_for(tmp_path):
    prompt = load_prompt(str(_user_prompt(tmp_path, "{{ item.input }}" * 5)))
    assert renders(prompt, ROW)
    assert not renders(prompt, {"input": "x" * 2**22})  # 5 x 4 MiB > 16 MiB: a render says
    with pytest.raises(RenderError, match="passed"):
        render_messages(prompt, {"input": "x" * 2**22})
