#!/usr/bin/env python
"""grader's own overhead per row, with an instant fake judge: stage by stage, peak RSS, rescore.

``grader.run.grading.run_grade`` grades synthetic rows end to end (read -> render -> token count ->
generate -> parse and score -> write) with a backend whose ``generate`` returns precomputed,
schema-valid judge answers at once. Everything else is real. The token-count stage uses a real
fast tokenizer: that of the tiny model (``scripts/make_tiny_model.py``), applied exactly as
``TransformersBackend.count_tokens`` applies it (the chat template on each conversation, then one
batched tokenizer call). The default seed prompt with the checklist is used.

Each size runs in a fresh process (this script re-invokes itself), so ``ru_maxrss`` there is
that run's peak RSS. Stage times come from timers wrapped around the functions the pipeline
calls (see ``_install_timers``); each stage's time excludes time spent in a nested timed
stage, and ``other`` is the run's wall time minus all the stages. Every figure is the best
(minimum) of ``--repeat`` runs, taken per stage.

``grader rescore`` is timed as a subprocess, process start included, on synthetic results
records written the way ``run_grade`` writes them (``raw_output`` and all).

Usage::

    python scripts/bench_pipeline.py                      # 10k and 100k rows, rescore 100k and 1M
    python scripts/bench_pipeline.py --big                # also 1M rows end to end (long)
    python scripts/bench_pipeline.py --json               # one JSON object on stdout
    python scripts/bench_pipeline.py --profile DIR        # also cProfile grade and rescore of 100k rows

Imports grader; grader never imports this file.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("grader") is None:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from grader.backends import Backend  # after sys.path holds the checkout

# Bump when the synthetic data changes, so cached files are rebuilt.
DATA_VERSION = 1
STAGES = ("setup", "read", "render", "token_count", "generate", "parse_score", "keys", "write")
# The targets.
OWN_US_PER_ITEM = 200.0
RESCORE_RECORDS_PER_S = 100_000
RSS_GROWTH_MB = 100.0

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "more can said what up its about into them than only other new some could time these two may "
    "then do first any my now such like our over man me even most made after also did many before "
    "must through back years where much your way well down should because each just those people "
    "photosynthesis chlorophyll mitochondria enzyme protein gradient membrane voltage current "
    "resistance capacitor inductance theorem integral derivative matrix eigenvalue vector tensor "
    "algorithm complexity recursion inflation interest monetary fiscal treaty parliament "
    "revolution dynasty empire climate glacier erosion sediment tectonic volcano 1914 1789 3.14 "
    "42 100 km/h 9.81 m/s² CO₂ H₂O résumé naïve Zürich São café"
).split()


# ----------------------------------------------------------------------------- synthetic data


def _corpus(rng: random.Random, chars: int) -> str:
    words = []
    total = 0
    while total < chars:
        word = rng.choice(_WORDS)
        if rng.random() < 0.08:
            word += rng.choice((".", ",", ";", "?", ".\n"))
        words.append(word)
        total += len(word) + 1
    return " ".join(words)


def _slicer(rng: random.Random, corpus: str):
    def text(mean: int) -> str:
        length = max(20, int(rng.gauss(mean, mean * 0.25)))
        start = rng.randrange(0, len(corpus) - length)
        return corpus[start : start + length].strip()

    return text


def write_dataset(path: Path, rows: int, seed: int = 0) -> Path:
    """``rows`` JSONL rows: id, input ~200 chars, reference ~600, output_text ~600."""
    if path.is_file():
        return path
    rng = random.Random(seed)
    text = _slicer(rng, _corpus(rng, 4_000_000))
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as stream:
        for index in range(rows):
            row = {
                "id": f"row-{index:07d}",
                "input": text(200) + "?",
                "reference": text(600),
                "output_text": text(600),
            }
            stream.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(partial, path)
    return path


def judge_answers(count: int = 256, seed: int = 1) -> list[str]:
    """Schema-valid judge answers in the compact form guided decoding produces, varied counts.

    Mostly gradable; a few with no facts (``ambiguous``) and a few with matched > total
    (``invalid_counts``), as a real judge gives.
    """
    rng = random.Random(seed)
    text = _slicer(rng, _corpus(rng, 200_000).replace("\n", " "))
    answers = []
    for _ in range(count):
        facts_total = rng.randint(0, 8) if rng.random() < 0.05 else rng.randint(1, 8)
        facts = (rng.randint(0, facts_total), facts_total)
        if rng.random() < 0.03:
            facts = (facts_total + 1, facts_total)
        concl_total = rng.randint(0, 3)
        terms_total = rng.randint(0, 6)

        def note() -> str:
            return " " + text(60)[:100].rstrip(" .") + "." if rng.random() < 0.5 else ""

        rationale = [
            f"Fact: {facts[0]} of {facts[1]} correctly matched.{note()}",
            f"Conclusion: {rng.randint(0, concl_total)} of {concl_total} correctly matched.{note()}",
            f"Terminology: {rng.randint(0, terms_total)} of {terms_total} terms correctly matched."
            f"{note()}",
            f"Organization: {rng.choice(('matched', 'mismatched'))}{note()}",
            "Score: 3 ≈ 3.21 = 5 × (0.4 × 2/3 + 0.3 × 1/1 + 0.21 × 2/4 + 0.09 × 1)",
        ]
        data = {
            "checklist": [text(50)[:100].strip() or "Find the facts" for _ in range(rng.randint(3, 7))],
            "score": rng.randint(0, 5),
            "rationale": rationale,
        }
        answers.append(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return answers


def write_results(path: Path, rows: int, seed: int = 2) -> Path:
    """``rows`` results records as ``run_grade`` writes them: judged, with usage and key."""
    if path.is_file():
        return path
    from grader.judge.records import judged_record

    rng = random.Random(seed)
    templates = [
        judged_record(None, answer, "stop", usage={"prompt_tokens": 0, "output_tokens": 0})
        for answer in judge_answers()
    ]
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as stream:
        for index in range(rows):
            record = templates[index % len(templates)].to_dict()
            record["id"] = f"row-{index:07d}"
            record["usage"] = {
                "prompt_tokens": rng.randint(900, 1400),
                "output_tokens": len(record["raw_output"]) // 3,
            }
            record["key"] = f"{rng.getrandbits(256):064x}"
            stream.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
    os.replace(partial, path)
    return path


def tiny_model(work: Path) -> Path:
    """The tiny model's directory, built in a child process: torch stays out of this one."""
    path = work / "tiny-model"
    code = (
        "import importlib.util, sys; "
        "spec = importlib.util.spec_from_file_location('make_tiny_model', sys.argv[1]); "
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); "
        "module.make_tiny_model(sys.argv[2])"
    )
    subprocess.run([sys.executable, "-c", code, str(ROOT / "scripts" / "make_tiny_model.py"), str(path)],
                   check=True, stdout=subprocess.DEVNULL)
    return path


