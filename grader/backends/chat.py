"""Chat conversations -> the model's own prompt text, through its tokenizer's chat template.

Imports transformers lazily: only ``render --model`` and the backends need a tokenizer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grader.judge.prompts import Message, merge_system_into_user


class ModelError(ValueError):
    """A model grader cannot use as a judge; the message says why in one line."""


class ModelNotFoundError(ModelError):
    """A model that is not on this machine. grader never downloads one."""


def require_offline() -> None:
    """Forbid Hugging Face libraries the network. Must run before they are imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def check_model_path(model: str) -> str:
    """A local model directory, or one clear line on what to do instead."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{model}: not a model directory (no config.json)")
        return str(path)
    raise ModelNotFoundError(
        f"{model}: model not found locally. grader never downloads: pass a model directory, "
        f"or fetch it first on a connected machine (huggingface-cli download {model} "
        f"--local-dir DIR) and copy DIR here"
    )


def load_tokenizer(model: str, *, trust_remote_code: bool = False) -> Any:
    """The model's tokenizer from disk, left-padded for batched generation."""
    require_offline()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        check_model_path(model), local_files_only=True, trust_remote_code=trust_remote_code
    )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


class ChatFormatter:
    """Applies one tokenizer's chat template; merges the system message where it has no system role."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ModelError(
                "the model's tokenizer has no chat template: use an instruction-tuned model "
                "or add a chat_template to its tokenizer_config.json"
            )
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self.merges_system = not self._accepts_system()
        # Longest first, so "<|im_start|>" is defused before any shorter token inside it.
        self._special = sorted(
            {t for t in tokenizer.all_special_tokens if len(t) > 1}
            | {
                t.content
                for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
                if t.special and len(t.content) > 1
            },
            key=len,
            reverse=True,
        )

    def _defuse(self, text: str) -> str:
        # Text that spells a special token would be tokenized as that token: a row could end
        # the user turn and open a system turn of its own. A WORD JOINER after the first
        # character keeps the text readable to the judge but no longer that token.
        for token in self._special:
            if token in text:
                text = text.replace(token, token[0] + "\u2060" + token[1:])
        return text

    def _apply(self, messages: Sequence[Message]) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True, **self.kwargs
        )

    def _accepts_system(self) -> bool:
        probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        try:
            # Templates without a system role raise (Gemma: "System role not supported").
            self._apply(probe)
        except Exception:  # jinja2 TemplateError, or whatever the template raises
            return False
        return True

    def messages(self, messages: Sequence[Message]) -> list[Message]:
        """The conversation as this model will see it: special-token look-alikes defused, the
        system message merged into the user turn where the template has no system role."""
        safe = [{**m, "content": self._defuse(m["content"])} for m in messages]
        return merge_system_into_user(safe) if self.merges_system else safe

    def prompt(self, messages: Sequence[Message]) -> str:
        return self._apply(self.messages(messages))

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return self.count_many([messages])[0]

    def count_many(self, conversations: Sequence[Sequence[Message]]) -> list[int]:
        """Prompt tokens of each conversation: the chat template, then one batched tokenizer call."""
        prompts = [self.prompt(messages) for messages in conversations]
        return [len(ids) for ids in self.tokenizer(prompts, add_special_tokens=False)["input_ids"]]

    def token_upper_bounds(self, conversations: Sequence[Sequence[Message]]) -> list[int] | None:
        """At least as many as each conversation's prompt tokens, without tokenizing; None where
        this tokenizer gives no such bound.

        The bound is the prompt's UTF-8 byte length plus one. Every token of a byte-level BPE,
        or of a BPE/Unigram/WordPiece model over an unexpanding normalizer, spells at least one
        byte of the text, except a word-boundary marker ("▁") a SentencePiece-style normalizer
        prepends to each piece between special tokens; special tokens are a single token of
        two bytes or more, so those markers never outnumber the bytes saved plus one. Tokenizing
        costs milliseconds per row (about 1.7 ms for 2,000 tokens on one core, 90% of grader's
        own work); the pipeline counts exactly only the rows whose bound is near the context.
        """
        if not self.bounded_by_bytes:
            return None
        return [len(self.prompt(messages).encode("utf-8")) + 1 for messages in conversations]

    @property
    def bounded_by_bytes(self) -> bool:
        if not hasattr(self, "_bounded"):
            self._bounded = _bounded_by_bytes(self.tokenizer)
        return self._bounded


# Normalizers that can expand text: NFKC/NFKD ("ﷺ" is 3 bytes and 18 characters) and
# SentencePiece's precompiled charsmap (an NFKC-like table). A tokenizer with one is counted
# exactly, always.
_EXPANDING = {"NFKC", "NFKD", "Precompiled"}
_MODELS = {"BPE", "Unigram", "WordPiece"}


def _bounded_by_bytes(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (Python) tokenizer: no structure to inspect
        return False
    try:
        spec = json.loads(backend.to_str())
    except Exception:  # a tokenizer that cannot serialise itself: count exactly
        return False

    def types(node: Any) -> set[str]:
        if isinstance(node, dict):
            return {node.get("type", "")} | {t for value in node.values() for t in types(value)}
        if isinstance(node, list):
            return {t for value in node for t in types(value)}
        return set()

    model = (spec.get("model") or {}).get("type")
    return model in _MODELS and not types(spec.get("normalizer")) & _EXPANDING
