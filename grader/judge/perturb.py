"""The answers grader makes up to test its judge: controls and perturbations.

Pure and deterministic: no model, no randomness, no file. The same row always gives the same
text, so a control or an audit row resumes like any other row.

- **Controls** (every ``grade`` run, :mod:`grader.run.controls`): the reference itself as the
  answer (a sound judge gives it the top score), a fluent wrong answer (the reference of
  another question in the data) and a non-answer.
- **Perturbations** (``grader audit``): an answer changed in one way a sound judge should see
  through (padding, an injected instruction, a fake citation) or should punish (truncation,
  the reference with its claims negated).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

# ---------------------------------------------------------------- controls

#: The controls, in the order they are shown.
CONTROL_KINDS = ("reference", "wrong", "non_answer")

#: The non-answer control.
NON_ANSWER = "I don't know."

#: What a control answer is, in one line each (the terminal and README use these).
CONTROL_MEANING = {
    "reference": "the reference itself as the answer: a sound judge gives it the top score",
    "wrong": "the reference of another question: fluent, on no topic of this one; it should score low",
    "non_answer": f"{NON_ANSWER!r}: it should score low",
}

#: The wrong answer where the data has a single reference: fluent, confident, off-topic.
OFF_TOPIC = (
    "The Great Barrier Reef lies off the coast of Queensland, Australia, and is the largest "
    "coral reef system in the world. It is made of thousands of individual reefs and hundreds "
    "of islands, and it can be seen from space."
)


def sample_keys(keys: Sequence[str], n: int) -> list[str]:
    """``n`` of ``keys`` (distinct), chosen deterministically: those whose SHA-256 comes first.

    The choice depends on the keys only, not on their order in the data, so a reordered or
    grown data file keeps most of its sample (and a rerun resumes it).
    """
    return sorted(set(keys), key=_digest)[:n]


def wrong_answers(references: Sequence[str]) -> list[str]:
    """For each reference, a fluent wrong answer: the next different reference in the list
    (cyclically), or :data:`OFF_TOPIC` where every reference is the same text."""
    wrong = []
    count = len(references)
    for index, reference in enumerate(references):
        other = next((references[(index + step) % count] for step in range(1, count)
                      if references[(index + step) % count].strip() != reference.strip()), None)
        wrong.append(other if other is not None else OFF_TOPIC)
    return wrong


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "backslashreplace")).hexdigest()
