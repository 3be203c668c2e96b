"""``grader batch``: a grade run whose requests go to vLLM's offline batch runner by file.

``export`` runs ``grade``'s own run (:func:`grader.run.grading.run_grade`: the rows, the
judge's preparation stage, the controls) on a :class:`~grader.backends.batch_backend.BatchBackend`
that answers nothing it was not given: each request it is sent is kept, and the run around it
is thrown away. What was kept is written as OpenAI Batch requests (one ``/v1/chat/completions``
body per line, ``--backend openai``'s body), with a manifest beside them (``NAME.grader-batch.json``:
the settings, a digest of the data and of the export). ``import`` runs the same run again on
the runner's answers into the real results file: the same records, resume and summary as
``grade``, because it is ``grade``.

A judge with a preparation stage (the rubric format's drafts) takes two rounds: its rows can be
rendered only once the stage's answers are in, so the first export holds what can be sent
before them, and the second export (``--answers`` the first round's) what they made possible.

A request's ``custom_id`` is ``grader-EXPORT-BODY``: the first 16 hex digits of the export's
digest, then the sha256 of its body, so an answers file is checked against the export it
answers, and each answer is found again by what was asked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from pydantic import BaseModel

from grader.analysis.summary import Summary
from grader.backends import JSONSchema
from grader.backends.batch_backend import AWAITING, BatchAnswer, BatchBackend, schema_violation
from grader.backends.openai_backend import Body
from grader.config import OpenAIConfig, SamplingConfig
from grader.errors import EXIT_ENGINE, GraderError
from grader.io.jsonlines import JSONError, loads
from grader.io.manifest import now, sha256_json
from grader.io.results import read_records, write_atomic
from grader.run.controls import controls_path
from grader.run.grading import run_grade
from grader.run.request import FileJob, GradeRequest, judge_for
from grader.run.stage import stage_for
from grader.status import Status

MANIFEST_SUFFIX = ".grader-batch.json"
CHAT_URL = "/v1/chat/completions"
_PREFIX = "grader"
_EXPORT_DIGITS = 16
# GradeRequest's fields a batch manifest does not keep (the in-process engines' sections do
# not apply); of the FileJob it keeps the data and the limit, the rest is the import's.
_NOT_KEPT = frozenset({"transformers", "vllm", "chunk_size"})
# GradeRequest's text fields that are names, never files (the model is the runner's --model,
# as given)
_NAMES = frozenset({"model", "backend", "format", "aggregate", "source", "id_column"})


class BatchError(GraderError):
    """A batch file that is not what grader wrote or expects: one line, exit code 2."""


class BatchUnavailable(GraderError):
    """What ``grader batch import`` needs is not installed (exit code 3)."""

    exit_code = EXIT_ENGINE


def manifest_path(requests: Path) -> Path:
    """The manifest beside a requests file: ``requests.jsonl`` -> ``requests.grader-batch.json``."""
    return requests.with_name(requests.name.removesuffix(".jsonl") + MANIFEST_SUFFIX)


class FileDigest(msgspec.Struct, frozen=True):
    path: str
    sha256: str


class BatchManifest(msgspec.Struct, frozen=True):
    """The manifest beside an export's requests (``NAME.grader-batch.json``)."""

    grader_batch: int  # the manifest's format: 1
    export: str  # the export's digest
    round: int
    final: bool
    requests: str  # the requests file, absolute
    count: int
    created: str
    data: FileDigest
    earlier_answers: list[FileDigest]  # the earlier round's answers files the export read
    request: dict[str, Any]  # the settings that make the rows' requests, as JSON


@dataclass(frozen=True)
class Exported:
    """What ``export`` wrote: the requests, their manifest, and which round they are."""

    requests: Path
    manifest: Path
    count: int  # requests written
    digest: str  # the export's digest (its custom_ids start with its first 16 digits)
    round: int  # 1, or 2 after a first round's answers
    final: bool  # its answers are the last: import them; else export the next round
    answered: int  # requests answered already by the earlier round's answers


