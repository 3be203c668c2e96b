"""A text's content words: its case-folded words, stopwords left out. Pure.

What grader compares texts by where no model reads them: an item's grounding in its reference
and its near duplicates (grader.judge.rubric), and the word-overlap floor's marks
(grader.analysis.floor)."""

from __future__ import annotations

import re

WORD = re.compile(r"\w+")
# Words that say nothing about content; grounding, duplicates and overlap are judged on the rest.
STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was were "
    "which with not no".split()
)
#: "Most" of an item's content words: at least half.
MOST_WORDS = 0.5


def content_words(text: str) -> set[str]:
    """The text's case-folded words, stopwords left out."""
    return {w for w in WORD.findall(text.casefold()) if w not in STOPWORDS}
