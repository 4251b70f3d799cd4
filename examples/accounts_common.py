"""What both account examples share: the two tools' code, a webhook receiver standing in
for the team's chat (it keeps one delivery per Idempotency-Key, as a careful receiver
does), and the person who approves the run and reads its journal."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import ratchet
from ratchet.llm.server import LocalProvider


def load_accounts(names: list[str]) -> list[dict[str, Any]]:
    """The accounts to enrich (a CRM query in real life)."""
    return [{"id": i + 1, "name": name} for i, name in enumerate(names)]


def rank_accounts(
    accounts: list[dict[str, Any]], enriched: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Accounts with what the model said about them, biggest first."""
    rows = [{**a, **e} for a, e in zip(accounts, enriched, strict=True)]
    return sorted(rows, key=lambda r: (-r["employees"], r["name"]))


class Receiver:
    """A local webhook endpoint: ``url``; ``deliveries`` by key; ``sends`` counts every
    request, re-sends included."""

    def __init__(self) -> None:
        self.deliveries: dict[str, Any] = {}
        self.sends = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.sends += 1
                receiver.deliveries.setdefault(self.headers["Idempotency-Key"], body)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def approve_and_report(
    app: ratchet.Ratchet, run_id: str, provider: LocalProvider, receiver: Receiver
) -> None:
    """Approve the run's one approval once it is asked, make the provider slow for the
    forecast's first try, and print the result, the journal's steps and the deliveries.
    The first try times out at 3 s; its retry sends the same Idempotency-Key (the outcome
    of a timeout is unknown) and gets the answer the provider was still working on, billed
    once."""
    while not app.approvals(run_id):  # a person would see it in `ratchet approvals`
        time.sleep(0.05)
    (asked,) = app.approvals(run_id)
    print(f"approval asked: {asked.data['top']} first")
    provider.fail("slow", delay_s=4, endpoint="chat")  # the forecast's first try
    app.approve(run_id, asked.step_id, by="ana")
    print(app.result(run_id, timeout_s=60))
    for e in app.events(run_id):
        if e.kind in ("step_completed", "step_retrying", "step_waiting"):
            print(f"{e.seq:>3} {e.kind:<15} {e.step_id}")
    print(f"webhook: {len(receiver.deliveries)} delivery, {receiver.sends} send(s)")