@dataclass(frozen=True)
class Imported:
    """What ``import`` read, beside the run's summary."""

    summary: Summary
    requests: int  # this round's requests
    answers: int  # answers read for them
    missing: int  # requests without an answer: their rows are engine_error, counted
    not_in_schema: int  # stopped answers not in their request's schema: parse_error rows
    failed: int  # answers the runner gave as errors


# --- export ------------------------------------------------------------------------------------


def export_batch(request: GradeRequest, job: FileJob, answers: Sequence[Path] = ()) -> Exported:
    """Write the OpenAI Batch requests of the run of ``request`` and ``job`` to ``job.output``
    and its manifest beside it; ``answers``: an earlier round's answers files (round 2).

    Raises :class:`BatchError` for an answers file that answers none of the run's requests,
    and when nothing is left to send.
    """
    if job.data == "-":
        raise BatchError("grader batch export reads DATA twice (export, then import): give a "
                         "file, not stdin")
    from grader.io.outputs import Kind, Planned, check_outputs

    # the one policy for every file grader writes: never DATA or an answers file it reads
    output = job.output
    check_outputs([Planned(output, Kind.BATCH_REQUESTS),
                   Planned(manifest_path(output), Kind.BATCH_MANIFEST, "beside -o")],
                  [job.data, request.rubric, request.grader_config, *answers],
                  overwrite=job.overwrite)
    request, job = _absolute(request), dataclasses.replace(job, data=os.path.abspath(job.data))
    data_sha256 = _data_digest(job.data)
    earlier = [_read_answers(path) for path in answers]
    known = _by_digest(earlier)
    pending: dict[str, Body] = {}
    used: set[str] = set()
    blocked = _traverse(request, job, known, pending, used)
    for path, lines in zip(answers, earlier, strict=True):
        if lines and not any(_digest_of(a) in used for a in lines):
            raise BatchError(f"{path}: none of its {len(lines)} answers answers a request of this "
                             "export: answers for other data or other settings")
    if not pending:
        raise BatchError("nothing to export: the answers given answer every request of the run; "
                         "import them with grader batch import")
    # A first round is the last where no row waits on what the judge's stage makes (its
    # values all given: a file, a column); a second round is the last (a row still waiting
    # then waits on a stage answer that failed, and fails the same way at the import).
    final = bool(answers) or stage_for(judge_for(request)) is None or not blocked
    fields = _request_fields(request, job)
    digest = sha256_json({"request": fields, "data_sha256": data_sha256,
                          "earlier": [_file_digest(p) for p in answers],
                          "requests": list(pending)})
    prefix = f"{_PREFIX}-{digest[:_EXPORT_DIGITS]}-"
    lines_out = [
        json.dumps({"custom_id": prefix + key, "method": "POST", "url": CHAT_URL, "body": body},
                   ensure_ascii=False)
        for key, body in pending.items()
    ]
    round_ = 2 if answers else 1
    manifest = BatchManifest(
        grader_batch=1, export=digest, round=round_, final=final,
        requests=str(output.resolve()), count=len(pending), created=now(),
        data=FileDigest(job.data, data_sha256),
        earlier_answers=[FileDigest(str(p.resolve()), _file_digest(p)) for p in answers],
        request=fields)
    write_atomic(output, "".join(line + "\n" for line in lines_out).encode("utf-8"))
    write_atomic(manifest_path(output),
                 (json.dumps(msgspec.to_builtins(manifest), indent=1) + "\n").encode("utf-8"))
    return Exported(output, manifest_path(output), len(pending), digest, round_,
                    final, len(used))


