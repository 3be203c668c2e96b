"""Backend on Hugging Face transformers: batched, left-padded ``generate`` under xgrammar.

The grammar is compiled once per run from the same schema and with the same compact
separators as the vLLM backend (vLLM's ``disable_any_whitespace``), so both force one grammar.

A thinking judge (``reasoning_parser``) generates in two phases, as vLLM does in one: free
generation until the end-of-thinking marker, the budget or max_tokens; the marker appended where
the budget ended the thinking; then the answer under the grammar.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
from collections.abc import Sequence
from typing import Any, TypedDict, cast

from grader.backends import (
    REPETITION,
    Backend,
    Completion,
    EngineUnavailable,
    GenerateRequest,
    JSONSchema,
    LoopStop,
    Message,
    SchemaRejected,
    loop_end,
    merged_top,
    rows_apart,
)
from grader.backends.chat import (
    ChatFormatter,
    ModelError,
    check_model_path,
    load_tokenizer,
    make_thinking,
    require_offline,
)
from grader.config import BackendSettings, TransformersConfig
from grader.errors import one_line

require_offline()  # before transformers and huggingface_hub are imported

import torch  # noqa: E402
import transformers  # noqa: E402
import xgrammar as xgr  # noqa: E402
import xgrammar.contrib.hf  # noqa: E402,F401  (not imported by `import xgrammar` in 0.2.8)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise EngineUnavailable(f"--device {device}: no CUDA device is visible to torch")
    return device


def _stop_token_ids(tokenizer: Any, model: Any) -> list[int]:
    ids = {tokenizer.eos_token_id}
    configured = model.generation_config.eos_token_id
    ids.update(configured if isinstance(configured, list) else [configured])
    return sorted(i for i in ids if i is not None)


class TopLogprobs(transformers.LogitsProcessor):
    """Records, per step and row, the top-k of log_softmax of the scores it is handed.

    Placed after xgrammar's processor: post-mask, pre-temperature, as vLLM's default
    logprobs_mode. transformers 5.x runs the caller's processors after its own and the
    sampling warpers after both (generation/utils.py, _get_logits_processor).
    """

    def __init__(self, k: int):
        self.k = k
        self.values: list[Any] = []  # per step: (rows, k) float32 tensors, on the CPU
        self.ids: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        top = torch.log_softmax(scores.float(), dim=-1).topk(self.k, dim=-1)
        self.values.append(top.values.cpu())
        self.ids.append(top.indices.cpu())
        return scores

    def row(self, row: int, steps: int, texts: Any) -> tuple[dict[str, float], ...]:
        """Row ``row``'s first ``steps`` steps: token text -> log-probability (masked ones left
        out)."""
        result = []
        for values, ids in zip(self.values[:steps], self.ids[:steps], strict=True):
            result.append(merged_top(
                (texts(token_id), value)
                for value, token_id in zip(values[row].tolist(), ids[row].tolist(), strict=True)
                if value != -math.inf))
        return tuple(result)


class TransformersBackend(Backend):
    """Greedy (or seeded sampling) generation with transformers, one grammar for every row."""

    name = "transformers"
    settings = TransformersConfig
    supports_stop = True  # found after generating (loop_end), where vLLM's engine would stop
    supports_logprobs = True
    supports_thinking = True
    config: TransformersConfig
    formatter: ChatFormatter  # always: the prompts are rendered here

    @classmethod
    def resources(cls, settings: BackendSettings, gpus: float = 0) -> dict[str, float]:
        """One GPU for a cuda device, or for auto where there are GPUs to take."""
        assert isinstance(settings, TransformersConfig)
        if settings.device == "cpu" or (settings.device == "auto" and not gpus):
            return {}
        return {"GPU": 1.0}

    @classmethod
    def default_chunk_size(cls, settings: BackendSettings) -> int:
        assert isinstance(settings, TransformersConfig)
        return settings.batch_size

    def _load(self, model: str) -> None:
        self.model_path = check_model_path(model)
        self.device = _pick_device(self.config.device)
        self.tokenizer = load_tokenizer(self.model_path,
                                        trust_remote_code=self.config.trust_remote_code)
        self.thinking = make_thinking(self.config.reasoning_parser, self.config.thinking_budget,
                                      self.tokenizer)
        self.formatter = ChatFormatter(self.tokenizer, self.config.chat_template_kwargs,
                                       defuse=self.thinking.markers if self.thinking else ())
        dtype: Any = _DTYPES.get(self.config.dtype, "auto")
        if dtype == "auto" and self.device == "cpu":
            dtype = torch.float32  # bf16 matmuls are slow on most CPUs
        try:
            # Any: mypy reads transformers 5.x's .to() as taking the model class, not a device
            loaded: Any = transformers.AutoModelForCausalLM.from_pretrained(
                self.model_path, local_files_only=True, dtype=dtype,
                trust_remote_code=self.config.trust_remote_code)
            self.model = loaded.to(self.device)
        except torch.OutOfMemoryError:
            raise
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            # no weights file, weights that do not fit the config, a damaged .bin
            raise ModelError(f"{model}: its weights cannot be loaded: {one_line(exc, named=True, limit=300)}") from None
        self.model.eval()
        self.stop_ids = _stop_token_ids(self.tokenizer, self.model)

        # The logits may be wider than the tokenizer (padded embeddings): size the mask to them.
        tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            self.tokenizer, vocab_size=self.model.config.get_text_config().vocab_size,
            stop_token_ids=self.stop_ids)
        self.compiler = xgr.GrammarCompiler(tokenizer_info)
        self.grammar = self._compile(self.schema)
        self._grammars: dict[str, xgr.CompiledGrammar] = {}  # per-row schemas, compiled once each
        # cast: transformers types GenerationConfig's __init__ as **kwargs, untyped
        self.generation_config = cast(Any, transformers).GenerationConfig(
            # max_tokens holds thinking and answer, as vLLM's (Backend.__init__)
            **self.sampling.to_transformers_kwargs(self.max_tokens),
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.stop_ids,
            cache_implementation="static" if self.config.kv_cache == "static" else None,
            # transformers 5.19 compiles the forward pass on CUDA once a static cache is in use,
            # and recompiles for every new shape: every batch here has its own prompt width.
            disable_compile=True,
        )
        self.chunk_size = self.default_chunk_size(self.config)
        # --confidence: each token id's own text, as vLLM decodes it for its logprobs
        self._token_text = functools.lru_cache(maxsize=65536)(
            lambda token_id: self.tokenizer.decode([token_id], skip_special_tokens=False)
        )
        text_config = self.model.config.get_text_config()
        self.context_length = int(getattr(text_config, "max_position_embeddings", 0)) or None

    def describe(self) -> dict[str, object]:
        return {
            "backend": self.name,
            "model": self.model_path,
            "device": self.device,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "batch_size": self.config.batch_size,
            "merges_system_role": self.formatter.merges_system,
            "context_length": self.context_length,
            "generation": self.generation_config.to_diff_dict(),
            **self.describe_thinking(),
        }

    def _compile(self, schema: JSONSchema) -> xgr.CompiledGrammar:
        try:
            return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                     separators=(",", ":"))
        except RuntimeError as exc:  # xgrammar's C++ checks surface as RuntimeError
            raise SchemaRejected(f"xgrammar rejects the JSON schema: {one_line(exc)}") from exc

    def _grammar_for(self, schema: JSONSchema | None) -> xgr.CompiledGrammar:
        """The compiled grammar of a row's own schema (None: the backend's), once per schema."""
        if schema is None:
            return self.grammar
        text = json.dumps(schema)
        if text not in self._grammars:
            self._grammars[text] = self._compile(schema)
        return self._grammars[text]

    def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """``sampling.n`` completions per request, flat, request by request, in input order."""
        conversations = [r.messages for r in requests]
        if all(r.schema is None and r.stop is None for r in requests):
            return self._generate_rows(conversations, None, [None] * len(conversations))

        def run(rows: list[int], grammars: list[Any]) -> list[Completion]:
            return self._generate_rows([conversations[i] for i in rows], grammars,
                                       [requests[i].stop for i in rows])

        # a row whose schema does not compile fails alone, not its batch
        return rows_apart(len(requests), lambda i: self._grammar_for(requests[i].schema), run,
                          self.samples)

    def _generate_rows(self, conversations: Sequence[list[Message]], grammars: list[Any] | None,
                       loops: Sequence[LoopStop | None]) -> list[Completion]:
        prompts = [self.formatter.prompt(messages) for messages in conversations]
        # Longest first: an out-of-memory error shows in the first batch, and a batch pads little
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        results: list[list[Completion]] = [[] for _ in prompts]
        size = self.config.batch_size
        for start in range(0, len(order), size):
            batch = order[start : start + size]
            batch_grammars = [grammars[i] for i in batch] if grammars else None
            for index, completions in zip(
                batch, self._generate_batch([prompts[i] for i in batch], batch_grammars,
                                            [loops[i] for i in batch]),
                strict=True,
            ):
                results[index] = completions
        return [completion for completions in results for completion in completions]

    @torch.inference_mode()
    def _generate_batch(self, prompts: list[str], grammars: list[Any] | None = None,
                        loops: Sequence[LoopStop | None] | None = None,
                        ) -> list[list[Completion]]:
        encoded = self.tokenizer(prompts, add_special_tokens=False, padding=True,
                                 return_tensors="pt").to(self.device)
        # xgrammar's processor takes one grammar, or one per generated row (each prompt's
        # samples are consecutive rows)
        grammar = (self.grammar if grammars is None
                   else [g for g in grammars for _ in range(self.sampling.n)])
        if self.thinking:
            return self._generate_thinking(encoded, grammar)
        self._seed()
        recorder = self._recorder()
        output = self.model.generate(**encoded, generation_config=self.generation_config,
                                     logits_processor=self._processors(grammar, recorder))
        prompt_width = encoded["input_ids"].shape[1]
        samples = self.sampling.n  # generate() returns each prompt's samples consecutively
        completions: list[list[Completion]] = [[] for _ in prompts]
        for row, tokens in enumerate(output[:, prompt_width:].tolist()):
            prompt_tokens = int(encoded["attention_mask"][row // samples].sum())
            loop = loops[row // samples] if loops else None
            completions[row // samples].append(
                self._completion(tokens, loop, prompt_tokens, recorder, row))
        return completions

    def _completion(self, tokens: list[int], loop: LoopStop | None, prompt_tokens: int,
                    recorder: TopLogprobs | None, row: int) -> Completion:
        """One generated row's completion: up to its stop token, or its stop rule's end."""
        stop_at = _first_stop(tokens, self.stop_ids)
        kept = tokens if stop_at is None else tokens[:stop_at]
        reason, spent = ("length", len(kept)) if stop_at is None else ("stop", len(kept) + 1)
        # A row with a stop rule ends where vLLM's engine would have ended it, found after
        # generating: xgrammar 0.2.8's HF processor cannot stop one row while its batch goes on.
        looped = loop_end(kept, loop) if loop is not None else None
        if looped is not None:
            kept, reason, spent = kept[:looped], REPETITION, looped
        # Keep special tokens: xgrammar 0.2.8 treats an added token such as <|im_start|> as
        # its literal text, so the grammar may have approved it inside a string; dropping it
        # here would parse other text than was checked.
        return Completion(self.tokenizer.decode(kept, skip_special_tokens=False), reason,
                          prompt_tokens, spent, **self._logprobs(recorder, row, kept))

    def _seed(self) -> None:
        """Each generate() call sampling from the run's seed (greedy needs none)."""
        if not self.sampling.greedy:
            torch.manual_seed(self.sampling.seed)

    def _processors(self, grammar: Any, recorder: TopLogprobs | None) -> Any:
        """xgrammar's processor, new per generate() call (it keeps per-row matcher state,
        xgrammar docs), then the log-probabilities' recorder after the grammar's mask."""
        return transformers.LogitsProcessorList(
            [xgr.contrib.hf.LogitsProcessor(grammar), *([recorder] if recorder else [])])

    def _recorder(self) -> TopLogprobs | None:
        return TopLogprobs(self.sampling.logprobs) if self.sampling.logprobs else None

    def _logprobs(self, recorder: TopLogprobs | None, row: int, kept: list[int]) -> _Logprobs:
        """The Completion's ``tokens`` and ``top_logprobs`` for ``kept``, when recorded."""
        if recorder is None:
            return {}
        return {"tokens": tuple(self._token_text(t) for t in kept),
                "top_logprobs": recorder.row(row, len(kept), self._token_text)}

    def _generate_thinking(self, encoded: Any, grammar: Any) -> list[list[Completion]]:
        """Two phases per batch: free thinking, then the answer under the grammar.

        Phase 1 (no grammar) stops a row at the end marker, a stop token, the budget or
        max_tokens; where the budget stopped it the end marker is appended, as vLLM forces it
        (vllm_compat, "thinking"). Phase 2 continues every row that left its thinking, with a
        fresh grammar matcher and what is left of max_tokens.
        """
        rows = self._thinking_rows(encoded)
        self._think(rows)
        self._answer_after_thinking(rows, grammar)
        samples = self.sampling.n
        return [[self._thought_completion(row) for row in rows[i : i + samples]]
                for i in range(0, len(rows), samples)]

    def _thinking_rows(self, encoded: Any) -> list[_ThinkingRow]:
        """One row per prompt and sample (generate()'s order), each with its room to think."""
        thinking = self.thinking
        assert thinking is not None
        limit = self.generation_config.max_new_tokens
        rows = []
        padded = encoded["input_ids"].tolist()
        for ids, mask in zip(padded, encoded["attention_mask"].tolist(), strict=True):
            prompt = [t for t, m in zip(ids, mask, strict=True) if m]
            if not thinking.open_in(prompt):
                room, ended = 0, "closed"
            elif thinking.budget is None:
                room, ended = limit, "length"
            else:
                # the budget less what the prompt already thought, as vLLM counts
                # (Thinking.spent_in)
                room = min(max(thinking.budget - thinking.spent_in(prompt), 0), limit)
                ended = "forced" if room < limit else "length"
            rows += [_ThinkingRow(prompt, room, ended) for _ in range(self.sampling.n)]
        return rows

    def _think(self, rows: list[_ThinkingRow]) -> None:
        """Phase 1: each prompt with room to think generates freely, its samples at once."""
        thinking = self.thinking
        assert thinking is not None
        samples = self.sampling.n
        firsts = [i for i in range(0, len(rows), samples) if rows[i].room > 0]
        if not firsts:
            return
        free = copy.deepcopy(self.generation_config)
        free.max_new_tokens = max(rows[i].room for i in firsts)
        free.eos_token_id = [*self.stop_ids, thinking.end_id]
        batch = _left_padded([rows[i].prompt for i in firsts], self.tokenizer.pad_token_id,
                             self.device)
        self._seed()
        output = self.model.generate(**batch, generation_config=free)
        width = batch["input_ids"].shape[1]
        thinkers = [rows[i + k] for i in firsts for k in range(samples)]  # generate()'s order
        for row, tokens in zip(thinkers, output[:, width:].tolist(), strict=True):
            row.think(tokens[: row.room], self.stop_ids, thinking.end_id)  # the batch ran longer

    def _answer_after_thinking(self, rows: list[_ThinkingRow], grammar: Any) -> None:
        """Phase 2: every row that left its thinking answers under the grammar."""
        thinking = self.thinking
        assert thinking is not None
        answering = [r for r, row in enumerate(rows) if row.answers]
        if not answering:
            return
        limit = self.generation_config.max_new_tokens
        contexts = [rows[r].context(thinking.end_id) for r in answering]
        left = [limit - (len(context) - len(rows[r].prompt))
                for r, context in zip(answering, contexts, strict=True)]
        constrained = copy.deepcopy(self.generation_config)
        constrained.num_return_sequences = 1  # the rows are the samples already
        constrained.max_new_tokens = max(1, max(left))
        batch = _left_padded(contexts, self.tokenizer.pad_token_id, self.device)
        self._seed()
        recorder = self._recorder()
        grammars = grammar if not isinstance(grammar, list) else [grammar[r] for r in answering]
        output = self.model.generate(**batch, generation_config=constrained,
                                     logits_processor=self._processors(grammars, recorder))
        width = batch["input_ids"].shape[1]
        for j, (r, tokens) in enumerate(zip(answering, output[:, width:].tolist(), strict=True)):
            # cut at the row's own limit: the batch ran on for the longest
            tokens = tokens[: max(left[j], 0)]
            stop_at = _first_stop(tokens, self.stop_ids)
            row = rows[r]
            row.answer = tokens if stop_at is None else tokens[:stop_at]
            row.stopped = stop_at is not None
            row.logprobs = self._logprobs(recorder, j, row.answer)

    def _thought_completion(self, row: _ThinkingRow) -> Completion:
        assert self.thinking is not None
        reasoning = self.tokenizer.decode(self.thinking.split(row.thought)[0],
                                          skip_special_tokens=False)
        if row.answer is not None:
            marker = 0 if row.ended == "closed" else 1
            return Completion(
                self.tokenizer.decode(row.answer, skip_special_tokens=False),
                "stop" if row.stopped else "length", len(row.prompt),
                len(row.thought) + marker + len(row.answer) + row.stopped,
                reasoning=reasoning, reasoning_tokens=len(row.thought), **row.logprobs)
        # still thinking at max_tokens ("length"), or a stop token while thinking
        stopped = row.ended == "stopped"
        return Completion("", "stop" if stopped else "length", len(row.prompt),
                          len(row.thought) + stopped, reasoning=reasoning,
                          reasoning_tokens=len(row.thought))


