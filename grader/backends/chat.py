"""Chat conversations -> the model's own prompt text, through its tokenizer's chat template.

Imports transformers lazily: only ``render --model`` and the backends need a tokenizer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader.backends.request import Message
from grader.errors import GraderError, one_line
from grader.io.dataset import unsendable


class ModelError(GraderError, ValueError):
    """A model grader cannot use as a judge; the message says why in one line."""


class ModelNotFoundError(ModelError):
    """A model that is not on this machine. grader never downloads one."""


def require_offline() -> None:
    """Forbid Hugging Face libraries the network, and quiet them. Must run before they are
    imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    quiet_libraries()


def quiet_libraries() -> None:
    """vLLM's and transformers' logs at errors only, unless the user set their level
    (``VLLM_LOGGING_LEVEL=INFO`` brings vLLM's back): grader's own lines drowned among them.
    Read once, when vllm (and transformers) are first imported: this must run before.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # torch's C++ warnings: on CPU the engine's "NUMA binding: Using MEMBIND policy" line
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    quiet_engine_process()


def quiet_engine_process() -> None:
    """vLLM's lines from before it configures its logging (vllm_compat, "loggers"), where its
    level is ERROR: the Triton line on the CPU build, torch's FutureWarning on ``reduce_op``.
    Runs in grader's process and, by the import of grader.cli, in the engine processes.
    """
    import logging
    import warnings

    if os.environ.get("VLLM_LOGGING_LEVEL", "").upper() != "ERROR":
        return
    logging.getLogger("vllm").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")


# The backends that load weights from a local directory, checked before anything loads. A
# server's model is a name it serves; a plugin backend's is its own to check.
LOCAL_WEIGHTS = frozenset({"auto", "transformers", "vllm"})


def check_model(backend: str, model: str) -> None:
    """``model`` checked as ``backend`` will load it, before anything loads (see
    :data:`LOCAL_WEIGHTS`)."""
    if backend in LOCAL_WEIGHTS:
        check_model_path(model)


def check_model_path(model: str) -> str:
    """A local model directory, or one clear line on what to do instead; cheaply checked
    first that config.json is a JSON object and every safetensors file is whole."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{model}: not a model directory (no config.json)")
        _check_config(model, path / "config.json")
        _check_weights(model, path)
        return str(path)
    raise ModelNotFoundError(
        f"{model}: model not found locally. grader never downloads: pass a model directory, "
        f"or fetch it first on a connected machine (huggingface-cli download {model} "
        f"--local-dir DIR) and copy DIR here"
    )