def runner_command(exported: Exported, answers: str, model: str) -> str:
    """The command that runs ``exported`` on vLLM's batch runner, with the engine settings
    that make its answers the in-process backend's (grader.backends.vllm_backend)."""
    from grader.backends.vllm_backend import VLLM_STRUCTURED_OUTPUTS

    structured = json.dumps(VLLM_STRUCTURED_OUTPUTS, separators=(",", ":"))
    return (f"python -m vllm.entrypoints.openai.run_batch -i {exported.requests} -o {answers} "
            f"--model {model} --structured-outputs-config '{structured}'")


# --- import ------------------------------------------------------------------------------------


def import_batch(answers: Sequence[Path], output: Path, *, requests: Path | None = None,
                 overwrite: bool = False) -> Imported:
    """Grade from the batch runner's ``answers`` into ``output`` (and its summary), as
    ``grade`` does: resumed, summarized, the controls' verdict.

    Args:
        answers: the runner's output files of one export (a later file's answer to a request
            replaces an earlier one's: a rerun of the requests that failed).
        requests: the export's requests file [default: the export whose manifest, beside the
            first answers file or in the working directory, has the answers' digest].

    Raises :class:`BatchError` (one line, exit code 2) for answers of another export, a
    duplicate custom_id, data changed since the export, the first of two rounds, and when most
    answers are not in their request's schema (the runner did not enforce it).
    """
    _require_jsonschema()
    read = [_read_answers(path) for path in answers]
    export = _export_of(answers, read)
    requests_file = Path(requests) if requests is not None else _find_export(answers[0], export)
    from grader.io.outputs import check_outputs, results_files

    # the answers and the export are read: never the results (run_grade checks the rest)
    check_outputs(results_files(Path(output)),
                  [*answers, requests_file, manifest_path(requests_file)], overwrite=overwrite)
    manifest = _read_manifest(manifest_path(requests_file))
    if manifest.export[:_EXPORT_DIGITS] != export:
        raise BatchError(f"{answers[0]}: answers for another export: their custom_ids are of "
                         f"export {export}, {requests_file} is export "
                         f"{manifest.export[:_EXPORT_DIGITS]}")
    if not manifest.final:
        raise BatchError(
            f"{answers[0]}: these answer round {manifest.round} of 2 (what the judge's "
            "preparation stage makes); export round 2 from them: grader batch export DATA "
            f"(the same options) --answers {answers[0]} -o REQUESTS2.jsonl")
    request, job = _request_of(manifest.request, Path(output), overwrite)
    if _data_digest(job.data) != manifest.data.sha256:
        raise BatchError(f"{job.data}: changed since the export {requests_file} was "
                         "written: export again")
    earlier = []
    for entry in manifest.earlier_answers:
        path = Path(entry.path)
        if not path.is_file() or _file_digest(path) != entry.sha256:
            raise BatchError(f"{path}: the earlier round's answers the export read are gone or "
                             "changed since: export again")
        earlier.append(_read_answers(path))
    asked = _read_requests(requests_file, export)
    given = _by_digest(read)
    found, failed, off_schema = _found(answers[0], given, asked, requests_file)
    custom_ids = {key: f"{_PREFIX}-{export}-{key}" for key in asked}
    summary = run_grade(request, job, backend_factory=_factory(
        request, answers={**_by_digest(earlier), **given}, custom_ids=custom_ids))
    return Imported(summary, len(asked), len(found), len(asked) - len(found), off_schema, failed)


