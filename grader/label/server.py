"""The labeling page's server: the standard library's threaded HTTP server on 127.0.0.1.

Every request must carry the session's token (``?token=...``, printed in the URL), else 403.
The page is one self-contained HTML file; it reads rows and gives labels through three JSON
calls:

- ``GET /api/state``: progress, the next row to label, the current interval;
- ``GET /api/row?position=P``: the row at position P of the order (the judge's verdict only
  once the row is labeled);
- ``POST /api/label`` ``{"position": P, "human": 0-5 | null, "note": "..."}``: a score, or a
  skip (``human`` null), on disk before the answer comes back.
"""

from __future__ import annotations

import errno
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from functools import cache
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from grader.errors import GraderError
from grader.label.estimate import warm_up
from grader.label.session import LabelError, Session, StateView, open_session

if TYPE_CHECKING:
    import jinja2

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
MAX_BODY = 1 << 20  # a label with its note; anything larger is not one


class PortInUse(GraderError):
    """``--port`` names a port another program listens on (bad input, exit 2)."""


class LabelServer(ThreadingHTTPServer):
    """The HTTP server of one session, bound when made; :attr:`url` is the page's address."""

    daemon_threads = True  # a tab left open does not keep the command from exiting
    # No SO_REUSEPORT, whatever the Python: with it a second server binds the same port and
    # gets some of the page's requests (Python 3.14.0a2's HTTPServer set it: python/cpython#127319).
    allow_reuse_port = False
    session: Session

    def __init__(self, port: int = 0, token: str | None = None):
        self.token = token or secrets.token_urlsafe(24)
        try:
            super().__init__((HOST, port), _Handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"--port {port}: in use by another program: choose another "
                                "port, or leave --port out for a free one") from None
            raise

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/?token={self.token}"

    def serve(self, session: Session, *, open_browser: bool = True) -> None:
        """Serve ``session``'s page until Ctrl-C (or SIGTERM); the URL is :attr:`url`."""
        self.session = session
        warm_up()
        try:
            if open_browser:
                import webbrowser

                webbrowser.open(self.url)
            self.serve_forever(poll_interval=0.2)
        finally:
            self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: LabelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("label page: " + format, *args)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        if not self._authorized(query):
            return
        session = self.server.session
        if parts.path == "/":
            page = _render_page(self.server.token, session)
            self._send(HTTPStatus.OK, page.encode("utf-8"), "text/html; charset=utf-8")
        elif parts.path == "/api/state":
            self._json(HTTPStatus.OK, session.state())
        elif parts.path == "/api/row":
            try:
                position = int(query.get("position", [""])[0])
                self._json(HTTPStatus.OK, session.row(position))
            except (ValueError, LabelError) as exc:
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no {parts.path} here"})

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        if not self._authorized(parse_qs(parts.query)):
            return
        if parts.path != "/api/label":
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no {parts.path} here"})
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
            if not 0 < length <= MAX_BODY:
                raise LabelError(f"a label is a JSON object of at most {MAX_BODY} bytes")
            body = json.loads(self.rfile.read(length))
            if not isinstance(body, dict):
                raise LabelError("a label is a JSON object")
            note = body.get("note")
            if note is not None and not isinstance(note, str):
                raise LabelError("a note is text")
            answer = self.server.session.label(body.get("position", -1), body.get("human"), note)
        except (ValueError, LabelError) as exc:  # json's errors are ValueErrors
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            return
        except GraderError as exc:  # the labels file cannot be written (a full disk)
            logger.error("error: %s", exc)
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": str(exc)})
            return
        self._json(HTTPStatus.OK, answer)

    def _authorized(self, query: dict[str, list[str]]) -> bool:
        given = query.get("token", [""])[0]
        if secrets.compare_digest(given.encode(), self.server.token.encode()):
            return True
        self._send(HTTPStatus.FORBIDDEN, b"forbidden: this page needs the token of the URL "
                   b"grader label printed\n", "text/plain; charset=utf-8")
        return False

    def _json(self, status: HTTPStatus, value: Any) -> None:
        self._send(status, json.dumps(value, ensure_ascii=False).encode("utf-8"),
                   "application/json; charset=utf-8")

    def _send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        # nothing but this page's own inline style and script, and calls to this server
        self.send_header("Content-Security-Policy", "default-src 'none'; connect-src 'self'; "
                         "style-src 'unsafe-inline'; script-src 'unsafe-inline'")
        self.send_header("Referrer-Policy", "no-referrer")  # the token stays on this page
        self.end_headers()
        self.wfile.write(body)


def serve_labels(results: Path, output: Path, *, data: str | None = None,
                 mapping: Mapping[str, str] | None = None, id_column: str | None = None,
                 seed: int | None = None, sample: int | None = None, overwrite: bool = False,
                 port: int = 0, open_browser: bool = True,
                 announce: Callable[[str], Any] = print) -> StateView:
    """``grader label``: bind the port, open the session, serve the page until Ctrl-C, and
    return the session's final state; ``announce`` gets where the labels stand, and the URL."""
    server = LabelServer(port)  # a port in use stops here, before the labels file is touched
    try:
        session = open_session(results, output, data=data, mapping=mapping,
                               id_column=id_column, seed=seed, sample=sample,
                               overwrite=overwrite)
    except BaseException:
        server.server_close()
        raise
    try:
        state = session.state()
        announce(f"{output}: {state['labeled']} labeled, {state['skipped']} skipped of "
                 f"{state['total']} rows (seed {session.header.seed}); Ctrl-C stops, the "
                 "same command goes on")
        announce(f"labeling page: {server.url}")
        server.serve(session, open_browser=open_browser)
    except KeyboardInterrupt:
        pass  # the way to stop a server: every label is on disk already
    finally:
        state = session.state()
        session.close()
    return state


@cache
def _environment() -> jinja2.Environment:
    # Our own template (grader/label/templates/), autoescaped; the rows' text never goes
    # through it: the page's script sets it as text (textContent) from the JSON calls.
    from grader.analysis.report.page import page_environment

    return page_environment("grader.label")


def _render_page(token: str, session: Session) -> str:
    template = _environment().get_template("page.html.j2")
    return template.render(token=token, results=session.header.results,
                           labels=str(session.path), total=len(session.order))
