"""What produced a score: model identity, package versions, host. Enough to say later exactly
which model, prompt, schema and settings a results file came from. Reads files only: no torch.
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
from contextlib import suppress
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                    "special_tokens_map.json", "vocab.json", "merges.txt")
_CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
PACKAGES = ("grader", "torch", "transformers", "xgrammar", "vllm", "tokenizers", "pydantic", "jinja2")


def sha256_json(value: Any) -> str:
    """A stable hash of a JSON-able value."""
    if type(value) is list and len(value) == 3 and type(value[1]) is list:
        return _sha256_row_key(value)
    return hashlib.sha256(_json_bytes(value)).hexdigest()


def _json_bytes(value: Any) -> bytes:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    # surrogatepass: the same bytes as plain UTF-8 for any real text; a lone surrogate (JSON
    # "\\ud800") hashes instead of crashing the run, whatever the row's status will be
    return text.encode("utf-8", "surrogatepass")


# position in the conversation -> (message, its JSON bytes) of the last message hashed there
_last_message: dict[int, tuple[dict[str, Any], bytes]] = {}


def _sha256_row_key(value: list[Any]) -> str:
    """sha256_json of a row's resume key ``[id, messages, run_key]``, hashed piece by piece.

    The bytes hashed are exactly ``_json_bytes(value)``: json writes a list as ``[`` + its
    items' JSON joined by ``", "`` + ``]``, and UTF-8 encodes code point by code point. A
    message equal to the one last seen at its position (the seed's system message, the same
    4 kB on every row) reuses that message's bytes instead of encoding it again.
    """
    item_id, messages, run_key = value
    digest = hashlib.sha256(b"[" + _json_bytes(item_id) + b", [")
    for position, message in enumerate(messages):
        if position:
            digest.update(b", ")
        last = _last_message.get(position)
        if last is not None and type(message) is dict and last[0] == message:
            digest.update(last[1])
            continue
        encoded = _json_bytes(message)
        if type(message) is dict and all(type(v) is str for v in message.values()):
            _last_message[position] = (dict(message), encoded)  # a copy: the row may change
        digest.update(encoded)
    digest.update(b"], " + _json_bytes(run_key) + b"]")
    return digest.hexdigest()


def _sha256_files(paths: list[Path]) -> str | None:
    if not paths:
        return None
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def model_identity(model: str) -> dict[str, Any]:
    """Path, config hash, each weight file's size and mtime, tokenizer and chat-template hashes.

    Weights are identified by size and mtime rather than hashed: hashing 100 GB of safetensors
    at every start would cost minutes.
    """
    root = Path(model).expanduser().resolve()
    config = root / "config.json"
    chat_templates = [root / n for n in _CHAT_TEMPLATE_FILES if (root / n).is_file()]
    tokenizer_config = root / "tokenizer_config.json"
    template_in_config = None
    if tokenizer_config.is_file():
        # unreadable here, its bytes are still in tokenizer_sha256; the tokenizer load will say
        with suppress(ValueError, AttributeError):
            template_in_config = json.loads(tokenizer_config.read_text("utf-8")).get("chat_template")
    template_parts = [p.read_text("utf-8") for p in chat_templates]
    if template_in_config:
        template_parts.append(json.dumps(template_in_config))
    return {
        "path": str(root),
        # the file's own sha256: `sha256sum config.json` checks it
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest()
        if config.is_file() else None,
        "weights": [{"file": p.name, "bytes": p.stat().st_size, "mtime": int(p.stat().st_mtime)}
                    for p in sorted(root.iterdir()) if p.suffix in _WEIGHT_SUFFIXES],
        "tokenizer_sha256": _sha256_files([root / n for n in _TOKENIZER_FILES if (root / n).is_file()]),
        "chat_template_sha256": (
            hashlib.sha256("\0".join(template_parts).encode()).hexdigest() if template_parts else None
        ),
    }


def model_fingerprint(identity: dict[str, Any]) -> dict[str, Any]:
    """:func:`model_identity` (or a manifest's ``model``) without its name, path and weight
    mtimes: what a model is, not where it lies or when it was copied."""
    weights = [{"file": w["file"], "bytes": w["bytes"]} for w in identity.get("weights") or []]
    dropped = {"name", "path", "weights"}
    return {k: v for k, v in identity.items() if k not in dropped} | {"weights": weights}


# The judge of a run: what two runs must share for their scores to be comparable. Every
# command's manifest carries each of them, null where it is not known.
JUDGE_FIELDS = ("judge", "prompt", "schema_sha256", "checklist", "format", "aggregate", "model",
                "sampling", "backend", "run_key")


class JSONObject(msgspec.Struct, kw_only=True):
    """A section of a JSON file grader writes (the summary, its run manifest), typed: read by
    attribute. A field that is ``UNSET`` is not written (the sections a kind of run lacks);
    the others are, in the order declared, which is the file's.

    ``obj["name"]``, ``obj.get("name")`` and ``"name" in obj`` read it as the JSON object it is
    written as (a section as a plain object, a copy), for callers of the Python API that read
    the summary as a dict."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, as written (its sections as plain objects)."""
        return {name: _json(value) for name in self.__struct_fields__
                if (value := getattr(self, name)) is not UNSET}

    def __getitem__(self, name: str) -> Any:
        # the one field, as to_dict writes it (not the whole object built for each lookup)
        value = getattr(self, name, UNSET) if name in self.__struct_fields__ else UNSET
        if value is UNSET:
            raise KeyError(name)
        return _json(value)

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name, UNSET) is not UNSET


def _json(value: Any) -> Any:
    """A field's value as its JSON value."""
    return value.to_dict() if isinstance(value, JSONObject) else msgspec.to_builtins(value)


class RunManifest(JSONObject, kw_only=True):
    """The summary's ``run``: what ran, on what, with which judge. One shape for every command
    (grade, --data-parallel, --ray, rescore: :func:`run_manifest`), each field written where
    the command sets it; a judge panel's pooled summary holds its own (``panel``). The
    :data:`JUDGE_FIELDS` are null where not known, never left out. ``entries`` are what the
    run's preparation stages add, each under its own name (the rubric stage's ``rubric``; a
    panel's ``rubric_file``, the file its judges shared), written in their place as fields of
    their own."""

    grader_version: str | UnsetType = UNSET
    started: str | UnsetType = UNSET
    data: str | None | UnsetType = UNSET
    results: str | UnsetType = UNSET
    rows: int | UnsetType = UNSET
    resumed_rows: int | None | UnsetType = UNSET
    panel: list[dict[str, Any]] | UnsetType = UNSET  # a panel's judges, one object each
    # the judge (JUDGE_FIELDS): as the run's judge describes it, or an earlier summary held it
    judge: Any = UNSET
    prompt: Any = UNSET
    schema_sha256: Any = UNSET
    checklist: Any = UNSET
    format: Any = UNSET
    aggregate: Any = UNSET
    model: Any = UNSET
    sampling: Any = UNSET
    backend: Any = UNSET
    run_key: Any = UNSET
    engine: Any = UNSET
    token_budget: Any = UNSET
    versions: dict[str, str | None] | UnsetType = UNSET
    host: dict[str, str] | UnsetType = UNSET
    identity: Any = UNSET  # who owns the results file (grader.run.owner)
    ray: Any = UNSET  # --ray: the cluster
    data_parallel: Any = UNSET  # --data-parallel: the workers
    rescored_from: str | UnsetType = UNSET
    entries: dict[str, Any] = {}  # by name: a stage's (StageEntry), after the fixed ones
    finished: str | UnsetType = UNSET

    def entry(self, kind: type[EntryT]) -> EntryT | None:
        """The entry of the stage ``kind`` is written by, typed (a summary read back holds it
        as its JSON object); None where the run has none, or it is not known."""
        value = self.entries.get(kind.name)
        if value is None or isinstance(value, kind):
            return value
        return msgspec.convert(value, kind)

    def to_dict(self) -> dict[str, Any]:
        written: dict[str, Any] = {}
        for name, value in super().to_dict().items():
            if name == "entries":
                written.update(value)
            else:
                written[name] = value
        return written

    def __getitem__(self, name: str) -> Any:
        if name in self.entries:  # written as fields of their own, not under "entries"
            return _json(self.entries[name])
        if name == "entries":
            raise KeyError(name)
        return super().__getitem__(name)


class StageEntry(msgspec.Struct, kw_only=True):
    """What the run manifest says of a preparation stage (:mod:`grader.run.stage`), written
    under :attr:`name` as a field of the manifest's own, its fields in the order declared."""

    #: the manifest field it is written under
    name: ClassVar[str]


EntryT = TypeVar("EntryT", bound=StageEntry)


def run_manifest(*, started: str, data: str | None, results: str, rows: int,
                 resumed_rows: int | None, judge: dict[str, Any], engine: dict[str, Any] | None,
                 token_budget: dict[str, Any] | None, **extra: Any) -> RunManifest:
    """The summary's ``run``, in one shape for every command (grade, --data-parallel, --ray,
    rescore). ``judge`` holds the :data:`JUDGE_FIELDS` (others are ignored); ``extra`` what
    only one command has (``identity``, ``ray``, ``data_parallel``, ``rescored_from``) and the
    entries of the run's stages by name (``rubric``)."""
    from grader import __version__

    judged: dict[str, Any] = {name: judge.get(name) for name in JUDGE_FIELDS}
    own = {name: value for name, value in extra.items() if name in _EXTRA}
    entries = {name: value for name, value in extra.items() if name not in _EXTRA}
    return RunManifest(grader_version=__version__, started=started, data=data, results=results,
                       rows=rows, resumed_rows=resumed_rows, **judged, engine=engine,
                       token_budget=token_budget, versions=package_versions(), host=host(), **own,
                       entries=entries)


# What run_manifest's callers add that is a field of RunManifest; any other name is an entry.
_EXTRA = frozenset({"identity", "ray", "data_parallel", "rescored_from"})


def package_versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def host() -> dict[str, str]:
    return {"hostname": socket.gethostname(), "platform": platform.platform()}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