def _found(first: Path, given: Mapping[str, BatchAnswer], asked: Mapping[str, JSONSchema],
           requests_file: Path) -> tuple[dict[str, BatchAnswer], int, int]:
    """The answers to the export's requests, how many failed in the runner and how many are
    not in their request's schema; BatchError for an answer to no request, and when most
    finished answers are not in their schema."""
    found = {key: given[key] for key in asked if key in given}
    stray = next((a for a in given.values() if a.custom_id.rpartition("-")[2] not in asked), None)
    if stray is not None:
        raise BatchError(f"{stray.where}: custom_id {stray.custom_id} is not a request of "
                         f"{requests_file}")
    off_schema = _off_schema(found, asked)
    stopped = sum(1 for a in found.values() if _stopped_texts(a))
    if stopped and off_schema * 2 > stopped:
        raise BatchError(
            f"{first}: {off_schema} of the {stopped} finished answers are not in their "
            "request's JSON schema: the batch runner did not enforce response_format (run it "
            "with vLLM's structured outputs, as the export printed); nothing was graded")
    return found, sum(1 for a in found.values() if _failed(a)), off_schema


def _require_jsonschema() -> None:
    try:
        import jsonschema  # noqa: F401
    except ModuleNotFoundError:
        raise BatchUnavailable("grader batch import checks each answer against its schema with "
                               "jsonschema, which is not installed: pip install "
                               "'grader[batch]'") from None


# --- the run -----------------------------------------------------------------------------------


def _factory(request: GradeRequest, **backend: Any) -> Callable[..., BatchBackend]:
    """The run's backend loader: a BatchBackend with ``backend``'s answers, the request's
    server settings (chat_template_kwargs, a tokenizer) as ``--backend openai`` has them."""

    def load(name: str, **options: Any) -> BatchBackend:
        options.pop("config", None)
        return BatchBackend(config=request.openai, **backend, **options)

    return load


def _traverse(request: GradeRequest, job: FileJob, known: Mapping[str, BatchAnswer],
              pending: dict[str, Body], used: set[str]) -> int:
    """grade's run of ``job.data`` into a directory thrown away: the requests it sends that
    ``known`` does not answer go to ``pending``; the digests it found answers for to ``used``.

    Returns how many rows (and controls) were not sent for want of an answer to another
    request (a stage's): rows that are neither sent, nor unsendable by their data, nor
    answered."""
    hits: dict[str, BatchAnswer] = _Hits(known, used)
    with tempfile.TemporaryDirectory(prefix="grader-batch-") as scratch, _quiet():
        results = Path(scratch) / "export.jsonl"
        run_grade(request, FileJob(job.data, results, overwrite=True, limit=job.limit),
                  backend_factory=_factory(request, answers=hits, pending=pending))
        files = [results] + [c for c in [controls_path(results)] if c.is_file()]
        return sum(
            1 for file in files for _, record in read_records(file)
            if record.error is not None and record.error != AWAITING
            and record.status not in _UNSENDABLE
        )


# Rows no answer could change: their data cannot be sent.
_UNSENDABLE = frozenset({Status.MISSING_CONTEXT, Status.INVALID_INPUT})


class _Hits(dict[str, BatchAnswer]):
    """The answers known, noting each digest asked for that has one."""

    def __init__(self, known: Mapping[str, BatchAnswer], used: set[str]) -> None:
        super().__init__(known)
        self.used = used

    def get(self, key: str, default: Any = None) -> Any:
        if key in self:
            self.used.add(key)
        return super().get(key, default)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The export's run says nothing (its log, its bars, the stage's lines on stderr): its
    rows fail by design, awaiting their answers, and what it would report is the import's."""
    logger = logging.getLogger("grader")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


# --- the settings kept -------------------------------------------------------------------------


def _absolute(request: GradeRequest) -> GradeRequest:
    """The request with its file paths absolute: the import may run from anywhere."""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(request):  # a prompt, grader config or items file given
        value = getattr(request, field.name)
        if field.name not in _NAMES and isinstance(value, str) and os.path.isfile(value):
            changes[field.name] = os.path.abspath(value)
    return dataclasses.replace(request, **changes)


