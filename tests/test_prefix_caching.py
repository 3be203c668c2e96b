"""The seed prompt is laid out for vLLM's prefix cache: every row's prompt starts with the same
tokens (the whole system turn), so the judge's instructions are prefilled once per engine.
"""

from __future__ import annotations

import pytest
from conftest import EXAMPLES

from grader.backends.chat import ChatFormatter, load_tokenizer
from grader.io.dataset import REQUIRED_FIELDS, read_items
from grader.judge.prompts import load_prompt, render_messages


def _missing(item):
    """The required fields a row leaves empty (its judge's missing_context)."""
    return [name for name in REQUIRED_FIELDS if not item.fields[name]]


# vLLM caches whole KV blocks: 16 tokens by default (CacheConfig.DEFAULT_BLOCK_SIZE, vLLM
# 0.32.0; some attention backends pick larger blocks)
BLOCK_SIZE = 16


def _shared_prefix_length(sequences: list[list[int]]) -> int:
    length = 0
    for column in zip(*sequences):
        if len(set(column)) != 1:
            break
        length += 1
    return length


@pytest.mark.parametrize("checklist", [True, False])
def test_every_rows_prompt_is_the_shared_system_turn_plus_its_own_suffix(tiny_model, checklist):
    tokenizer = load_tokenizer(str(tiny_model))
    formatter = ChatFormatter(tokenizer)
    prompt = load_prompt("seed")
    items = [item for item in read_items(str(EXAMPLES / "qa.jsonl")) if not _missing(item)]
    assert len(items) >= 20
    conversations = [render_messages(prompt, item.fields, checklist=checklist) for item in items]
    texts = [formatter.prompt(c) for c in conversations]
    token_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    shared = _shared_prefix_length(token_ids)
    [system] = [m for m in conversations[0] if m["role"] == "system"]
    system_turn = tokenizer.apply_chat_template([system], tokenize=False)
    system_tokens = len(tokenizer(system_turn, add_special_tokens=False)["input_ids"])
    assert system_tokens > 1000  # the seed's instructions: most of every prompt
    assert shared >= 0.9 * system_tokens
    assert (shared // BLOCK_SIZE) * BLOCK_SIZE >= 0.9 * system_tokens  # what vLLM can reuse
    assert shared >= 0.6 * max(len(ids) for ids in token_ids)

    prefix = token_ids[0][:shared]
    prefix_text = tokenizer.decode(prefix)
    assert prefix_text.startswith(system_turn)  # the whole system turn, not just most of it
    for item, ids, text in zip(items, token_ids, texts):
        assert ids[:shared] == prefix
        suffix_text = tokenizer.decode(ids[shared:])
        assert prefix_text + suffix_text == text
        # the row's own data lies in its suffix alone
        for field in ("reference", "output_text"):
            assert str(item.fields[field]).strip() in suffix_text
            assert str(item.fields[field]).strip() not in prefix_text
