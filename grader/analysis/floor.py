"""A floor to beat: a judge that needs no model, only word overlap.

Each item is marked present when at least half (:data:`FLOOR_SHARE`) of its content words
occur in the answer (:func:`grader.judge.words.content_words`: case-folded words, stopwords
left out); the counts then go through the seed's formula exactly
(:func:`grader.judge.scoring.compute_score`). The items are the lists the record's items were
marked against where it has them (:meth:`grader.records.Record.listed_items`), else the
reference's sentences as its facts (no conclusions, no terms). Organization is counted as
matched: word overlap cannot tell order, and the credit is the same for every row.

On the human scores shipped in examples/qa.jsonl it agrees at quadratic kappa 0.71
(docs/judging.md); a judge that does not beat it is not worth its GPU. Pure: no model, no file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from grader.judge.scoring import Counts, compute_score
from grader.judge.words import MOST_WORDS, content_words
from grader.records import ITEM_CATEGORIES, LISTED_ITEMS_FIELD

# "Most" of an item's words: at least half, the share an item's grounding in the reference is
# checked with.
FLOOR_SHARE = MOST_WORDS
FLOOR_METHOD = (
    f"word overlap, no model: a {LISTED_ITEMS_FIELD} item is present when at least "
    f"{FLOOR_SHARE:.0%} of its content words occur in the answer (items: the record's "
    f"{LISTED_ITEMS_FIELD}, else the reference's sentences as its facts), then the seed's formula"
)
#: Where a row's items came from (agree's ``items_from``): the record's listed items (named by
#: the field that holds them), the reference's sentences, or none (a blank answer or reference).
SOURCES = (LISTED_ITEMS_FIELD, "reference", "missing")
# A sentence ends at . ! or ? followed by white space ("101.325 kPa" stays one sentence).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def reference_facts(reference: str) -> list[str]:
    """The reference's sentences: the facts of a row without listed items."""
    return [s for s in _SENTENCE_END.split(reference.strip()) if content_words(s)]


def item_present(item: str, answer_words: set[str]) -> bool:
    """At least :data:`FLOOR_SHARE` of the item's content words are among the answer's."""
    words = content_words(item)
    return bool(words) and len(words & answer_words) / len(words) >= FLOOR_SHARE


def _lists(items: Mapping[str, list[str]] | None, reference: str
           ) -> tuple[dict[str, list[str]], str]:
    if items is not None and items.get("facts"):
        return {c: list(items.get(c) or []) for c in ITEM_CATEGORIES}, SOURCES[0]
    return {"facts": reference_facts(reference), "conclusions": [], "terms": []}, "reference"


def floor_score(answer: Any, reference: Any, items: Mapping[str, list[str]] | None = None
                ) -> tuple[int, str]:
    """The floor's score 0-5 of one answer and where its items came from (one of
    :data:`SOURCES`: ``items`` given, the ``reference``'s sentences, or ``missing`` when the
    answer or the reference is blank: 0, as the seed scores a row without context).

    Args:
        items: the record's listed items (:meth:`grader.records.Record.listed_items`), or None.
    """
    answer = answer if isinstance(answer, str) else ""
    reference = reference if isinstance(reference, str) else ""
    if not answer.strip() or not (reference.strip() or items):
        return 0, "missing"
    lists, source = _lists(items, reference)
    if not lists["facts"]:
        return 0, "missing"
    words = content_words(answer)
    matched = {c: sum(item_present(t, words) for t in texts) for c, texts in lists.items()}
    counts = Counts(matched["facts"], len(lists["facts"]), matched["conclusions"],
                    len(lists["conclusions"]), matched["terms"], len(lists["terms"]), "matched")
    score = compute_score(counts)
    assert score.rounded is not None  # matched counts never exceed their totals here
    return score.rounded, source
