"""Backend on Hugging Face transformers: batched, left-padded ``generate`` under xgrammar.

The grammar is compiled once per run from the same schema and with the same compact
separators as the vLLM backend (vLLM's ``disable_any_whitespace``), so both force one grammar.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grader.backends import Completion, EngineUnavailable, Message
from grader.backends.chat import ChatFormatter, check_model_path, load_tokenizer, require_offline
from grader.config import SamplingConfig, TransformersConfig

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


class TransformersBackend:
    """Greedy (or seeded sampling) generation with transformers, one grammar for every row."""

    name = "transformers"

    def __init__(
        self,
        model: str,
        *,
        schema: dict[str, Any],
        sampling: SamplingConfig,
        max_tokens: int,
        config: TransformersConfig | None = None,
    ):
        self.config = config or TransformersConfig()
        self.sampling = sampling
        self.model_path = check_model_path(model)
        self.device = _pick_device(self.config.device)
        self.tokenizer = load_tokenizer(
            self.model_path, trust_remote_code=self.config.trust_remote_code
        )
        self.formatter = ChatFormatter(self.tokenizer, self.config.chat_template_kwargs)
        dtype: Any = _DTYPES.get(self.config.dtype, "auto")
        if dtype == "auto" and self.device == "cpu":
            dtype = torch.float32  # bf16 matmuls are slow on most CPUs
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            self.model_path,
            local_files_only=True,
            dtype=dtype,
            trust_remote_code=self.config.trust_remote_code,
        ).to(self.device)
        self.model.eval()
        self.stop_ids = _stop_token_ids(self.tokenizer, self.model)

        # The logits may be wider than the tokenizer (padded embeddings): size the mask to them.
        tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            self.tokenizer,
            vocab_size=self.model.config.get_text_config().vocab_size,
            stop_token_ids=self.stop_ids,
        )
        self.grammar = xgr.GrammarCompiler(tokenizer_info).compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(",", ":")
        )
        self.generation_config = transformers.GenerationConfig(
            **sampling.to_transformers_kwargs(max_tokens),
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.stop_ids,
            cache_implementation="static" if self.config.kv_cache == "static" else None,
            # transformers 5.19 compiles the forward pass on CUDA once a static cache is in use,
            # and recompiles for every new shape: every batch here has its own prompt width.
            disable_compile=True,
        )
        self.chunk_size = self.config.batch_size
        text_config = self.model.config.get_text_config()
        self.context_length = int(getattr(text_config, "max_position_embeddings", 0)) or None

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "model": self.model_path,
            "device": self.device,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "batch_size": self.config.batch_size,
            "merges_system_role": self.formatter.merges_system,
            "context_length": self.context_length,
            "generation": self.generation_config.to_diff_dict(),
        }

    def count_tokens(self, conversations: Sequence[list[Message]]) -> list[int]:
        return self.formatter.count_many(conversations)

    def token_upper_bounds(self, conversations: Sequence[list[Message]]) -> list[int] | None:
        return self.formatter.token_upper_bounds(conversations)

    def generate(self, conversations: Sequence[list[Message]]) -> list[Completion]:
        """``sampling.n`` completions per conversation, flat, row by row, in input order."""
        prompts = [self.formatter.prompt(messages) for messages in conversations]
        # Longest first (by characters: each batch is tokenized anyway), so an out-of-memory
        # error shows in the first batch, not the last, and a batch pads little.
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        results: list[list[Completion]] = [[] for _ in prompts]
        size = self.config.batch_size
        for start in range(0, len(order), size):
            batch = order[start : start + size]
            for index, completions in zip(batch, self._generate_batch([prompts[i] for i in batch])):
                results[index] = completions
        return [completion for completions in results for completion in completions]

    @torch.inference_mode()
    def _generate_batch(self, prompts: list[str]) -> list[list[Completion]]:
        encoded = self.tokenizer(
            prompts, add_special_tokens=False, padding=True, return_tensors="pt"
        ).to(self.device)
        if not self.sampling.greedy:
            torch.manual_seed(self.sampling.seed)
        # One logits processor per generate() call: it keeps per-row matcher state (xgrammar docs).
        processor = xgr.contrib.hf.LogitsProcessor(self.grammar)
        output = self.model.generate(
            **encoded,
            generation_config=self.generation_config,
            logits_processor=transformers.LogitsProcessorList([processor]),
        )
        prompt_width = encoded["input_ids"].shape[1]
        samples = self.sampling.n  # generate() returns each prompt's samples consecutively
        completions: list[list[Completion]] = [[] for _ in prompts]
        for row, tokens in enumerate(output[:, prompt_width:].tolist()):
            stop_at = next((i for i, t in enumerate(tokens) if t in self.stop_ids), None)
            kept = tokens if stop_at is None else tokens[:stop_at]
            completions[row // samples].append(
                Completion(
                    # Keep special tokens: xgrammar 0.2.8 treats an added token such as
                    # <|im_start|> as its literal text, so the grammar may have approved it
                    # inside a string; dropping it here would parse other text than was checked.
                    text=self.tokenizer.decode(kept, skip_special_tokens=False),
                    finish_reason="length" if stop_at is None else "stop",
                    prompt_tokens=int(encoded["attention_mask"][row // samples].sum()),
                    output_tokens=len(kept) + (stop_at is not None),
                )
            )
        return completions
