"""Judge answers for tests, in the exact compact form guided decoding produces."""

from __future__ import annotations

import json


def answer(
    facts=(2, 3),
    conclusions=(1, 1),
    terms=(2, 4),
    organization="matched",
    score=3,
    checklist=("Find the facts", "Find the conclusions", "Find the terms"),
    score_line="Score: 3 ≈ 3.21 = 5 × (0.4 × 2/3 + 0.3 × 1/1 + 0.21 × 2/4 + 0.09 × 1)",
) -> str:
    """A schema-valid answer (when its numbers are in range) as the judge would write it."""
    data = {}
    if checklist is not None:
        data["checklist"] = list(checklist)
    data["score"] = score
    data["rationale"] = [
        f"Fact: {facts[0]} of {facts[1]} correctly matched.",
        f"Conclusion: {conclusions[0]} of {conclusions[1]} correctly matched.",
        f"Terminology: {terms[0]} of {terms[1]} terms correctly matched.",
        f"Organization: {organization}",
        score_line,
    ]
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def itemized_answer(
    facts=(("Water boils at 100 C at sea level", "boils at 100 °C", True),
           ("Pressure falls with altitude", "", False)),
    conclusions=(("Food cooks more slowly up high", "cooking takes longer", True),),
    terms=(("vapor pressure", "vapor pressure", True), ("pressure cooker", "", False)),
    organization="matched",
    lines=None,
    score=3,
) -> str:
    """A schema-valid itemized answer; ``lines`` defaults to the counts of the items."""

    def found(entries):
        return [{"item": i, "quote": q, "present": p} for i, q, p in entries]

    def count(entries):
        return sum(1 for e in entries if e[2]), len(entries)

    if lines is None:
        (fm, ft), (cm, ct), (tm, tt) = count(facts), count(conclusions), count(terms)
        lines = (
            f"Fact: {fm} of {ft} correctly matched.",
            f"Conclusion: {cm} of {ct} correctly matched.",
            f"Terminology: {tm} of {tt} terms correctly matched.",
        )
    data = {
        "facts": found(facts),
        "conclusions": found(conclusions),
        "terms": found(terms),
        "organization": organization,
        "rationale": list(lines),
        "score": score,
    }
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
