"""The run's runner around its backend (grader.run.ahead): what a call hears as its rows finish
is passed with the call, and the rows a follow-up starts ahead are kept by the runner, never
by the backend, and answer a later call's identical request."""

from __future__ import annotations

from typing import Any

from conftest import FakeBackend, ListStream

from grader.backends import Completion, GenerateRequest
from grader.run.ahead import Runner, Watch


def _request(text: str) -> GenerateRequest:
    return GenerateRequest([{"role": "user", "content": text}], None)


class Streaming(FakeBackend):
    supports_streaming = True

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.streams: list[ListStream] = []

    def stream(self) -> ListStream:
        self.streams.append(ListStream(self))
        return self.streams[-1]


def _sent(backend: FakeBackend) -> list[str]:
    return [conversation[0]["content"] for call in backend.calls for conversation in call]


def test_rows_started_ahead_answer_a_later_call_and_are_sent_once():
    backend = Streaming()
    runner = Runner(backend)
    ticks: list[int] = []

    def follow_up(conversation: Any, completions: list[Completion]) -> list[GenerateRequest]:
        return [_request(f"{conversation[0]['content']}: check")]

    first = runner.generate([_request("a"), _request("b")], Watch(ticks.append, follow_up))
    assert len(first) == 2 and ticks == [1, 1]
    # the rows started ahead answer the later call, checked or not in between
    later = runner.generate([_request("b: check"), _request("c"), _request("a: check")],
                            Watch(ticks.append))
    assert len(later) == 3 and ticks == [1] * 5
    assert sorted(_sent(backend)) == ["a", "a: check", "b", "b: check", "c"]  # each once
    assert not runner.started and len(backend.streams) == 1  # one stream for the run
    runner.close()


def test_a_follow_up_that_fails_fails_no_row_and_rows_left_ahead_are_aborted_at_close():
    backend = Streaming()
    runner = Runner(backend)

    def failing(conversation: Any, completions: list[Completion]) -> list[GenerateRequest]:
        if conversation[0]["content"] == "a":
            raise ValueError("no check prompt for you")
        return [_request("b: check")]

    assert len(runner.generate([_request("a"), _request("b")], Watch(follow_up=failing))) == 2
    assert list(runner.started.values()) and backend.streams[0].running()
    runner.close()  # the run ends: the row no call asked for is stopped, never sent
    assert not runner.started and not backend.streams[0].running()
    assert _sent(backend) == ["a", "b"]


def test_a_row_started_ahead_that_failed_is_sent_again_in_its_own_call():
    backend = Streaming(replies=["{}", "{}", Completion("", "error", error="engine")])
    runner = Runner(backend)

    def follow_up(conversation: Any, completions: list[Completion]) -> list[GenerateRequest]:
        return [_request("a: check")] if conversation[0]["content"] == "a" else []

    runner.generate([_request("a"), _request("b")], Watch(follow_up=follow_up))
    runner.generate([_request("z")], Watch())  # the row ahead finishes here, failed
    [answer] = runner.generate([_request("a: check")], Watch())
    assert answer.finish_reason == "stop" and _sent(backend).count("a: check") == 2


def test_a_backend_that_does_not_stream_gets_plain_generate_calls():
    backend = FakeBackend()
    runner = Runner(backend)
    ticks: list[int] = []
    started: list[Any] = []

    def follow_up(conversation: Any, completions: list[Completion]) -> list[GenerateRequest]:
        started.append(conversation)
        return [_request("check")]

    assert len(runner.generate([_request("a"), _request("b")],
                               Watch(ticks.append, follow_up))) == 2
    assert backend.calls == [[[{"role": "user", "content": "a"}],
                              [{"role": "user", "content": "b"}]]]
    assert ticks == [] and started == []  # its bar moves per block; nothing starts ahead
