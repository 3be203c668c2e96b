"""A floor to beat (issue 28): a judge that needs no model, only word overlap.

Each rubric item is marked present when at least half (:data:`FLOOR_SHARE`) of its content
words occur in the answer, with the content words of the rubric format
(:func:`grader.judge.rubric.content_words`: case-folded words, stopwords left out); the counts
then go through the seed's formula exactly (:func:`grader.judge.scoring.compute_score`). The
items are the record's rubric where it has one (the rubric format), else the reference's
sentences as its facts (no conclusions, no terms). Organization is counted as matched: word
overlap cannot tell order, and the credit is the same for every row.

On the human scores shipped in examples/qa.jsonl it agrees at quadratic kappa 0.71
(docs/judging.md); a judge that does not beat it is not worth its GPU. Pure: no model, no file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from grader.judge.rubric import GROUNDED_SHARE, content_words
from grader.judge.scoring import Counts, compute_score

# "Most" of an item's words: at least half, the share the rubric format checks an item's
# grounding in the reference with.
FLOOR_SHARE = GROUNDED_SHARE
FLOOR_METHOD = (
    f"word overlap, no model: a rubric item is present when at least {FLOOR_SHARE:.0%} of its "
    "content words occur in the answer (items: the record's rubric, else the reference's "
    "sentences as its facts), then the seed's formula"
)
# A sentence ends at . ! or ? followed by white space ("101.325 kPa" stays one sentence).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def reference_facts(reference: str) -> list[str]:
    """The reference's sentences: the facts of a reference without a rubric."""
    return [s for s in _SENTENCE_END.split(reference.strip()) if content_words(s)]


def item_present(item: str, answer_words: set[str]) -> bool:
    """At least :data:`FLOOR_SHARE` of the item's content words are among the answer's."""
    words = content_words(item)
    return bool(words) and len(words & answer_words) / len(words) >= FLOOR_SHARE


def _lists(rubric: Mapping[str, Any] | None, reference: str) -> tuple[dict[str, list[str]], str]:
    if isinstance(rubric, Mapping) and rubric.get("facts"):
        lists = {c: [str(t) for t in rubric.get(c) or []] for c in ("facts", "conclusions", "terms")}
        return lists, "rubric"
    return {"facts": reference_facts(reference), "conclusions": [], "terms": []}, "reference"


def floor_score(answer: Any, reference: Any, rubric: Mapping[str, Any] | None = None
                ) -> tuple[int, str]:
    """The floor's score 0-5 of one answer and where its items came from (``rubric``,
    ``reference``, or ``missing`` when the answer or the reference is blank: 0, as the seed
    scores a row without context)."""
    answer = answer if isinstance(answer, str) else ""
    reference = reference if isinstance(reference, str) else ""
    if not answer.strip() or not (reference.strip() or rubric):
        return 0, "missing"
    lists, source = _lists(rubric, reference)
    if not lists["facts"]:
        return 0, "missing"
    words = content_words(answer)
    matched = {c: sum(item_present(t, words) for t in items) for c, items in lists.items()}
    counts = Counts(matched["facts"], len(lists["facts"]), matched["conclusions"],
                    len(lists["conclusions"]), matched["terms"], len(lists["terms"]), "matched")
    score = compute_score(counts)
    assert score.rounded is not None  # matched counts never exceed their totals here
    return score.rounded, source