class _Logprobs(TypedDict, total=False):
    """A Completion's ``tokens`` and ``top_logprobs`` (--confidence), or neither."""

    tokens: tuple[str, ...]
    top_logprobs: tuple[dict[str, float], ...]


@dataclasses.dataclass
class _ThinkingRow:
    """One prompt's sample through a thinking judge's two phases."""

    prompt: list[int]  # its tokens, unpadded
    room: int  # thinking tokens phase 1 may generate
    # How the thinking ended: "closed" (the prompt closed it; no phase 1), "length" (at
    # max_tokens), "forced" (at the budget: the marker is appended), "marker" (the model
    # wrote it) or "stopped" (a stop token: no answer).
    ended: str
    thought: list[int] = dataclasses.field(default_factory=list)
    answer: list[int] | None = None  # phase 2's tokens, up to its stop token
    stopped: bool = False  # phase 2 ended at a stop token
    logprobs: _Logprobs = dataclasses.field(default_factory=_Logprobs)  # --confidence

    @property
    def answers(self) -> bool:
        """Whether the row left its thinking (by the marker, the budget or the prompt)."""
        return self.ended in ("closed", "marker", "forced")

    def think(self, tokens: list[int], stop_ids: list[int], end_id: int) -> None:
        """Phase 1's tokens: the thought, up to the end marker or a stop token if one came."""
        stop_at = _first_stop(tokens, [*stop_ids, end_id])
        self.thought = tokens if stop_at is None else tokens[:stop_at]
        if stop_at is not None:
            self.ended = "marker" if tokens[stop_at] == end_id else "stopped"

    def context(self, end_id: int) -> list[int]:
        """What phase 2 continues: the prompt, and the thinking closed by its marker."""
        if self.ended == "closed":
            return self.prompt
        return self.prompt + self.thought + [end_id]


def _first_stop(tokens: list[int], stop_ids: list[int]) -> int | None:
    """Where the first of ``stop_ids`` is in ``tokens``, or None."""
    return next((i for i, t in enumerate(tokens) if t in stop_ids), None)


def _left_padded(rows: list[list[int]], pad_id: int, device: str) -> dict[str, torch.Tensor]:
    """Token rows as one left-padded batch (what the tokenizer gives for text)."""
    width = max(len(row) for row in rows)
    ids = [[pad_id] * (width - len(row)) + row for row in rows]
    mask = [[0] * (width - len(row)) + [1] * len(row) for row in rows]
    return {"input_ids": torch.tensor(ids, device=device),
            "attention_mask": torch.tensor(mask, device=device)}
