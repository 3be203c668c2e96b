"""Backend on a running OpenAI-compatible chat-completions server (``--backend openai``).

``vllm serve``, SGLang, llama.cpp's server or TGI grade the rows: one request per row
(``--max-concurrency`` in flight, asyncio + httpx) under the same JSON schema as in process.
Written against ``vllm serve``; imports neither torch nor vllm.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import random
from collections.abc import Sequence
from typing import Annotated, Any
from urllib.parse import urlsplit

import msgspec

from grader.backends import (
    Backend,
    Completion,
    EngineSettingsError,
    EngineUnavailable,
    GenerateRequest,
    JSONSchema,
    LoopStop,
    Message,
    ended_completion,
    merged_top,
    refused_status,
)
from grader.config import BackendSettings, OpenAIConfig
from grader.errors import one_line
from grader.status import Status

log = logging.getLogger(__name__)

# A body of the OpenAI API (a chat-completions request, a /v1/models entry): the server's JSON.
Body = dict[str, Any]


class ServerUnavailable(EngineUnavailable):
    """No server answers at --base-url, or it does not force the schema: one line says why."""


class ServedModelError(EngineSettingsError):
    """--model names no model the server serves."""


class ServerAnswerError(RuntimeError):
    """An answer of the server's that is not what the protocol says: one line that names the
    field (msgspec's words), never a Python error's."""


# What grader reads of a chat completion, checked field by field before any of it is used: a
# broken server gives its row a reason in words, and no NaN, negative count or positive
# log-probability reaches a record or the confidence's arithmetic.
_Count = Annotated[int, msgspec.Meta(ge=0)]
# A log-probability is at most 0; a positive one a hair above it is rounding at a near-certain
# token (read as 0), a larger one, NaN or +inf a broken server.
_LOGPROB_ROUNDING = 1e-4
_LogProb = Annotated[float, msgspec.Meta(le=_LOGPROB_ROUNDING)]


class _Candidate(msgspec.Struct):
    token: str
    logprob: _LogProb | None = None


class _Step(_Candidate):
    top_logprobs: list[_Candidate] | None = None


class _Logprobs(msgspec.Struct):
    content: list[_Step] | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    message: _Message | None = None
    finish_reason: str | None = None
    logprobs: _Logprobs | None = None


class _Details(msgspec.Struct):
    reasoning_tokens: _Count | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: _Count | None = None
    completion_tokens: _Count | None = None
    completion_tokens_details: _Details | None = None


class _Reply(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None


class _Tokenized(msgspec.Struct):  # vLLM's POST /tokenize
    count: _Count


def _chat_completion(reply: Any) -> _Reply:
    """``reply`` (the decoded JSON) as a chat completion, or ServerAnswerError naming the
    field that is not one."""
    try:
        return msgspec.convert(reply, _Reply)
    except msgspec.ValidationError as exc:
        raise ServerAnswerError(f"the server's answer is not a chat completion: {exc}") from None


# vLLM writes a log-probability of -inf as -9999.0 (vllm_compat, "logprobs"): read back.
_NEG_INF_LOGPROB = -9999.0
# A probe schema a free answer would not match: one key holding one exact string.
_PROBE_VALUE = "grader-probe-7f3"
PROBE_SCHEMA = {"type": "object",
                "properties": {"probe": {"type": "string", "enum": [_PROBE_VALUE]}},
                "required": ["probe"], "additionalProperties": False}
_PROBE_TOKENS = 64
_BACKOFF_S, _BACKOFF_MAX_S = 0.5, 8.0


def _httpx() -> Any:
    try:
        import httpx
    except ModuleNotFoundError as exc:
        raise ServerUnavailable(
            "--backend openai needs httpx, which is not installed: pip install 'grader[openai]'"
        ) from exc
    return httpx


def _root(base_url: str) -> str:
    """The server's root: vLLM serves /tokenize, /version and /health beside /v1."""
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _check_url(base_url: str | None) -> str:
    if not base_url:
        raise ServerUnavailable(
            "--backend openai needs --base-url, e.g. http://127.0.0.1:8000/v1 (the server's "
            "OpenAI-compatible root)"
        )
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ServerUnavailable(f"--base-url {base_url!r}: expected http(s)://HOST:PORT/v1")
    return base_url.rstrip("/")


def api_key(config: OpenAIConfig) -> str | None:
    """The key from the environment variable ``config.api_key_env``; only ever sent as a header."""
    return os.environ.get(config.api_key_env) or None


def _headers(config: OpenAIConfig) -> dict[str, str]:
    key = api_key(config)
    return {"Authorization": f"Bearer {key}"} if key else {}


def _get(config: OpenAIConfig, path: str, *, root: bool = False) -> Any:
    """One GET (a start-up question): the response, or ServerUnavailable in one line."""
    httpx = _httpx()
    base = _check_url(config.base_url)
    url = (_root(base) if root else base) + path
    try:
        # start-up questions fail fast: a server that does not answer in 10 s is not there
        return httpx.get(url, headers=_headers(config), timeout=min(config.request_timeout, 10.0))
    except httpx.HTTPError as exc:
        raise ServerUnavailable(
            f"no OpenAI-compatible server answers at {base}: {type(exc).__name__}: "
            f"{one_line(str(exc)) or 'no reply'}"
        ) from None


def served_models(config: OpenAIConfig) -> list[Body]:
    """The server's ``/v1/models`` entries (vLLM's carry ``max_model_len``)."""
    response = _get(config, "/models")
    if response.status_code in (401, 403):
        raise ServerUnavailable(
            f"{config.base_url}/models: HTTP {response.status_code}: the server wants an API "
            f"key: set it in ${config.api_key_env} (or name another variable with --api-key-env)"
        )
    try:
        response.raise_for_status()
        models = response.json()["data"]
        assert isinstance(models, list)
    except Exception as exc:
        raise ServerUnavailable(f"{config.base_url}/models: not an OpenAI-compatible model list "
                                f"(HTTP {response.status_code}): {one_line(str(exc))}") from None
    return [m for m in models if isinstance(m, dict) and isinstance(m.get("id"), str)]


def resolve_served_model(config: OpenAIConfig, model: str | None,
                         models: list[Body] | None = None) -> str:
    """The id of the model to grade with, as the server serves it (``models``: its
    :func:`served_models`, asked here when not given): ``--model``, which must be served, or
    without it (or ``auto``) the one model served; never a guess among several."""
    ids: list[str] = [m["id"] for m in (served_models(config) if models is None else models)]
    if not ids:  # no --model can help: the server must be started with one
        named = "" if model in (None, "", "auto") else f"--model {model}: "
        raise ServedModelError(
            f"{named}the server at {config.base_url} serves no model ({config.base_url}/models "
            "lists none): start it with the judge's model"
        )
    if model in (None, "", "auto"):
        if len(ids) == 1:
            return ids[0]
        raise ServedModelError(f"the server at {config.base_url} serves {len(ids)} models "
                               f"({', '.join(ids)}): choose one with --model")
    if model not in ids:
        raise ServedModelError(
            f"--model {model}: the server at {config.base_url} serves "
            f"{', '.join(ids)}; --model is the served name with --backend openai"
        )
    return model


def _is_vllm(config: OpenAIConfig) -> str | None:
    """vLLM's version where the server is vLLM (GET /version answers ``{"version": ...}``)."""
    try:
        response = _get(config, "/version", root=True)
        version = response.json().get("version") if response.status_code == 200 else None
    except Exception:  # another server: /version is vLLM's own
        return None
    return version if isinstance(version, str) else None


@dataclasses.dataclass
class _Failure(Exception):
    """A request that ended without an answer; ``retry``: worth sending again."""

    reason: str
    retry: bool
    failure: Status = Status.ENGINE_ERROR


class OpenAIBackend(Backend):
    """One row, one chat-completions request; ``max_concurrency`` of them in flight."""

    name = "openai"
    settings = OpenAIConfig
    # a stop rule is sent to a vLLM server (repetition_detection); others run the row to its end
    supports_stop = True
    supports_logprobs = True
    supports_thinking = True  # a reasoning server returns the thinking apart

    config: OpenAIConfig

    @classmethod
    def default_chunk_size(cls, settings: BackendSettings) -> int:
        """--chunk-size, else four requests per connection the server may hold at once."""
        assert isinstance(settings, OpenAIConfig)
        return settings.chunk_size or 4 * settings.max_concurrency

    def _load(self, model: str) -> None:
        """Ask the server what it serves, check it forces a schema (one probe request), and
        choose how prompt tokens are counted; ServerUnavailable where no usable server answers."""
        self.base_url = _check_url(self.config.base_url)
        self.chunk_size = self.default_chunk_size(self.config)
        models = served_models(self.config)
        self.model = resolve_served_model(self.config, model, models)
        self.vllm_version = _is_vllm(self.config)
        self.max_model_len, len_problem = _served_length(
            {m["id"]: m for m in models}.get(self.model, {}))
        if self.config.tokenizer:
            from grader.backends.chat import ChatFormatter, load_tokenizer

            self.formatter = ChatFormatter(
                load_tokenizer(self.config.tokenizer), self.config.chat_template_kwargs
            )
        self.token_count, why_off = self._choose_counting()
        if self.token_count is not None and self.max_model_len is not None:
            self.context_length = self.max_model_len  # the pipeline's token budget is on
        elif why_off is None:
            why_off = len_problem
        self.budget_off = why_off
        if why_off:
            log.warning("openai: the token budget check is off: %s", why_off)
        self._check_grammar_forced()

    # --- what the server is asked -------------------------------------------------------------

    def _body(self, messages: list[Message], schema: JSONSchema, max_tokens: int,
              stop: LoopStop | None = None) -> Body:
        body: Body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "n": self.samples,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "seed": self.sampling.seed,
            # the standard field, which vLLM turns into its own (vllm_compat, "server")
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": schema, "strict": True},
            },
        }
        if self.sampling.top_k:
            body["top_k"] = self.sampling.top_k  # not OpenAI's; vLLM, SGLang and llama.cpp take it
        if self.sampling.logprobs is not None:
            body["logprobs"] = True
            body["top_logprobs"] = self.sampling.logprobs
        if self.config.chat_template_kwargs:
            body["chat_template_kwargs"] = dict(self.config.chat_template_kwargs)
        if self.vllm_version is not None:
            # vLLM's own request fields (vllm_compat, "server"): the same schema, the bytes the
            # grammar approved (vllm_backend.build_sampling_params), the stop rule (elsewhere
            # the row runs to its end and the caller reads it by the rule)
            body["structured_outputs"] = {"json": schema}
            body["skip_special_tokens"] = False
            if stop is not None:
                body["repetition_detection"] = stop.pattern()
        return body

    def body(self, request: GenerateRequest) -> Body:
        """The chat-completions body of ``request``: its schema, else the run's."""
        schema = self.schema if request.schema is None else request.schema
        return self._body(self.messages(request.messages), schema, self.max_tokens, request.stop)

    def _choose_counting(self) -> tuple[str | None, str | None]:
        """How prompt tokens are counted: ``("server", None)``, ``("tokenizer", None)``, or
        ``(None, why it is off)``."""
        if self.vllm_version is not None:
            return "server", None  # vLLM's POST /tokenize with the messages
        if self.formatter is not None:
            return "tokenizer", None
        return None, "the server has no /tokenize and no --tokenizer DIR was given"

    def describe(self) -> dict[str, object]:
        # The key's variable is named, never its value.
        return {
            "backend": self.name,
            "base_url": self.base_url,
            "served_model": self.model,
            "server": {"vllm": self.vllm_version} if self.vllm_version else None,
            "max_model_len": self.max_model_len,
            "api_key_env": self.config.api_key_env,
            "api_key_sent": api_key(self.config) is not None,
            "max_concurrency": self.config.max_concurrency,
            "request_timeout": self.config.request_timeout,
            "retries": self.config.retries,
            "chunk_size": self.chunk_size,
            "structured_outputs": ["response_format"]
            + (["structured_outputs"] if self.vllm_version else []),
            "token_count": self.token_count or f"off: {self.budget_off}",
            "tokenizer": self.config.tokenizer,
            "chat_template_kwargs": dict(self.config.chat_template_kwargs),
            "sampling": self.sampling.to_vllm_kwargs(self.max_tokens),
        }

    # --- the pipeline's calls ---------------------------------------------------------------------

    def messages(self, conversation: Sequence[Message]) -> list[Message]:
        """As in process where a --tokenizer is given (ChatFormatter.messages); else as rendered."""
        if self.formatter is not None:
            return self.formatter.messages(conversation)
        return [dict(m) for m in conversation]

    def count_tokens(self, conversations: Sequence[list[Message]]) -> list[int]:
        if self.token_count == "tokenizer":
            return super().count_tokens(conversations)
        return asyncio.run(self._count_all([self.messages(c) for c in conversations]))

    def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """One completion per request and sample, in input order."""
        # the pipeline's thread runs no event loop: each call runs its own
        answers = asyncio.run(self._generate_all([self.body(r) for r in requests]))
        return [completion for row in answers for completion in row]

    # --- traffic ----------------------------------------------------------------------------------

    def _client(self) -> Any:
        httpx = _httpx()
        limit = self.config.max_concurrency
        return httpx.AsyncClient(
            base_url=_root(self.base_url), headers=_headers(self.config),
            timeout=self.config.request_timeout,
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit))

    async def _generate_all(self, bodies: list[Body]) -> list[list[Completion]]:
        gate = asyncio.Semaphore(self.config.max_concurrency)
        async with self._client() as client:

            async def one(body: Body) -> list[Completion]:
                async with gate:
                    try:
                        reply = await self._post(client, self._path("/chat/completions"), body)
                    except _Failure as failed:
                        error = Completion("", "error", error=failed.reason, failure=failed.failure)
                        return [error] * self.samples
                    return self._completions(reply)

            return list(await asyncio.gather(*(one(b) for b in bodies)))

    async def _count_all(self, conversations: list[list[Message]]) -> list[int]:
        gate = asyncio.Semaphore(self.config.max_concurrency)
        async with self._client() as client:

            async def one(messages: list[Message]) -> int:
                body: Body = {"model": self.model, "messages": messages,
                              "add_generation_prompt": True}
                if self.config.chat_template_kwargs:
                    body["chat_template_kwargs"] = dict(self.config.chat_template_kwargs)
                async with gate:
                    try:
                        reply = await self._post(client, "/tokenize", body)
                    except _Failure as failed:
                        # grade_chunk fails this row alone (engine_error) when it cannot count
                        raise RuntimeError(f"the server's /tokenize: {failed.reason}") from None
                try:
                    return msgspec.convert(reply, _Tokenized).count
                except msgspec.ValidationError as exc:
                    raise ServerAnswerError(
                        f"the server's /tokenize answer is not a token count: {exc}") from None

            return list(await asyncio.gather(*(one(c) for c in conversations)))

    def _path(self, path: str) -> str:
        return self.base_url[len(_root(self.base_url)):] + path

    async def _post(self, client: Any, path: str, body: Body) -> Any:
        """POST with retries after a connection error, a 429 or a 5xx (exponential backoff,
        ``retries`` at most); never after an answer came back."""
        httpx = _httpx()
        attempt = 0
        while True:
            try:
                response = await client.post(path, json=body)
            except httpx.TimeoutException as exc:
                # a connection that never opened is retried; an answer that took the whole
                # timeout would take it again
                retry = isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout))
                failed = _Failure(
                    f"no answer within --request-timeout {self.config.request_timeout:g} s "
                    f"({type(exc).__name__})" if not retry else
                    f"could not connect to {self.base_url}: {type(exc).__name__}", retry)
            except httpx.TransportError as exc:  # refused, reset, closed mid-answer
                failed = _Failure(
                    f"connection to {self.base_url} failed: {type(exc).__name__}: "
                    f"{one_line(str(exc)) or 'no reply'}", True)
            else:
                if response.status_code == 200:
                    try:
                        return response.json()
                    except ValueError:
                        raise _Failure("the server's answer is not JSON", False) from None
                failed = _http_failure(response)
            if not failed.retry or attempt >= self.config.retries:
                if failed.retry and attempt:
                    failed.reason += f" (after {attempt} retries)"
                raise failed
            delay = min(_BACKOFF_S * 2**attempt, _BACKOFF_MAX_S)
            await asyncio.sleep(delay * (0.5 + random.random() / 2))  # jitter: no stampede
            attempt += 1

    # --- answers -> Completions -------------------------------------------------------------------

    def _completions(self, reply: Any) -> list[Completion]:
        try:
            answer = _chat_completion(reply)
        except ServerAnswerError as exc:
            # the server's failure, not the row's: engine_error, sent again on a rerun
            return [Completion("", "error", error=str(exc))] * self.samples
        choices = sorted(answer.choices, key=lambda c: c.index)
        usage = answer.usage or _Usage()
        prompt_tokens = usage.prompt_tokens
        if len(choices) != self.samples:
            error = Completion(
                "", "error", prompt_tokens,
                error=f"the server returned {len(choices)} choices for n={self.samples}",
            )
            return [error] * self.samples
        # usage counts every choice's tokens; per choice only where there is one
        one = self.samples == 1
        total = usage.completion_tokens if one else None
        details = usage.completion_tokens_details
        thought = details.reasoning_tokens if one and details is not None else None
        return [self._completion(c, prompt_tokens, total, thought) for c in choices]

    def _completion(self, choice: _Choice, prompt_tokens: int | None, output_tokens: int | None,
                    reasoning_tokens: int | None = None) -> Completion:
        message = choice.message or _Message()
        text = message.content or ""
        logprobs = choice.logprobs.content if choice.logprobs is not None else None
        if output_tokens is None and logprobs is not None:
            output_tokens = len(logprobs)
        completion = ended_completion(choice.finish_reason, text, prompt_tokens, output_tokens,
                                      self.max_tokens, self.max_model_len, "the server")
        # "reasoning" in vLLM, "reasoning_content" in SGLang, older vLLM (vllm_compat, "thinking")
        reasoning = message.reasoning
        if reasoning is None:
            reasoning = message.reasoning_content
        if reasoning is not None:
            completion = dataclasses.replace(
                completion, reasoning=reasoning, reasoning_tokens=reasoning_tokens
            )
        if self.sampling.logprobs is not None:
            completion = _with_logprobs(completion, logprobs, text)
        return completion

    # --- the start-up check -----------------------------------------------------------------------

    def _check_grammar_forced(self) -> None:
        """One request under a schema a free answer would not match: a server that does not
        force it would leave every row's answer unforced, so grader stops here."""
        probe = [{"role": "user", "content": "Say hello in one word."}]
        body = self._body(self.messages(probe), PROBE_SCHEMA, _PROBE_TOKENS)
        body.update(n=1, temperature=0.0)
        body.pop("logprobs", None)
        body.pop("top_logprobs", None)

        async def ask() -> Any:
            async with self._client() as client:
                return await self._post(client, self._path("/chat/completions"), body)

        try:
            answer = _chat_completion(asyncio.run(ask()))
        except _Failure as failed:
            raise ServerUnavailable(
                f"the server at {self.base_url} refused a request under a JSON schema "
                f"(response_format json_schema): {failed.reason}"
            ) from None
        except ServerAnswerError as exc:
            raise ServerUnavailable(f"the server at {self.base_url} answered the schema probe "
                                    f"(one request under a JSON schema): {exc}") from None
        message = answer.choices[0].message if answer.choices else None
        content = (message.content if message is not None else None) or ""
        try:
            forced = json.loads(content) == {"probe": _PROBE_VALUE}
        except ValueError:
            forced = False
        if not forced:
            raise ServerUnavailable(
                f"the server at {self.base_url} does not force the JSON schema: a request "
                f"whose schema allows only {{\"probe\": \"{_PROBE_VALUE}\"}} was answered "
                f"{content[:60]!r}; grader needs a server with structured outputs "
                "(response_format json_schema), e.g. vllm serve"
            )


