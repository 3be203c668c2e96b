#!/usr/bin/env python
"""Throughput of grader's transformers backend: batched against one-by-one, guided against not.

Four runs of ``TransformersBackend.generate`` over the same rendered seed prompts, greedy:

  guided,   batch B   grader's backend as it ships (xgrammar logits processor, the verdict schema)
  guided,   batch 1   the same backend one row at a time
  unguided, batch B   the same batches without the logits processor, each batch held to exactly
                      the decode steps its guided run took (``min_new_tokens = max_new_tokens``)
  unguided, batch 1   the same, each row held to the length of its own guided answer

and prints rows/s and output tokens/s for each, the batching speedup (guided B over guided 1)
and the grammar overhead (guided time / unguided time - 1, at batch B and at batch 1). The
runs are interleaved and repeated ``--repeats`` times (default 3); the medians are reported.

Usage::

    python scripts/bench_transformers.py                       # the tiny model, built on the fly
    python scripts/bench_transformers.py --model DIR --rows 64 --batch-size 16 --json bench.json
    python scripts/bench_transformers.py --profile 25          # + cProfile of the guided runs

Imports grader; grader never imports this file.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import datetime
import importlib.metadata
import importlib.util
import io
import json
import platform
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from grader.backends.chat import require_offline  # noqa: E402

require_offline()  # before transformers is imported

import torch  # noqa: E402
import transformers  # noqa: E402

from grader.backends import Completion, requests_of  # noqa: E402
from grader.backends.transformers_backend import TransformersBackend  # noqa: E402
from grader.config import SamplingConfig, TransformersConfig  # noqa: E402
from grader.io.dataset import read_items  # noqa: E402
from grader.judge.judges import SeedJudge  # noqa: E402
from grader.run.rows import prepare_jobs  # noqa: E402

# The targets.
TARGET_SPEEDUP = 3.0
TARGET_OVERHEAD = 0.15


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None,
                        help="a local model directory (default: build the tiny model in a temp dir)")
    parser.add_argument("--data", default=str(ROOT / "examples" / "qa.jsonl"))
    parser.add_argument("--rows", type=int, default=32, help="rows, the data repeated to fill")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prompt", default="seed")
    parser.add_argument("--no-checklist", dest="checklist", action="store_false")
    parser.add_argument("--max-tokens", type=int, default=None, help="default: the schema's bound")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; medians reported")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after timing, cProfile one guided run at each batch size and print "
                        "the top N functions by own and by cumulative time")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return parser.parse_args(argv)


def _tiny_model(directory: Path) -> str:
    """Build the tiny model as the tests do: its script is loaded by path, never imported."""
    spec = importlib.util.spec_from_file_location(
        "make_tiny_model", ROOT / "scripts" / "make_tiny_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.make_tiny_model(directory / "model"))


def _conversations(path: str, n: int, judge) -> list[list[dict[str, str]]]:
    """``n`` rendered conversations from the rows with content, the file's repeated.

    Each row gets a ``[row N]`` tag at the start of its input, so every prompt is distinct:
    the unguided runs look up each prompt's guided length by its text.
    """
    source = [item.fields for item in read_items(path) if not judge.missing(item) and not item.invalid]
    if not source:
        raise SystemExit(f"{path}: no row has the fields the prompt needs")
    rows = []
    for i in range(n):
        row = dict(source[i % len(source)])
        row["id"] = f"bench-{i}"
        row["input"] = f"[row {i}] {row.get('input') or ''}"
        rows.append(row)
    with tempfile.TemporaryDirectory(prefix="bench-transformers-") as tmp:
        data = Path(tmp) / "rows.jsonl"
        data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        jobs = prepare_jobs(str(data), read_items(str(data)), judge)
    return [job.messages for job in jobs]


class UnguidedBackend(TransformersBackend):
    """The loaded guided backend with its logits processor left out, for the equal-work run.

    It shares the guided backend's model, tokenizer and generation config, and inherits
    ``generate``, so the rows are sorted and batched exactly as in the guided run. Each
    batch is then held to ``steps`` decode steps (the guided batch's own count, the longest
    guided answer in it, its stop token included) with ``min_new_tokens = max_new_tokens``:
    the model does the same forward passes, only the grammar is gone. ``min_new_tokens``
    adds transformers' stop-token mask to each step, which makes this run a little slower
    and the measured overhead a little smaller, not larger.
    """

    def __init__(self, guided: Any, batch_size: int, steps: dict[str, int]):
        self.__dict__.update(guided.__dict__)  # no second model load
        self.config = guided.config.model_copy(update={"batch_size": batch_size})
        self.steps = steps  # prompt text -> its guided answer's tokens

    def _generate_batch(self, prompts: list[str], grammars: Any = None,
                        loops: Any = None) -> list[list[Completion]]:
        # the guided backend's signature; no grammar and no stop rule here
        steps = max(self.steps[p] for p in prompts)
        config = copy.deepcopy(self.generation_config)
        config.min_new_tokens = config.max_new_tokens = steps
        encoded = self.tokenizer(
            prompts, add_special_tokens=False, padding=True, return_tensors="pt"
        ).to(self.device)
        with torch.inference_mode():
            output = self.model.generate(**encoded, generation_config=config)
        width = encoded["input_ids"].shape[1]
        assert output.shape[1] - width == steps, (output.shape, width, steps)
        return [
            [Completion(self.tokenizer.decode(tokens, skip_special_tokens=False), "length",
                        int(mask.sum()), len(tokens))]
            for tokens, mask in zip(output[:, width:].tolist(), encoded["attention_mask"])
        ]


def _timed(backend: Any, conversations: list) -> tuple[float, list[Completion]]:
    start = time.perf_counter()
    completions = backend.generate(requests_of(conversations))
    return time.perf_counter() - start, completions


def _batches(lengths: list[int], steps: list[int], size: int) -> tuple[int, int]:
    """Decode steps and token positions (rows x steps) of ``generate`` at ``size``, as it batches."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    total_steps = positions = 0
    for start in range(0, len(order), size):
        batch = order[start : start + size]
        longest = max(steps[i] for i in batch)
        total_steps += longest
        positions += longest * len(batch)
    return total_steps, positions


