"""Files other tools write, read as dataset rows: lm-evaluation-harness ``--log_samples`` files,
inspect_ai eval logs (``.eval``, ``.json``) and Hugging Face ``save_to_disk`` folders.

Each reader yields ``(LINE, row)`` as :mod:`grader.io.dataset`'s own readers do, each row with
``id``, ``input``, ``reference`` and ``output_text`` plus the tool's other fields under their
own names (docs/formats.md, "Files from lm-evaluation-harness, inspect_ai and Hugging Face datasets").
A file of the wrong shape is a :class:`ForeignFileError` of one line, which
:class:`grader.io.dataset.Dataset` raises as its ``DatasetError``. None of the tools is needed
to read its files; a ``.eval`` log whose members are zstd-compressed (inspect_ai's default)
needs zipfile-zstd (grader[inspect]) on Python < 3.14.
"""

from __future__ import annotations

import json
import sys
import zipfile
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

# A JSON object as its file holds it, passing through: a user's row, another tool's sample,
# header or attachments.
Row = dict[str, Any]
Rows = Iterator[tuple[int, Row]]

# ``--from``: the three plain formats, then the tools'. Detected when not given (detect below).
SOURCES = ("jsonl", "csv", "parquet", "lm-eval", "inspect", "hf-disk")
FOREIGN = ("lm-eval", "inspect", "hf-disk")
# Formats whose first row holds every column (a header or a schema); the others' columns are
# the union over their rows.
SCHEMA_SOURCES = ("csv", "parquet", "hf-disk")

LM_EVAL_KEYS = ("doc_id", "doc", "target", "filtered_resps")


class ForeignFileError(ValueError):
    """A file of the wrong shape: ``PATH:LINE: reason``, one line (dataset.py raises it as its
    DatasetError, a subclass)."""

    def __init__(self, path: str, line: int | None, reason: str):
        reason = " ".join(str(reason).splitlines())  # one line, whatever a library said
        self.path, self.line, self.reason = path, line, reason
        super().__init__(f"{path}:{line}: {reason}" if line is not None else f"{path}: {reason}")


def detect(path: str) -> str | None:
    """The tool that wrote ``path``, where its name or kind says so, or None (a plain
    JSONL/CSV/Parquet file, stdin, or a ``.jsonl`` file whose first row decides:
    :func:`is_lm_eval`)."""
    if path == "-":
        return None
    file = Path(path)
    if file.is_dir():
        return "hf-disk"
    if file.suffix.lower() in (".eval", ".json"):
        return "inspect"
    return None


def is_lm_eval(first: Row) -> bool:
    """A ``.jsonl`` file's first row has lm-evaluation-harness's sample keys."""
    return all(key in first for key in LM_EVAL_KEYS)


def reader(source: str, jsonl: Callable[[str], Rows]) -> Callable[[str], Rows]:
    """The reader of ``source`` (one of :data:`FOREIGN`); ``jsonl`` as for :func:`detect`."""
    if source == "lm-eval":
        return lambda path: lm_eval_rows(path, jsonl(path))
    return {"inspect": inspect_rows, "hf-disk": hf_disk_rows}[source]