def _served_length(model: Body) -> tuple[int | None, str]:
    """The served model's context length, from vLLM's /v1/models entry (``max_model_len``), and
    why the token budget is off without one; a value that is no positive int is not believed."""
    if "max_model_len" not in model or model["max_model_len"] is None:
        return None, "the server does not say its context length (no max_model_len)"
    served = model["max_model_len"]
    if type(served) is int and served > 0:  # not a bool: True is an int to isinstance
        return served, ""
    return None, f"the server's max_model_len {served!r} is not a positive number of tokens"


def _http_failure(response: Any) -> _Failure:
    """What an HTTP error means for the row: retried (429, 5xx) or final (its reason)."""
    status = response.status_code
    try:
        detail = response.json()
        detail = (detail.get("error") or {}).get("message") if isinstance(
            detail.get("error"), dict) else detail.get("error") or detail.get("message") or detail
    except Exception:
        detail = response.text
    message = f"HTTP {status} from the server: {one_line(detail)[:500]}"
    retry = status == 429 or status >= 500
    # vLLM answers an overlong prompt with 400: the row would not fit on a rerun either
    return _Failure(message, retry, refused_status(message) if status == 400 else Status.ENGINE_ERROR)


def _with_logprobs(completion: Completion, content: list[_Step] | None, text: str) -> Completion:
    """``completion`` with each answer token's text and its step's top-k log-probabilities, as
    in process (vllm_backend._with_logprobs), -inf read back from -9999. With a reasoning
    server the list may cover the thinking too: the answer's tokens are the last ones, those
    that spell ``text``.
    """
    if not content:
        return dataclasses.replace(completion, tokens=(), top_logprobs=())  # the judge says so
    tokens: list[str] = []
    top: list[dict[str, float]] = []
    for step in content:
        merged = merged_top((c.token, _logprob(c.logprob)) for c in step.top_logprobs or [])
        sampled = step.token
        merged.setdefault(sampled, _logprob(step.logprob))
        tokens.append(sampled)
        top.append(merged)
    if completion.reasoning is not None and "".join(tokens) != text:
        spelled = ""
        start = len(tokens)
        while start > 0 and len(spelled) < len(text):
            start -= 1
            spelled = tokens[start] + spelled
        if spelled != text:  # the tokens do not spell the answer: no confidence, said so
            return dataclasses.replace(completion, tokens=(), top_logprobs=())
        tokens, top = tokens[start:], top[start:]
    return dataclasses.replace(completion, tokens=tuple(tokens), top_logprobs=tuple(top))


def _logprob(value: float | None) -> float:
    if value is None or value <= _NEG_INF_LOGPROB:
        return -math.inf
    return min(value, 0.0)  # at most _LOGPROB_ROUNDING above 0 (_LogProb): rounding