def _profile(backend: Any, conversations: list, top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    backend.generate(requests_of(conversations))
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def _print_table(runs: list[dict], ratios: dict[str, dict]) -> None:
    header = ["run", "batch", "median s", "runs s", "rows/s", "output tok/s", "output tokens",
              "decode steps"]
    lines = [
        [r["run"], str(r["batch_size"]), f"{r['seconds']:.2f}",
         "/".join(f"{s:.2f}" for s in r["all_seconds"]), f"{r['rows_per_s']:.2f}",
         f"{r['output_tokens_per_s']:.0f}", str(r["output_tokens"]), str(r["decode_steps"])]
        for r in runs
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)))
    print()
    for name, ratio in ratios.items():
        verdict = "met" if ratio["met"] else "MISSED"
        print(f"{name}: {ratio['value']:.3f} (target {ratio['target']}: {verdict})")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    judge = SeedJudge(args.prompt, checklist=args.checklist)
    max_tokens = args.max_tokens or judge.max_tokens
    conversations = _conversations(args.data, args.rows, judge)

    with tempfile.TemporaryDirectory(prefix="bench-transformers-model-") as tmp:
        model = args.model or _tiny_model(Path(tmp))
        sampling = SamplingConfig(max_tokens=args.max_tokens)  # greedy, the default
        config = TransformersConfig(batch_size=args.batch_size, device=args.device,
                                    dtype=args.dtype)
        guided = TransformersBackend(model, schema=judge.schema, sampling=sampling,
                                     max_tokens=max_tokens, config=config)
        # The same loaded model one row at a time: generate() reads config.batch_size.
        single = copy.copy(guided)
        single.config = config.model_copy(update={"batch_size": 1})
        single.chunk_size = 1

        prompts = [guided.formatter.prompt(c) for c in conversations]
        lengths = guided.count_tokens(conversations)
        if len(set(prompts)) != len(prompts):
            raise SystemExit("two rows render to the same prompt; the unguided runs need them distinct")

        # Warm-up, not timed: first calls allocate, and set up the generation machinery.
        guided.generate(requests_of(conversations[: args.batch_size]))
        single.generate(requests_of(conversations[:1]))

        # First timed pass of the guided batched run also fixes each row's answer length
        # (greedy: every repeat gives the same tokens, checked below).
        seconds, completions = _timed(guided, conversations)
        answer_tokens = [c.output_tokens for c in completions]
        finish = {reason: sum(c.finish_reason == reason for c in completions)
                  for reason in ("stop", "length")}
        steps = dict(zip(prompts, answer_tokens))
        plan = {
            "model": args.model or "tiny (scripts/make_tiny_model.py, built in a temp dir)",
            "data": args.data,
            "rows": len(conversations),
            "batch_size": args.batch_size,
            "checklist": args.checklist,
            "max_tokens": max_tokens,
            "prompt_tokens_mean": round(statistics.mean(lengths), 1),
            "prompt_tokens_max": max(lengths),
            "answer_tokens_mean": round(statistics.mean(answer_tokens), 1),
            "answer_tokens_min": min(answer_tokens),
            "answer_tokens_max": max(answer_tokens),
            "finish_reasons": finish,
            "repeats": args.repeats,
            "torch_threads": torch.get_num_threads(),
            "engine": guided.describe(),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__,
                         "xgrammar": importlib.metadata.version("xgrammar")},
            "date": datetime.date.today().isoformat(),
        }
        for key, value in plan.items():
            shown = json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
            print(f"{key}: {shown}")
        print(flush=True)

        unguided = UnguidedBackend(guided, args.batch_size, steps)
        unguided_single = UnguidedBackend(guided, 1, steps)

        runs = {
            "guided": (guided, args.batch_size),
            "guided, one-by-one": (single, 1),
            "unguided, equal steps": (unguided, args.batch_size),
            "unguided, one-by-one, equal steps": (unguided_single, 1),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        tokens: dict[str, int] = {}
        times["guided"].append(seconds)
        tokens["guided"] = sum(answer_tokens)
        for repeat in range(args.repeats):
            # Interleaved, so background load on a shared machine falls on every run alike.
            for name, (backend, _) in runs.items():
                if name == "guided" and repeat == 0:
                    continue  # the first guided pass above is repeat 0
                seconds, completions = _timed(backend, conversations)
                times[name].append(seconds)
                produced = sum(c.output_tokens for c in completions)
                if name.startswith("guided") and [c.output_tokens for c in completions] != answer_tokens:
                    raise SystemExit(f"{name}: greedy answers changed between runs")
                tokens[name] = produced
            print(f"repeat {repeat + 1}/{args.repeats}: "
                  + ", ".join(f"{n} {times[n][-1]:.2f}s" for n in runs), flush=True)
            if args.json:  # a long run killed halfway still leaves its repeats
                args.json.write_text(json.dumps({"plan": plan, "partial_seconds": times},
                                                indent=2, default=str))

        results = []
        for name, (_backend, size) in runs.items():
            median = statistics.median(times[name])
            decode_steps, positions = _batches(lengths, answer_tokens, size)
            results.append({
                "run": name,
                "batch_size": size,
                "seconds": round(median, 3),
                "all_seconds": [round(s, 3) for s in times[name]],
                "rows_per_s": round(len(conversations) / median, 3),
                "output_tokens": tokens[name],
                "output_tokens_per_s": round(tokens[name] / median, 1),
                "decode_steps": decode_steps,
                "token_positions": positions,
            })
        by_name = {r["run"]: r for r in results}

        def ratio(value: float, target: float, higher_is_better: bool) -> dict:
            met = value >= target if higher_is_better else value <= target
            return {"value": round(value, 4), "target": target, "met": met}

        ratios = {
            "speedup, guided batch B over one-by-one (rows/s)": ratio(
                by_name["guided, one-by-one"]["seconds"] / by_name["guided"]["seconds"],
                TARGET_SPEEDUP, True),
            "grammar overhead at batch B (guided/unguided - 1)": ratio(
                by_name["guided"]["seconds"] / by_name["unguided, equal steps"]["seconds"] - 1,
                TARGET_OVERHEAD, False),
            "grammar overhead one-by-one (guided/unguided - 1)": ratio(
                by_name["guided, one-by-one"]["seconds"]
                / by_name["unguided, one-by-one, equal steps"]["seconds"] - 1,
                TARGET_OVERHEAD, False),
        }
        print()
        _print_table(results, ratios)

        profiles = {}
        if args.profile:
            for name in ("guided", "guided, one-by-one"):
                profiles[name] = _profile(runs[name][0], conversations, args.profile)
                print(f"\ncProfile, {name}: top {args.profile} by own time, then by cumulative "
                      f"time\n{profiles[name]}")

    if args.json:
        args.json.write_text(json.dumps(
            {"plan": plan, "results": results, "ratios": ratios, "profiles": profiles},
            indent=2, default=str,
        ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