def _check_config(model: str, config: Path) -> None:
    try:
        data = json.loads(config.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ModelError(f"{model}: config.json cannot be read: {one_line(exc)}") from None
    if not isinstance(data, dict):
        raise ModelError(f"{model}: config.json is not a JSON object")


def _check_weights(model: str, path: Path) -> None:
    """Every ``*.safetensors`` file holds its header and all the tensors it lists; every shard
    an index names is there. A copy cut short fails here, not halfway through a load."""
    for weights in sorted(path.glob("*.safetensors")):
        problem = _safetensors_problem(weights)
        if problem:
            raise ModelError(f"{model}: {weights.name} is {problem}: copy the model again")
    for index in sorted(path.glob("*.safetensors.index.json")):
        try:
            shards = set(json.loads(index.read_bytes())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelError(f"{model}: {index.name} is not a weight index ({exc})") from None
        missing = sorted(str(s) for s in shards if not (path / str(s)).is_file())
        if missing:
            raise ModelError(f"{model}: {index.name} names missing weights: {', '.join(missing[:3])}")


def _safetensors_problem(file: Path) -> str | None:
    """Why ``file`` is no whole safetensors file (8-byte header size, JSON header, data), or None."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as stream:
            head = stream.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if length < 2 or 8 + length > size:
                return f"truncated ({size} bytes: no complete header)"
            header = json.loads(stream.read(length))
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    except (ValueError, RecursionError):
        return "damaged (its header is not JSON)"
    if not isinstance(header, dict):
        return "damaged (its header is not a JSON object)"
    needed = 8 + length + _data_end(header)
    if needed > size:
        return f"truncated ({size} of {needed} bytes)"
    return None


def _data_end(header: dict[str, object]) -> int:
    """Where the last tensor's data ends, from the header's ``data_offsets`` (0: none)."""
    ends = [offsets[1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict)
            and isinstance(offsets := entry.get("data_offsets"), list) and len(offsets) == 2]
    return max((end for end in ends if isinstance(end, int)), default=0)


# Prompts longer than this are counted in pieces of about PIECE_CHARS (ChatFormatter.count_many).
HUGE_PROMPT_CHARS = 2**20
PIECE_CHARS = 2**18


def _pieces(text: str) -> Iterator[str]:
    """``text`` in consecutive pieces of about PIECE_CHARS, each cut just before whitespace
    (where pre-tokenizers split anyway), so no word is cut in two."""
    start = 0
    while start < len(text):
        end = start + PIECE_CHARS
        if end < len(text):
            cut = max(text.rfind(" ", start + 1, end), text.rfind("\n", start + 1, end))
            end = cut if cut > start else end
        yield text[start:end]
        start = end


def load_tokenizer(model: str, *, trust_remote_code: bool = False) -> Any:
    """The model's tokenizer from disk, left-padded for batched generation; its config is read
    too, so an unusable model directory fails here, before any weights, in one line."""
    require_offline()
    from transformers import AutoConfig, AutoTokenizer

    path = check_model_path(model)
    try:
        AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError, ImportError) as exc:
        raise ModelError(f"{model}: config.json cannot be used: {one_line(exc, named=True, limit=300)}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True,
                                                  trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError) as exc:
        # no tokenizer files ("You need to have sentencepiece ..."), a broken tokenizer.json
        raise ModelError(f"{model}: its tokenizer cannot be loaded: {one_line(exc, named=True, limit=300)}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


class ChatFormatter:
    """Applies one tokenizer's chat template; merges the system message where it has no system role."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None,
                 defuse: Sequence[str] = ()):
        """``defuse``: more token texts a row must not spell (a thinking judge's markers: a row
        holding "</think>" would otherwise close the judge's thinking for it)."""
        if not getattr(tokenizer, "chat_template", None):
            raise ModelError(
                "the model's tokenizer has no chat template: use an instruction-tuned model "
                "or add a chat_template to its tokenizer_config.json"
            )
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self.merges_system = not self._accepts_system()
        # Longest first, so "<|im_start|>" is defused before any shorter token inside it.
        added = getattr(tokenizer, "added_tokens_decoder", {}).values()
        self._special = sorted(
            {t for t in [*tokenizer.all_special_tokens, *defuse] if len(t) > 1}
            | {t.content for t in added if t.special and len(t.content) > 1},
            key=len, reverse=True)
        self._check_render()

    def _defuse(self, text: str) -> str:
        # Text that spells a special token would be tokenized as that token: a row could end
        # the user turn and open a system turn of its own. A WORD JOINER after the first
        # character keeps the text readable to the judge but no longer that token.
        for token in self._special:
            if token in text:
                text = text.replace(token, token[0] + "\u2060" + token[1:])
        return text

    def _apply(self, messages: Sequence[Message]) -> str:
        text: str = self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                       add_generation_prompt=True, **self.kwargs)
        return text

    def _accepts_system(self) -> bool:
        probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        try:
            # Templates without a system role raise (Gemma: "System role not supported").
            self._apply(probe)
        except Exception:  # jinja2 TemplateError, or whatever the template raises
            return False
        return True

    def _check_render(self) -> None:
        """Render one plain conversation now, before any model loads: a template that cannot
        give a sendable prompt would make every row an engine error."""
        probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        where = f"{self.tokenizer.name_or_path}: " if getattr(self.tokenizer, "name_or_path", "") else ""
        try:
            text = self._apply(self.messages(probe))
        except Exception as exc:  # jinja2 TemplateError, or whatever the template raises
            raise ModelError(f"{where}the model's chat template fails on a plain conversation: "
                             f"{one_line(exc, named=True)}") from None
        if not isinstance(text, str):
            raise ModelError(f"{where}the model's chat template returned {type(text).__name__}, "
                             "not text")
        problem = unsendable(text)
        if problem:
            raise ModelError(f"{where}the model's chat template prints {problem}, which no "
                             "engine can take: fix its chat_template")

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
        """Prompt tokens of each conversation: the chat template, then one batched tokenizer call.

        A prompt over HUGE_PROMPT_CHARS is counted piece by piece (:func:`_pieces`): encoding
        the whole costs about 400 bytes a token (a 10 MB row took 2.5 GB). The pieces' counts
        add up to the whole's within a token per piece, far past any context grader fills.
        """
        prompts = [self.prompt(messages) for messages in conversations]
        counts: dict[int, int] = {}
        small = [i for i, prompt in enumerate(prompts) if len(prompt) <= HUGE_PROMPT_CHARS]
        if small:
            encoded = self.tokenizer([prompts[i] for i in small], add_special_tokens=False)
            counts = {i: len(ids) for i, ids in zip(small, encoded["input_ids"], strict=True)}
        return [counts[i] if i in counts else sum(map(self._count_text, _pieces(prompt)))
                for i, prompt in enumerate(prompts)]

    def _count_text(self, text: str) -> int:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:  # no Python list of ids: the length is all that is needed
            return len(backend.encode(text, add_special_tokens=False))
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def token_upper_bounds(self, conversations: Sequence[Sequence[Message]]) -> list[int] | None:
        """At least as many as each conversation's prompt tokens, without tokenizing; None where
        this tokenizer gives no such bound.

        The bound is the prompt's UTF-8 byte length plus one. Every token of a byte-level BPE,
        or of a BPE/Unigram/WordPiece model over an unexpanding normalizer, spells at least one
        byte of the text, except a word-boundary marker ("▁") a SentencePiece-style normalizer
        prepends to each piece between special tokens; special tokens are a single token of
        two bytes or more, so those markers never outnumber the bytes saved plus one.
        Tokenizing costs about 1.7 ms a row, 90% of grader's own work.
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


# Reasoning parsers whose think block is one start token and one end token, with their markers
# as vLLM defines them (vllm/reasoning/: deepseek_r1_reasoning_parser.py, ernie45_...,
# the qwen3 and glm45 adapters, minimax_m3_...). The transformers backend knows these; the vLLM
# backend asks vLLM's own registry, which has more.
THINK_PARSERS: dict[str, tuple[str, str]] = {
    "deepseek_r1": ("<think>", "</think>"),
    "ernie45": ("<think>", "</think>"),
    "glm45": ("<think>", "</think>"),
    "minimax_m3": ("<mm:think>", "</mm:think>"),
    "qwen3": ("<think>", "</think>"),
}


@dataclass(frozen=True)
class Thinking:
    """A thinking judge's markers as token ids, its budget, and how an answer splits."""

    parser: str
    start: str
    end: str
    start_id: int
    end_id: int
    budget: int | None = None

    @property
    def markers(self) -> tuple[str, str]:
        """``(start, end)``: texts a row must not spell (ChatFormatter's ``defuse``)."""
        return self.start, self.end

    def open_in(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the answer to this prompt starts in the thinking phase.

        vLLM's rule (BaseThinkingReasoningParser.is_reasoning_end, read by the
        structured-output manager on the prompt): thinking unless the prompt's last marker is
        the end marker. A prompt without markers thinks too: the model may open its own block.
        """
        for token in reversed(prompt_ids):
            if token == self.start_id:
                return True
            if token == self.end_id:
                return False
        return True

    def spent_in(self, prompt_ids: Sequence[int]) -> int:
        """Thinking tokens the prompt already holds: those after its open start marker, which
        vLLM counts against the budget (vllm_compat, "thinking")."""
        for count, token in enumerate(reversed(prompt_ids)):
            if token == self.start_id:
                return count
            if token == self.end_id:
                return 0
        return 0

    def split(self, output_ids: Sequence[int]) -> tuple[list[int], list[int] | None]:
        """``(reasoning ids, answer ids)``: the answer is what follows the first end marker
        (where the grammar began), None when the output never left the thinking phase. A start
        marker the model wrote itself is not part of the reasoning."""
        ids = list(output_ids)
        if self.end_id not in ids:
            return self._strip_start(ids), None
        at = ids.index(self.end_id)
        return self._strip_start(ids[:at]), ids[at + 1 :]

    def _strip_start(self, ids: list[int]) -> list[int]:
        return ids[1:] if ids[:1] == [self.start_id] else ids


def marker_id(tokenizer: Any, marker: str, parser: str) -> int:
    """The one token ``marker`` is in this tokenizer, or a ModelError saying it is not one."""
    ids = tokenizer.encode(marker, add_special_tokens=False)
    if len(ids) != 1:
        raise ModelError(
            f"--reasoning-parser {parser}: {marker!r} is not one token of this model's tokenizer "
            f"({len(ids)} tokens): the parser does not fit this model"
        )
    return int(ids[0])


def make_thinking(parser: str | None, budget: int | None, tokenizer: Any,
                  markers: tuple[str | None, str | None] | None = None) -> Thinking | None:
    """The Thinking of ``parser`` for this tokenizer (None without a parser); ``markers``:
    ``(start, end)`` as the caller's engine defines them, default THINK_PARSERS."""
    if not parser:
        return None
    if markers is None:
        if parser not in THINK_PARSERS:
            raise ModelError(
                f"unknown --reasoning-parser {parser!r}: the transformers backend knows "
                f"{', '.join(sorted(THINK_PARSERS))}"
            )
        markers = THINK_PARSERS[parser]
    start, end = markers
    if not start or not end:
        raise ModelError(
            f"--reasoning-parser {parser}: the parser names no start and end marker of a think "
            "block, which grader needs to keep the reasoning apart from the answer"
        )
    return Thinking(parser, start, end, marker_id(tokenizer, start, parser),
                    marker_id(tokenizer, end, parser), budget)


def merge_system_into_user(messages: list[Message]) -> list[Message]:
    """For chat templates without a system role: system text leads the first user message."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if not system:
        return rest
    for message in rest:
        if message["role"] == "user":
            message["content"] = "\n\n".join([*system, message["content"]])
            return rest
    return [{"role": "user", "content": "\n\n".join(system)}, *rest]