def _request_fields(request: GradeRequest, job: FileJob) -> dict[str, Any]:
    """The settings that make the rows' requests, as JSON: the request's, the data, the limit."""
    values: dict[str, object] = {"data": job.data}
    for field in dataclasses.fields(request):
        if field.name == "truncate":  # the manifest's order: the limit before the truncate
            values["limit"] = job.limit
        if field.name not in _NOT_KEPT:
            values[field.name] = getattr(request, field.name)
    return {name: value.model_dump(mode="json") if isinstance(value, BaseModel)
            else list(value) if isinstance(value, tuple) else value
            for name, value in values.items()}


def _request_of(fields: Mapping[str, Any], output: Path,
                overwrite: bool) -> tuple[GradeRequest, FileJob]:
    kept = dict(fields)
    try:
        job = FileJob(kept.pop("data"), output, overwrite=overwrite, limit=kept.pop("limit", None))
        return GradeRequest(
            **{k: v for k, v in kept.items() if k not in ("sampling", "openai", "truncate")},
            truncate=tuple(kept.get("truncate") or ()),
            sampling=SamplingConfig.model_validate(kept.get("sampling") or {}),
            openai=OpenAIConfig.model_validate(kept.get("openai") or {})), job
    except (KeyError, TypeError, ValueError) as exc:
        raise BatchError(f"the export's manifest holds settings this grader does not know: "
                         f"{exc}") from None


