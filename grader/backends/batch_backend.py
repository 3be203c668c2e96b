"""A backend whose answers come from vLLM's batch runner (``grader batch``): no engine here.

``grader batch export`` builds each request exactly as ``--backend openai`` would send it to a
vLLM server (the same body: :meth:`OpenAIBackend._body`), and ``grader batch import`` reads
each answer exactly as that backend reads a server's (:meth:`OpenAIBackend._completions`): a
batch run is a server run whose requests travel by file. A request is known by the digest of
its body (:func:`body_digest`), so an answer is found again by what was asked, never by a
row's position.

Export (``pending`` given): a request no answer is known for is kept in ``pending`` and its
row fails with :data:`AWAITING` (the run around it is thrown away). Import: a request without
an answer fails as an engine error (counted, graded again by a later import), and an answer
that is not in its request's JSON schema (a runner that ignored ``response_format``) fails as
a parse error: it is never read into a score.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader.backends import Completion, GenerateRequest
from grader.backends.openai_backend import Body, OpenAIBackend, _http_failure
from grader.backends.vllm_compat import vllm_version
from grader.errors import one_line
from grader.status import Status

# The error of a row whose request was exported and awaits its answer (export only).
AWAITING = "grader batch: awaiting this request's answer from the batch runner"
NO_ANSWER = "grader batch: no answer to this request (custom_id {custom_id}) in the answers read"
NOT_IN_SCHEMA = ("grader batch: the answer is not in the request's JSON schema (a batch runner "
                 "that did not enforce response_format): {why}")


def body_digest(body: Mapping[str, Any]) -> str:
    """The sha256 of a request body's canonical JSON: what identifies a request."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class BatchAnswer:
    """One line of a batch runner's output file: what answered one request."""

    custom_id: str
    status_code: int
    body: Any  # the chat completion (status 200), else None
    error: Any  # the runner's error for the request, else None
    where: str  # FILE:LINE, for messages


class _Reply:
    """A batch answer's failure, shaped as the HTTP response ``_http_failure`` reads."""

    def __init__(self, answer: BatchAnswer) -> None:
        self.status_code = answer.status_code if answer.status_code != 200 else 500
        self._error = answer.error

    def json(self) -> Any:
        if isinstance(self._error, dict):
            return self._error
        return {"error": str(self._error or "the batch runner gave no answer body")}

    @property
    def text(self) -> str:
        return one_line(self._error)


def schema_violation(text: str, schema: Mapping[str, Any]) -> str | None:
    """Why ``text`` is not a JSON document under ``schema`` (None: it is)."""
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"not JSON ({one_line(exc)})"
    error = jsonschema.exceptions.best_match(
        jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    return None if error is None else one_line(error.message, limit=200)


class BatchBackend(OpenAIBackend):
    """``--backend openai``'s requests and answers, carried by files (see the module)."""

    name = "batch"
    supports_stop = True  # repetition_detection is in the body; vLLM's runner takes it
    chunk_size = 512  # no engine here: a block is only what one results write holds

    def __init__(self, model: str, *, answers: Mapping[str, BatchAnswer] | None = None,
                 pending: dict[str, Body] | None = None,
                 custom_ids: Mapping[str, str] | None = None, **options: Any) -> None:
        """Args:
            answers: body digest -> the batch runner's answer.
            pending: export: where each unanswered request's body goes, by digest.
            custom_ids: body digest -> custom_id, for the messages of answers missing.
        """
        self.answers = answers or {}
        self.pending = pending
        self.custom_ids = custom_ids or {}
        super().__init__(model, **options)

    def _load(self, model: str) -> None:
        """No server to ask: the model is the name the runner serves (its ``--model``), and
        where the model directory has a tokenizer the messages are rendered as in process."""
        self.base_url = ""
        self.model = model
        # the installed vLLM's (its runner reads the vLLM fields of each body), not imported
        self.vllm_version = vllm_version()
        self.max_model_len = None
        self.token_count, self.budget_off = None, "the batch runner counts no tokens ahead"
        if self.config.tokenizer or (Path(model) / "tokenizer_config.json").is_file():
            from grader.backends.chat import ChatFormatter, load_tokenizer

            self.formatter = ChatFormatter(load_tokenizer(self.config.tokenizer or model),
                                           self.config.chat_template_kwargs)

    def describe(self) -> dict[str, object]:
        return {
            "backend": self.name,
            "runner": "vllm run-batch",
            "served_model": self.model,
            "vllm": self.vllm_version,
            "formatter": self.formatter is not None,
            "chat_template_kwargs": dict(self.config.chat_template_kwargs),
            "sampling": self.sampling.to_vllm_kwargs(self.max_tokens),
        }

    def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        completions: list[Completion] = []
        for request in requests:
            body = self.body(request)
            digest = body_digest(body)
            answer = self.answers.get(digest)
            if answer is not None:
                completions.extend(self._answered(answer, body))
                continue
            if self.pending is not None:
                self.pending.setdefault(digest, body)
                error = AWAITING
            else:
                error = NO_ANSWER.format(custom_id=self.custom_ids.get(digest, "not exported"))
            completions.extend([Completion("", "error", error=error)] * self.samples)
        return completions

    def _answered(self, answer: BatchAnswer, body: Body) -> list[Completion]:
        """The answer read as the openai backend reads a server's; a stopped answer that is
        not in the request's schema is a parse error, never text for the judge to read."""
        if answer.status_code != 200 or answer.error is not None or answer.body is None:
            failed = _http_failure(_Reply(answer))
            return [Completion("", "error", error=f"the batch runner: {failed.reason}",
                               failure=failed.failure)] * self.samples
        completions = self._completions(answer.body)
        schema = body["response_format"]["json_schema"]["schema"]
        checked = []
        for completion in completions:
            why = (schema_violation(completion.text, schema)
                   if completion.finish_reason == "stop" else None)
            if why is not None:
                completion = dataclasses.replace(
                    completion, finish_reason="error", error=NOT_IN_SCHEMA.format(why=why),
                    failure=Status.PARSE_ERROR, tokens=None, top_logprobs=None)
            checked.append(completion)
        return checked