def peak_rss_mb() -> float:
    """This process's peak RSS since it started (VmHWM).

    Not ``ru_maxrss``: Linux carries the parent's RSS at fork into a child's ``ru_maxrss``
    across exec, so a child of a big parent would report at least the parent's size.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----------------------------------------------------------------------------- the child run


class Stopwatch:
    """Exclusive wall and CPU time per stage: a stage nested in another is taken out of it.

    CPU time is the whole process's (``time.process_time``: every thread, the tokenizer's
    worker threads included). On a loaded machine it is the steadier figure: wall time there
    also counts the time other processes held the cores.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self.cpu: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self.calls: dict[str, int] = dict.fromkeys(STAGES, 0)
        self._nested: list[list[float]] = []  # [wall, cpu] of timed stages inside each open frame

    def run(self, stage: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self._nested.append([0.0, 0.0])
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
            inner, inner_cpu = self._nested.pop()
            self.seconds[stage] += elapsed - inner
            self.cpu[stage] += elapsed_cpu - inner_cpu
            self.calls[stage] += 1
            if self._nested:
                self._nested[-1][0] += elapsed
                self._nested[-1][1] += elapsed_cpu

    def wrap(self, stage: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            result = self.run(stage, fn, *args, **kwargs)
            if isinstance(result, Iterator):  # a lazy reader: time each step, not the call
                return self._steps(stage, result)
            return result

        return timed

    def _steps(self, stage: str, iterator: Iterator) -> Iterator:
        while True:
            try:
                value = self.run(stage, next, iterator)
            except StopIteration:
                return
            yield value


class InstantBackend(Backend):
    """A judge that answers at once, with a real tokenizer for the token budget.

    ``count_tokens`` and ``token_upper_bounds`` are the transformers and vLLM backends' own
    (:class:`grader.backends.Backend`'s, from the formatter):
    :class:`grader.backends.chat.ChatFormatter` applies the chat template, then bounds each prompt by
    its UTF-8 bytes or tokenizes it in one batched call. The context is the tiny model's, 8192
    tokens: the budget tokenizes exactly only the rows whose bound does not fit it.
    """

    name = "instant"

    def __init__(self, model: str, *, chunk_size: int, watch: Stopwatch, **options: Any):
        from grader.backends.chat import ChatFormatter, load_tokenizer

        self.tokenizer = load_tokenizer(model)
        self.formatter = ChatFormatter(self.tokenizer)
        config = json.loads((Path(model) / "config.json").read_text())
        self.context_length = int(config["max_position_embeddings"])
        self.chunk_size = chunk_size
        self.answers = judge_answers()
        self.sent = 0
        self._timed = watch.wrap("generate", self._generate)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "context_length": self.context_length}

    def generate(self, requests: Sequence[Any]) -> list[Any]:
        return self._timed(requests)

    def _generate(self, conversations: Sequence[list[dict[str, str]]]) -> list[Any]:
        from grader.backends import Completion

        out = []
        for _ in conversations:
            text = self.answers[self.sent % len(self.answers)]
            self.sent += 1
            out.append(Completion(text, "stop", 1000, len(text) // 3))
        return out


def _install_timers(watch: Stopwatch) -> list[str]:
    """Wrap the functions each stage runs; returns the names wrapped (for the record).

    Wrapped by module attribute, where the pipeline calls them: the streaming reader
    ``grader.io.dataset.Dataset``; ``render_messages`` in ``grader.run.rows``;
    ``TokenBudget.fit``; ``judged_record`` / ``itemized_record`` in ``grader.judge.judges``
    (called by ``SeedJudge``); ``sha256_json`` in ``grader.run.core`` and the results log's
    ``lookup`` (the resume keys); the results log's writes, its final copy in input order
    (``assemble``, read as the summary asks) and the summary's write. A name the pipeline no
    longer has stops the bench: its time would vanish into ``other``.
    """
    import grader.backends.budget
    import grader.io.dataset
    import grader.io.results
    import grader.judge.judges
    import grader.run.core
    import grader.run.grading
    import grader.run.rows

    log = grader.io.results.ResultsLog
    timed = [(grader.io.dataset.Dataset, name, "read")
             for name in ("__init__", "__iter__", "check_unique_ids")]
    timed += [(grader.run.rows, "render_messages", "render"),
              (grader.backends.budget.TokenBudget, "fit", "token_count"),
              (grader.judge.judges, "judged_record", "parse_score"),
              (grader.judge.judges, "itemized_record", "parse_score"),
              (grader.run.core, "sha256_json", "keys"), (log, "lookup", "keys"),
              (grader.run.grading, "write_summary", "write")]
    timed += [(log, name, "write") for name in ("__init__", "write", "assemble", "commit")]
    for owner, name, stage in timed:
        setattr(owner, name, watch.wrap(stage, getattr(owner, name)))
    return [f"{getattr(owner, '__name__', owner)}.{name} -> {stage}" for owner, name, stage in timed]


def child_grade(data: str, model: str, output: str, chunk_size: int, profile: str | None) -> None:
    """One end-to-end run in this fresh process; prints one JSON line."""
    import grader

    # The tokenizer is loaded once before the clock starts, so the imports it pulls in
    # (transformers, torch) are not timed: a one-off of seconds that every real backend pays
    # too, and that would swamp the per-row figures of a 10k-row run. `setup` is then the
    # tokenizer load alone.
    from grader.backends.chat import load_tokenizer
    from grader.run.grading import run_grade
    from grader.run.request import FileJob, GradeRequest

    start = time.perf_counter()
    load_tokenizer(model)
    import_seconds = time.perf_counter() - start
    watch = Stopwatch()
    wrapped = _install_timers(watch)

    def factory(name: str, **options: Any) -> InstantBackend:
        return watch.run("setup", InstantBackend, options.pop("model"), chunk_size=chunk_size,
                         watch=watch, **options)

    request = GradeRequest(model=model, backend="transformers", format="seed")
    rss_before = peak_rss_mb()
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start, start_cpu = time.perf_counter(), time.process_time()
    summary = run_grade(request, FileJob(data, Path(output), overwrite=True),
                        backend_factory=factory)
    total, total_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    rows = summary["rows"]
    stages = dict(watch.seconds)
    stages["other"] = total - sum(stages.values())
    cpu = dict(watch.cpu)
    cpu["other"] = total_cpu - sum(cpu.values())
    print(json.dumps({
        "rows": rows,
        "seconds": stages,
        "total_seconds": total,
        "cpu_seconds": cpu,
        "total_cpu_seconds": total_cpu,
        "statuses": {k: v for k, v in summary["statuses"].items() if v},
        "peak_rss_mb": peak_rss_mb(),
        "import_seconds": import_seconds,
        "rss_before_run_mb": rss_before,
        "wrapped": wrapped,
        "grader": str(Path(grader.__file__).parent),
    }))


# ----------------------------------------------------------------------------- the parent


def _run_child(args: list[str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args],
                          capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"child run failed: {args}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def profile_grade(work: Path, model: Path, rows: int, chunk_size: int, profile: Path) -> None:
    data = write_dataset(work / f"data-{rows}-v{DATA_VERSION}.jsonl", rows)
    _run_child(["--_child-grade", str(data), str(model), str(work / f"results-{rows}.jsonl"),
                str(chunk_size), "--_profile", str(profile)])
    for leftover in work.glob(f"results-{rows}*"):
        leftover.unlink()


def bench_grade(work: Path, model: Path, rows: int, repeat: int, chunk_size: int) -> dict[str, Any]:
    data = write_dataset(work / f"data-{rows}-v{DATA_VERSION}.jsonl", rows)
    runs = []
    for _ in range(repeat):
        output = work / f"results-{rows}.jsonl"
        runs.append(_run_child(["--_child-grade", str(data), str(model), str(output), str(chunk_size)]))
        with open(work / f"grade-runs-{rows}.jsonl", "a") as log:  # kept should a later run stop
            log.write(json.dumps(runs[-1]) + "\n")
        print(f"  grade {rows:>8} rows: {runs[-1]['total_seconds']:.2f} s, "
              f"CPU {runs[-1]['total_cpu_seconds']:.2f} s, peak RSS {runs[-1]['peak_rss_mb']:.0f} MB",
              file=sys.stderr)
    for leftover in work.glob(f"results-{rows}*"):
        leftover.unlink()
    def per_item(key: str, total: str) -> dict[str, float]:
        best = {stage: min(r[key][stage] for r in runs) for stage in runs[0][key]}
        us = {stage: seconds / rows * 1e6 for stage, seconds in best.items()}
        us["total"] = min(r[total] for r in runs) / rows * 1e6
        # grader's own work: everything but the fake judge's answers and its tokenizer load
        us["own"] = min(r[total] - r[key]["generate"] - r[key]["setup"] for r in runs) / rows * 1e6
        return {k: round(v, 2) for k, v in us.items()}

    return {
        "us_per_item": per_item("seconds", "total_seconds"),
        "cpu_us_per_item": per_item("cpu_seconds", "total_cpu_seconds"),
        "peak_rss_mb": round(min(r["peak_rss_mb"] for r in runs), 1),
        "rss_before_run_mb": round(min(r["rss_before_run_mb"] for r in runs), 1),
        "runs_total_seconds": [round(r["total_seconds"], 3) for r in runs],
        "setup_seconds": round(min(r["seconds"]["setup"] for r in runs), 3),
        "import_seconds": round(min(r["import_seconds"] for r in runs), 3),
        "statuses": runs[0]["statuses"],
        "wrapped": runs[0]["wrapped"],
        "grader": runs[0]["grader"],
    }


def _timed_process(command: list[str], cwd: Path) -> tuple[float, float, float]:
    """Wall seconds from spawn to exit, CPU seconds (user + system), and peak RSS in MB.

    The peak is the process's VmHWM (see :func:`peak_rss_mb`), read every 20 ms while it runs:
    a high-water mark, so only growth in its last 20 ms can be missed.
    """
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    status = Path(f"/proc/{process.pid}/status")
    peak = 0
    while True:
        pid, code, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        try:
            line = next(l for l in status.read_text().splitlines() if l.startswith("VmHWM:"))
            peak = max(peak, int(line.split()[1]))
        except (OSError, StopIteration):  # gone, or a zombie without memory
            pass
        time.sleep(0.02)
    elapsed = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(code)
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}); run it to see why")
    return elapsed, usage.ru_utime + usage.ru_stime, peak / 1024


def _rescore_command(work: Path, rows: int) -> list[str]:
    source = write_results(work / f"records-{rows}-v{DATA_VERSION}.jsonl", rows)
    output = work / f"rescored-{rows}.jsonl"
    # --overwrite: each repeat (and the fixed-cost runs) writes the output of the one before
    return [sys.executable, "-m", "grader", "rescore", str(source), "-o", str(output), "--overwrite"]


def profile_rescore(work: Path, rows: int, profile: Path) -> None:
    command = _rescore_command(work, rows)
    _timed_process([sys.executable, "-m", "cProfile", "-o", str(profile), *command[1:]], work)
    for leftover in work.glob(f"rescored-{rows}*"):
        leftover.unlink()


def bench_rescore(work: Path, rows: int, repeat: int) -> dict[str, Any]:
    command = _rescore_command(work, rows)
    source = Path(command[4])
    # cwd: the work dir, so `-m grader` imports the installed grader, not a ./grader beside it
    runs = []
    for _ in range(repeat):
        runs.append(_timed_process(command, work))
        print(f"  rescore {rows:>8} records: {runs[-1][0]:.2f} s, CPU {runs[-1][1]:.2f} s, "
              f"peak RSS {runs[-1][2]:.0f} MB", file=sys.stderr)
    # the fixed cost: process start, imports, summary; timed on a file of one record
    one = _rescore_command(work, 1)
    fixed = [_timed_process(one, work) for _ in range(3)]
    for leftover in work.glob(f"rescored-{rows}*"):
        leftover.unlink()
    best = min(seconds for seconds, _, _ in runs)
    best_cpu = min(cpu for _, cpu, _ in runs)
    return {
        "seconds": round(best, 3),
        "records_per_s": round(rows / best),
        "us_per_record": round(best / rows * 1e6, 2),
        "cpu_seconds": round(best_cpu, 3),
        "records_per_cpu_s": round(rows / best_cpu),
        "fixed_seconds": round(min(seconds for seconds, _, _ in fixed), 3),
        "fixed_cpu_seconds": round(min(cpu for _, cpu, _ in fixed), 3),
        "peak_rss_mb": round(max(peak for _, _, peak in runs), 1),
        "runs_seconds": [round(seconds, 3) for seconds, _, _ in runs],
        "input_mb": round(source.stat().st_size / 2**20, 1),
    }


def _print_profile(path: Path, title: str, limit: int = 20) -> None:
    import pstats

    print(f"\n== profile: {title} (cProfile; top {limit} by own time) ==")
    stats = pstats.Stats(str(path))
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:limit]  # type: ignore[attr-defined]
    print(f"{'own s':>8} {'own %':>6} {'cum s':>8} {'calls':>10}  function")
    for (file, line, name), (_, calls, own, cumulative, _) in rows:
        where = f"{Path(file).name}:{line}" if line else file
        print(f"{own:8.2f} {own / total:6.1%} {cumulative:8.2f} {calls:10d}  {name} ({where})")


def _table(results: dict[str, Any]) -> str:
    lines = []
    sizes = list(results["rows"])
    if sizes:
        columns = [*STAGES, "other", "total", "own"]
        lines.append("end to end, µs per item, wall | CPU, best of `runs` "
                     "(own = total - generate - setup)")
        lines.append(f"{'rows':<14}" + "".join(f"{int(s):>20,}" for s in sizes))
        for stage in columns:
            lines.append(f"{stage:<14}" + "".join(
                f"{results['rows'][s]['us_per_item'][stage]:>11.1f} |"
                f"{results['rows'][s]['cpu_us_per_item'][stage]:>7.1f}" for s in sizes))
        for label, key in (("peak RSS MB", "peak_rss_mb"), ("RSS pre-run MB", "rss_before_run_mb"),
                           ("runs", "repeat")):
            lines.append(f"{label:<14}" + "".join(f"{results['rows'][s][key]:>20.0f}" for s in sizes))
    if results["rescore"]:
        lines.append("")
        lines.append("grader rescore, one process incl. start, best of `runs`")
        lines.append(f"{'records':>10} {'seconds':>9} {'records/s':>11} {'µs/record':>10} "
                     f"{'CPU s':>8} {'records/CPU s':>14} {'fixed s':>8} {'peak RSS MB':>12} "
                     f"{'input MB':>9} {'runs':>5}")
        for rows, r in results["rescore"].items():
            lines.append(f"{int(rows):>10,} {r['seconds']:>9.2f} {r['records_per_s']:>11,} "
                         f"{r['us_per_record']:>10.2f} {r['cpu_seconds']:>8.2f} "
                         f"{r['records_per_cpu_s']:>14,} {r['fixed_seconds']:>8.2f} "
                         f"{r['peak_rss_mb']:>12.0f} {r['input_mb']:>9.0f} {r['repeat']:>5}")
    lines.append("")
    lines.extend(f"target {name}: {'met' if ok else 'MISSED'} ({detail})"
                 for name, (ok, detail) in results["targets"].items())
    return "\n".join(lines)


def _targets(results: dict[str, Any]) -> dict[str, tuple[bool, str]]:
    targets = {}
    for size, r in results["rows"].items():
        own = r["us_per_item"]["own"]
        targets[f"own work <= {OWN_US_PER_ITEM:.0f} µs/item at {int(size):,} rows"] = (
            own <= OWN_US_PER_ITEM, f"{own:.1f} µs")
    for size, r in results["rescore"].items():
        if int(size) >= 1_000_000:
            targets[f"rescore >= {RESCORE_RECORDS_PER_S:,}/s at {int(size):,}"] = (
                r["records_per_s"] >= RESCORE_RECORDS_PER_S, f"{r['records_per_s']:,}/s")
    sizes = sorted(results["rows"], key=int)
    if len(sizes) > 1 and int(sizes[-1]) >= 1_000_000:
        growth = results["rows"][sizes[-1]]["peak_rss_mb"] - results["rows"][sizes[0]]["peak_rss_mb"]
        targets[f"peak RSS {int(sizes[-1]):,} - {int(sizes[0]):,} rows <= {RSS_GROWTH_MB:.0f} MB"] = (
            growth <= RSS_GROWTH_MB, f"+{growth:.0f} MB")
    return targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",") if x],
                        default=[10_000, 100_000], help="end-to-end sizes [10000,100000]; '' for none")
    parser.add_argument("--big", action="store_true", help="also 1,000,000 rows end to end")
    parser.add_argument("--rescore-rows", type=lambda s: [int(x) for x in s.split(",") if x],
                        default=[100_000, 1_000_000], help="rescore sizes [100000,1000000]; '' for none")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the best is kept [3]")
    parser.add_argument("--repeat-big", type=int, default=1,
                        help="runs per size of 1M rows or more (minutes each) [1]")
    parser.add_argument("--chunk-size", type=int, default=512, help="rows per generate() [512, vLLM's]")
    parser.add_argument("--work", type=Path, default=None,
                        help="keep data and the tiny model here between runs [a temp dir]")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="also cProfile one grade and one rescore run into DIR; print the top")
    parser.add_argument("--profile-rows", type=int, default=100_000,
                        help="rows of the profiled runs [100000]")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--_child-grade", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--_profile", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args._child_grade:
        data, model, output, chunk_size = args._child_grade
        child_grade(data, model, output, int(chunk_size), args._profile)
        return 0

    sizes = sorted(set(args.rows + ([1_000_000] if args.big else [])))
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as scratch:
        work = args.work or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
        model = tiny_model(work)
        results: dict[str, Any] = {"chunk_size": args.chunk_size,
                                   "rows": {}, "rescore": {}}
        partial = work / "bench_pipeline.partial.json"  # what is done so far, should a run stop

        def repeat(rows: int) -> int:
            return args.repeat_big if rows >= 1_000_000 else args.repeat

        for rows in sizes:
            results["rows"][str(rows)] = bench_grade(work, model, rows, repeat(rows), args.chunk_size)
            results["rows"][str(rows)]["repeat"] = repeat(rows)
            partial.write_text(json.dumps(results, indent=2))
        for rows in sorted(args.rescore_rows):
            results["rescore"][str(rows)] = bench_rescore(work, rows, repeat(rows))
            results["rescore"][str(rows)]["repeat"] = repeat(rows)
            partial.write_text(json.dumps(results, indent=2))
        if args.profile:
            profile_grade(work, model, args.profile_rows, args.chunk_size,
                          args.profile / f"grade-{args.profile_rows}.prof")
            profile_rescore(work, args.profile_rows, args.profile / f"rescore-{args.profile_rows}.prof")
        results["targets"] = {k: {"met": ok, "value": v} for k, (ok, v) in _targets(results).items()}
        if args.json:
            print(json.dumps(results, indent=2, ensure_ascii=False))
        else:
            results["targets"] = _targets(results)
            print(_table(results))
            if args.profile:
                for prof in sorted(args.profile.glob("*.prof")):
                    _print_profile(prof, prof.stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