def _data_digest(data: str) -> str:
    """The sha256 of the data file (of each file, by name, in a folder such as save_to_disk's)."""
    path = Path(data)
    if not path.is_dir():
        return _file_digest(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0" + _file_digest(file).encode())
    return digest.hexdigest()


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as stream:
            while block := stream.read(1 << 20):
                digest.update(block)
    except OSError as exc:
        raise BatchError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    return digest.hexdigest()


# --- the files ---------------------------------------------------------------------------------


def _lines(path: Path) -> Iterator[tuple[int, Any]]:
    """Each non-blank line of ``path`` decoded, with its number; BatchError for one that is
    not JSON."""
    try:
        stream = open(path, "rb")  # noqa: SIM115  (closed below, lines read lazily)
    except OSError as exc:
        raise BatchError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    with stream:
        for number, raw in enumerate(stream, 1):
            if not raw.strip():
                continue
            try:
                yield number, loads(raw, bom=number == 1)
            except JSONError as exc:
                raise BatchError(f"{path}:{number}: {exc}") from None


def _read_answers(path: Path) -> list[BatchAnswer]:
    """A batch runner's output file: one answer per custom_id (a second one is an error)."""
    answers: list[BatchAnswer] = []
    first: dict[str, int] = {}
    for number, line in _lines(path):
        where = f"{path}:{number}"
        if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
            raise BatchError(f"{where}: not a batch answer (a JSON object with a custom_id)")
        custom_id = line["custom_id"]
        if "response" not in line and "body" in line:
            raise BatchError(f"{where}: a request, not an answer: give the batch runner's "
                             "output file (-o of run_batch), not the requests")
        if custom_id in first:
            raise BatchError(f"{where}: custom_id {custom_id} again (first at line "
                             f"{first[custom_id]}): duplicate custom_ids")
        first[custom_id] = number
        _split(custom_id, where)
        response = line.get("response")
        if response is not None and not isinstance(response, dict):
            raise BatchError(f"{where}: response is not a JSON object")
        status = (response or {}).get("status_code", 200 if response else 500)
        if type(status) is not int:
            raise BatchError(f"{where}: response.status_code is not a number")
        answers.append(BatchAnswer(custom_id, status, (response or {}).get("body"),
                                   line.get("error"), where))
    return answers


def _split(custom_id: str, where: str) -> tuple[str, str]:
    """A grader custom_id's export and body digest."""
    prefix, _, rest = custom_id.partition("-")
    export, _, key = rest.partition("-")
    if prefix != _PREFIX or len(export) != _EXPORT_DIGITS or len(key) != 64:
        raise BatchError(f"{where}: custom_id {custom_id!r} is not one grader batch export "
                         "wrote")
    return export, key


def _digest_of(answer: BatchAnswer) -> str:
    return _split(answer.custom_id, answer.where)[1]


def _by_digest(files: Sequence[Sequence[BatchAnswer]]) -> dict[str, BatchAnswer]:
    """Answers by body digest; a later file's answer replaces an earlier one's."""
    return {_digest_of(a): a for answers in files for a in answers}


def _export_of(paths: Sequence[Path], files: Sequence[Sequence[BatchAnswer]]) -> str:
    """The one export the answers files answer."""
    export = None
    for path, answers in zip(paths, files, strict=True):
        for answer in answers:
            this = _split(answer.custom_id, answer.where)[0]
            if export is None:
                export = this
            elif this != export:
                raise BatchError(f"{answer.where}: custom_id {answer.custom_id} is of export "
                                 f"{this}, the answers before it of {export}: answers of two "
                                 "exports")
        if not answers:
            raise BatchError(f"{path}: no answers")
    assert export is not None
    return export


def _find_export(answers: Path, export: str) -> Path:
    """The requests file of ``export``: its manifest beside ``answers`` or in the working
    directory."""
    for folder in dict.fromkeys([answers.resolve().parent, Path.cwd().resolve()]):
        for candidate in sorted(folder.glob("*" + MANIFEST_SUFFIX)):
            with contextlib.suppress(BatchError):
                manifest = _read_manifest(candidate)
                if manifest.export[:_EXPORT_DIGITS] == export:
                    return Path(manifest.requests)
    raise BatchError(f"{answers}: no manifest of export {export} (NAME{MANIFEST_SUFFIX}) beside "
                     "it or in the working directory: give the export's requests file with "
                     "--requests")


def _read_manifest(path: Path) -> BatchManifest:
    try:
        return msgspec.convert(loads(path.read_bytes()), BatchManifest)
    except OSError as exc:
        raise BatchError(f"{path}: cannot be read ({exc.strerror or exc}): the export writes "
                         "it beside its requests") from None
    except JSONError as exc:
        raise BatchError(f"{path}: {exc}") from None
    except msgspec.ValidationError:
        raise BatchError(f"{path}: not a grader batch manifest") from None


def _read_requests(path: Path, export: str) -> dict[str, JSONSchema]:
    """The export's requests: body digest -> the JSON schema its answer must be in."""
    schemas: dict[str, JSONSchema] = {}
    for number, line in _lines(path):
        where = f"{path}:{number}"
        if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
            raise BatchError(f"{where}: not a batch request")
        this, key = _split(line["custom_id"], where)
        if this != export:
            raise BatchError(f"{where}: a request of export {this}, not {export}")
        try:
            schemas[key] = line["body"]["response_format"]["json_schema"]["schema"]
        except (KeyError, TypeError):
            raise BatchError(f"{where}: a request without its response_format schema") from None
    return schemas


# --- what the answers hold ---------------------------------------------------------------------


def _failed(answer: BatchAnswer) -> bool:
    return answer.status_code != 200 or answer.error is not None or answer.body is None


def _stopped_texts(answer: BatchAnswer) -> list[str]:
    """The texts of the answer's choices that ended on their own (a cut one is not whole
    JSON under any schema: it is graded ``truncated``)."""
    if _failed(answer) or not isinstance(answer.body, dict):
        return []
    texts = []
    for choice in answer.body.get("choices") or []:
        if isinstance(choice, dict) and choice.get("finish_reason") == "stop":
            message = choice.get("message") or {}
            texts.append(str(message.get("content") or "") if isinstance(message, dict) else "")
    return texts


def _off_schema(found: Mapping[str, BatchAnswer], schemas: Mapping[str, JSONSchema]) -> int:
    """The answers with a finished text that is not in their request's schema."""
    return sum(
        1 for key, answer in found.items()
        if any(schema_violation(text, schemas[key]) is not None
               for text in _stopped_texts(answer))
    )
