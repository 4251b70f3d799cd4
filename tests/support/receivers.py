"""Receivers for connector tests, each on a thread and a free port of its own: an HTTP
server that records every request (and can be told to fail the first ones), and a tiny
SMTP server that records every message. Both are context managers."""

from __future__ import annotations

import email
import email.policy
import json
import socketserver
import threading
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class HttpReceiver:
    """``url``: where to send. ``requests``: what arrived (method, path, headers, body).
    ``fail_next(status, times)`` answers the next requests with ``status``; ``on_request``,
    when set, is called with each request before it is answered (a test's probe)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._statuses: list[int] = []
        self._lock = threading.Lock()
        self.on_request: Callable[[dict[str, Any]], None] | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                request = {
                    "method": self.command,
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": json.loads(raw) if raw else None,
                }
                if receiver.on_request is not None:
                    receiver.on_request(request)
                with receiver._lock:
                    receiver.requests.append(request)
                    status = receiver._statuses.pop(0) if receiver._statuses else 200
                    n = len(receiver.requests)
                payload = json.dumps({"received": n, "path": self.path}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test reads ``requests``, not stderr

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def fail_next(self, status: int, times: int = 1) -> None:
        with self._lock:
            self._statuses.extend([status] * times)

    def __enter__(self) -> HttpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class SmtpReceiver:
    """Enough of SMTP for ``smtplib.send_message``: every message lands in ``messages``.
    ``url`` is what ``RATCHET_SMTP_URL`` should say."""

    def __init__(self) -> None:
        self.messages: list[Message] = []  # EmailMessage, parsed by the default policy
        receiver = self

        class Handler(socketserver.StreamRequestHandler):
            def say(self, line: str) -> None:
                self.wfile.write(f"{line}\r\n".encode())

            def handle(self) -> None:
                self.say("220 stub ESMTP")
                while line := self.rfile.readline():
                    command = line.decode(errors="replace").strip().upper()
                    if command.startswith(("EHLO", "HELO")):
                        self.say("250 stub")
                    elif command.startswith(("MAIL", "RCPT", "RSET", "NOOP")):
                        self.say("250 ok")
                    elif command == "DATA":
                        self.say("354 end with <CRLF>.<CRLF>")
                        lines = []
                        while (part := self.rfile.readline()) not in (b".\r\n", b""):
                            lines.append(part[1:] if part.startswith(b"..") else part)
                        receiver.messages.append(
                            email.message_from_bytes(b"".join(lines), policy=email.policy.default)
                        )
                        self.say("250 queued")
                    elif command == "QUIT":
                        self.say("221 bye")
                        return
                    else:
                        self.say("502 not implemented")

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"smtp://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> SmtpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