def _one(value: Any) -> Any:
    """A list of one reference is that reference; a longer list stays a list (JSON to the judge)."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _flat(prefix: str, values: Any) -> Row:
    """``{"question": ...}`` -> ``{"doc.question": ...}``: a column for --map, --group-by."""
    if not isinstance(values, dict):
        return {}
    return {f"{prefix}.{key}": value for key, value in values.items()}


# -- lm-evaluation-harness -------------------------------------------------------------------


def lm_eval_rows(path: str, lines: Rows) -> Rows:
    """An lm-evaluation-harness ``samples_<task>_<date>.jsonl`` file (``--log_samples``).

    ``reference`` is ``target``, ``output_text`` is ``filtered_resps[0]`` and ``input`` is the
    prompt the model was given (the request's first argument); each field of the task's
    ``doc`` is a column ``doc.FIELD`` (``--map input=doc.question`` for the question alone),
    each metric ``metric.NAME``. The id is ``doc_id``, or ``DOC_ID/FILTER`` for a task with
    filters (one line per document and filter).
    """
    for line, sample in lines:
        yield line, _lm_eval_row(path, line, sample)


def _lm_eval_row(path: str, line: int, sample: Row) -> Row:
    missing = [key for key in LM_EVAL_KEYS if key not in sample]
    if missing:
        raise ForeignFileError(
            path, line, f"not an lm-evaluation-harness sample: no {', '.join(missing)}"
        )
    doc_id, name = sample["doc_id"], sample.get("filter", "none")
    row = {
        "id": doc_id if name == "none" else f"{doc_id}/{name}",
        "input": _lm_eval_prompt(sample.get("arguments")),
        "reference": _one(sample["target"]),
        "output_text": _lm_eval_answer(path, line, sample["filtered_resps"]),
        "doc_id": doc_id,
        "filter": name,
        **_flat("doc", sample["doc"]),
    }
    for metric in sample.get("metrics") or ():
        if isinstance(metric, str) and metric in sample:
            row[f"metric.{metric}"] = sample[metric]
    return row


def _lm_eval_answer(path: str, line: int, responses: Any) -> str:
    """The generated text of a sample's ``filtered_resps``."""
    if not isinstance(responses, list) or not responses:
        raise ForeignFileError(path, line,
                               f"filtered_resps is {responses!r}, not a list of answers")
    answer = responses[0]
    # `repeats` without a take_first filter keeps every generation: the first, as take_first would
    if isinstance(answer, list) and answer and all(isinstance(a, str) for a in answer):
        answer = answer[0]
    if not isinstance(answer, str):
        raise ForeignFileError(
            path, line, f"filtered_resps[0] is {answer!r}, not a generated text: only "
            "generate_until tasks have answers to grade"
        )
    return answer


def _lm_eval_prompt(arguments: Any) -> Any:
    """The request's first argument: ``{"gen_args_0": {"arg_0": PROMPT, ...}}`` (lm-eval 0.4.3
    and later) or ``[[PROMPT, KWARGS]]`` (earlier)."""
    if isinstance(arguments, dict) and arguments:
        first = next(iter(arguments.values()))
        return first.get("arg_0") if isinstance(first, dict) else None
    if isinstance(arguments, list) and arguments:
        first = arguments[0]
        return first[0] if isinstance(first, list) and first else first
    return None


# -- inspect_ai ------------------------------------------------------------------------------


def inspect_rows(path: str) -> Rows:
    """An inspect_ai eval log: one row per sample and epoch, in the dataset's order.

    ``reference`` is ``target``, ``output_text`` is ``output.completion`` and ``input`` the
    sample's input (a chat is rendered ``role: text``, one message to a paragraph). The id is
    the sample id, or ``ID/EPOCH`` when the eval ran more than one epoch. LINE is the row's
    number. A ``.eval`` log is read one sample at a time; a ``.json`` log is one JSON
    document, read whole.
    """
    if Path(path).suffix.lower() == ".json":
        samples, epochs = _json_log(path)
    else:
        samples, epochs = _eval_log(path)
    for number, sample in enumerate(samples, start=1):
        yield number, _inspect_row(path, number, sample, epochs)


def _json_log(path: str) -> tuple[Iterator[Row], int]:
    try:
        with open(path, "rb") as handle:
            log = json.load(handle)
    except OSError as exc:
        raise ForeignFileError(path, None, f"cannot read the file: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ForeignFileError(path, None, f"not an inspect_ai log: invalid JSON ({exc})") from None
    if not isinstance(log, dict) or not isinstance(log.get("eval"), dict):
        raise ForeignFileError(path, None, "not an inspect_ai log: no 'eval' object at the top")
    samples = log.get("samples")
    if not isinstance(samples, list):
        raise ForeignFileError(
            path, None, "the inspect_ai log holds no samples (a header-only log?)"
        )
    epochs, order = _epochs(path, log["eval"]), _order(log["eval"])
    # the log lists samples as they finished: the dataset's order, as inspect_ai reads a .eval
    if order is not None and all(isinstance(s, dict) for s in samples):
        last = len(order)
        samples = sorted(
            samples, key=lambda s: (order.get(_key(s.get("id")), last), s.get("epoch") or 0)
        )
    return iter(samples), epochs


def _key(sample_id: Any) -> str:
    return f"{type(sample_id).__name__}:{sample_id}"


def _order(header: Row) -> dict[str, int] | None:
    ids = (header.get("dataset") or {}).get("sample_ids")
    return {_key(i): n for n, i in enumerate(ids)} if isinstance(ids, list) else None


def _epochs(path: str, header: Row) -> int:
    """The eval's ``config.epochs``: 1 where it is not given; a whole number written as text
    (``"2"``) or as a float (``2.0``) is that number; anything else (``"two"``, ``1.5``, 0, a
    bool) stops with the file named, as the ids of its rows depend on it."""
    config = header.get("config")
    value = config.get("epochs") if isinstance(config, dict) else None
    if value is None:
        return 1
    epochs: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        epochs = value
    elif isinstance(value, float) and value.is_integer():
        epochs = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        epochs = int(value.strip())
    if epochs is None or epochs < 1:
        raise ForeignFileError(path, None, f"the inspect_ai log's eval.config.epochs is "
                                           f"{value!r}: not a whole number of epochs (1 or more)")
    return epochs


def _eval_log(path: str) -> tuple[Iterator[Row], int]:
    """A ``.eval`` log, read as the zip of JSON members it is (``header.json``, or
    ``_journal/start.json`` while the eval runs, and ``samples/ID_epoch_N.json``).

    Not with ``inspect_ai.log.read_eval_log_samples``: it opens the log again for every sample,
    some forty times slower (docs/benchmarks.md, "Reading inspect_ai .eval logs").
    The members are zstd-compressed (inspect_ai's default): Python reads them from 3.14, and
    before that with zipfile-zstd (grader[inspect]), which inspect_ai itself installs and uses.
    """
    # without it a log compressed otherwise still reads; a zstd one says what to install
    if sys.version_info < (3, 14):
        with suppress(ImportError):
            import zipfile_zstd  # noqa: F401  (teaches zipfile the zstd method, as inspect_ai does)
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ForeignFileError(path, None, f"not a readable inspect_ai .eval log: {exc}") from None
    try:
        header = _eval_header(path, archive)
        epochs = _epochs(path, header)
    except ForeignFileError:
        archive.close()
        raise
    ids = (header.get("dataset") or {}).get("sample_ids")
    if isinstance(ids, list):
        wanted = [f"samples/{i}_epoch_{e}.json" for i in ids for e in range(1, epochs + 1)]
        members = [name for name in wanted if name in set(archive.namelist())]
    else:  # a log without sample ids: the archive's order
        members = [
            n for n in archive.namelist() if n.startswith("samples/") and n.endswith(".json")
        ]

    def samples() -> Iterator[Row]:
        with archive:
            for number, name in enumerate(members, start=1):
                yield _member(path, archive, name, number)

    return samples(), epochs


def _eval_header(path: str, archive: zipfile.ZipFile) -> Row:
    """The eval's header: ``header.json``, or ``_journal/start.json`` while the eval runs."""
    name = "header.json" if "header.json" in archive.namelist() else "_journal/start.json"
    header = _member(path, archive, name, None)
    header = header.get("eval") if isinstance(header, dict) else None
    if not isinstance(header, dict):
        raise ForeignFileError(path, None,
                               "not an inspect_ai .eval log: no header with an 'eval' object")
    return header


def _member(path: str, archive: zipfile.ZipFile, name: str, number: int | None) -> Any:
    try:
        return json.loads(archive.read(name))
    except KeyError:
        raise ForeignFileError(path, number, f"not an inspect_ai .eval log: no {name}") from None
    except NotImplementedError:  # zstd, inspect_ai's compression, on Python < 3.14
        raise ForeignFileError(
            path, number, "the log is zstd-compressed, which this Python reads only with "
            "zipfile-zstd installed: pip install 'grader[inspect]'"
        ) from None
    except Exception as exc:  # BadZipFile (a bad CRC), zlib.error, EOFError, invalid JSON
        raise ForeignFileError(path, number, f"cannot read {name}: {exc}") from None


def _inspect_row(path: str, number: int, sample: Any, epochs: int) -> Row:
    if not isinstance(sample, dict) or "id" not in sample or "input" not in sample:
        raise ForeignFileError(path, number, "not an inspect_ai sample: no id or input")
    sample_id, epoch = sample["id"], sample.get("epoch") or 1
    attachments = sample.get("attachments") or {}
    row = {
        "id": sample_id if epochs == 1 else f"{sample_id}/{epoch}",
        "input": _chat_text(sample["input"], attachments),
        "reference": _one(sample.get("target")),
        "output_text": _completion(path, number, sample.get("output")),
        "sample_id": sample_id,
        "epoch": epoch,
        **_flat("metadata", sample.get("metadata")),
    }
    for name, score in _scores(path, number, sample.get("scores")).items():
        row[f"score.{name}"] = score.get("value") if isinstance(score, dict) else score
    error = sample.get("error")
    if error:
        row["error"] = error.get("message") if isinstance(error, dict) else str(error)
    return row


def _completion(path: str, number: int, output: Any) -> str:
    """The sample's answer, ``output.completion``: inspect_ai writes it for every sample (""
    where the model failed, beside the sample's ``error``). A log without it is of a shape
    grader does not know: read as empty answers it would grade every row missing_context."""
    expected = "expected an inspect_ai sample with output.completion (the model's answer)"
    if not isinstance(output, dict):
        raise ForeignFileError(path, number, f"no output: {expected}")
    if "completion" not in output:
        raise ForeignFileError(path, number, f"no output.completion: {expected}")
    completion = output["completion"]
    if not isinstance(completion, str):
        raise ForeignFileError(
            path, number, f"output.completion is {_kind(completion)}: {expected}"
        )
    return completion


def _scores(path: str, number: int, scores: Any) -> Row:
    """The sample's scores by scorer name (inspect_ai's ``EvalSample.scores``); none is {}."""
    if scores is None:
        return {}
    if not isinstance(scores, dict):
        raise ForeignFileError(
            path, number, f"the sample's scores is {_kind(scores)}, not an object of scorer "
            "names to scores (inspect_ai's EvalSample.scores)"
        )
    return scores


def _kind(value: Any) -> str:
    """A JSON value's kind, in JSON's words."""
    names = {list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number"}
    return names.get(type(value), type(value).__name__)


def _chat_text(value: Any, attachments: Row) -> Any:
    """A sample's input as text: a string as it is; a list of chat messages as one paragraph
    per message, ``role: text`` (a lone user message is its text alone)."""
    if not isinstance(value, list):
        return _resolve(value, attachments)
    messages = [m for m in value if isinstance(m, dict)]
    if len(messages) == 1 and messages[0].get("role") == "user":
        return _content_text(messages[0].get("content"), attachments)
    return "\n\n".join(
        f"{m.get('role', 'user')}: {_content_text(m.get('content'), attachments)}" for m in messages
    )


def _content_text(content: Any, attachments: Row) -> str:
    if isinstance(content, str):
        return _attached_text(content, attachments)
    parts = []
    for part in content if isinstance(content, list) else ():
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            text = part.get("text", "")
            parts.append(_attached_text(text, attachments) if isinstance(text, str) else str(text))
        else:  # an image, audio, a document, reasoning: named, not inlined
            parts.append(f"[{kind or 'content'}]")
    return "\n".join(parts)


def _resolve(text: Any, attachments: Row) -> Any:
    """inspect_ai stores repeated or long content once, as ``attachment://HASH``."""
    if isinstance(text, str) and text.startswith("attachment://"):
        return attachments.get(text.removeprefix("attachment://"), text)
    return text


def _attached_text(text: str, attachments: Row) -> str:
    """A text part, resolved as :func:`_resolve` does; an attachment that is no text keeps the
    reference."""
    resolved = _resolve(text, attachments)
    return resolved if isinstance(resolved, str) else text


# -- Hugging Face datasets save_to_disk ------------------------------------------------------


def hf_disk_rows(path: str) -> Rows:
    """A ``datasets`` ``save_to_disk`` folder: its Arrow stream shards in ``state.json``'s order,
    read with pyarrow. A DatasetDict folder with one split reads that split; with more, the
    split's own folder is the path. ClassLabel columns read as their names. LINE is the row's
    number."""
    folder = _split_folder(path)
    files = _json_file(path, folder / "state.json").get("_data_files")
    if not isinstance(files, list) or not all(
        isinstance(f, dict) and "filename" in f for f in files
    ):
        raise ForeignFileError(
            path, None, "state.json lists no '_data_files': not a save_to_disk folder"
        )
    shards = [folder / f["filename"] for f in files]
    for shard in shards:  # all before the first row: a missing shard must not half-grade a run
        if not shard.is_file():
            raise ForeignFileError(
                path, None, f"shard {shard.name} (listed in state.json) is missing"
            )
    labels = _class_labels(path, folder)
    number = 0
    for shard in shards:
        for row in _shard_rows(path, shard, number):
            number += 1
            for column, names in labels.items():
                value = row.get(column)
                if isinstance(value, int) and 0 <= value < len(names):
                    row[column] = names[value]
            yield number, row


def _shard_rows(path: str, shard: Path, number: int) -> Iterator[Row]:
    """An Arrow stream shard's rows; ``number``: the rows before it (an error's LINE)."""
    import pyarrow as pa  # only for this input

    try:
        stream = pa.ipc.open_stream(pa.memory_map(str(shard)))
    except Exception as exc:  # ArrowInvalid, OSError
        raise ForeignFileError(path, number + 1, f"{shard.name} is not an Arrow stream: {exc}"
                               ) from None
    while True:
        try:
            batch = stream.read_next_batch()
        except StopIteration:
            return
        except Exception as exc:  # a truncated shard shows only when it is read
            raise ForeignFileError(path, number + 1, f"cannot read {shard.name}: {exc}") from None
        yield from batch.to_pylist()
        number += batch.num_rows


def _split_folder(path: str) -> Path:
    folder = Path(path)
    if (folder / "dataset_dict.json").is_file():
        splits = _json_file(path, folder / "dataset_dict.json").get("splits") or []
        if len(splits) == 1:
            return folder / str(splits[0])
        example = folder / splits[0] if splits else folder / "SPLIT"
        raise ForeignFileError(
            path, None, f"a DatasetDict with splits {', '.join(map(str, splits))}: give one "
            f"split's folder, e.g. {example}"
        )
    if not (folder / "state.json").is_file():
        raise ForeignFileError(
            path, None, "a folder without state.json or dataset_dict.json: not a Hugging Face "
            "save_to_disk folder"
        )
    return folder


def _json_file(path: str, file: Path) -> Any:
    try:
        value = json.loads(file.read_bytes())
    except FileNotFoundError:
        raise ForeignFileError(
            path, None, f"no {file.name}: not a Hugging Face save_to_disk folder"
        ) from None
    except OSError as exc:
        raise ForeignFileError(
            path, None, f"cannot read {file.name}: {exc.strerror or exc}"
        ) from None
    except ValueError as exc:
        raise ForeignFileError(path, None, f"{file.name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ForeignFileError(path, None, f"{file.name} is not a JSON object")
    return value


def _class_labels(path: str, folder: Path) -> dict[str, list[str]]:
    """Columns that are ``ClassLabel`` features, with their names (dataset_info.json)."""
    if not (folder / "dataset_info.json").is_file():
        return {}
    features = _json_file(path, folder / "dataset_info.json").get("features")
    if not isinstance(features, dict):
        return {}
    return {
        column: feature["names"]
        for column, feature in features.items()
        if isinstance(feature, dict) and feature.get("_type") == "ClassLabel"
        and isinstance(feature.get("names"), list)
    }
