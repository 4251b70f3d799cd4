"""The campaign's HTTP receiver: the outside world that deliveries reach.

``python -m chaos.receiver LOG PORT_FILE`` listens on 127.0.0.1 (a port of the kernel's
choosing, written to PORT_FILE once it listens). Each POST is one arrival: it is appended
to LOG as a JSON line and fsynced *before* the answer goes out, so the log holds every
arrival a worker could have seen answered. The receiver applies each ``Idempotency-Key``
once: the first arrival of a key is applied and its answer kept; a later one is a
duplicate and gets the kept answer again, as a receiver that dedupes on the key does.

On start the log is read back, so a restarted receiver still knows what it applied.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class Ledger:
    """The applied keys and the append-only arrival log, behind one lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.applied: dict[str, dict[str, Any]] = {}
        self.arrivals = 0
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a line torn by a crash of this process
                self.arrivals += 1
                if row.get("applied"):
                    self.applied.setdefault(row["key"], row["response"])
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def arrive(
        self, key: str, run: str, step: str, delivery: str, epoch: int | None
    ) -> dict[str, Any]:
        """Record one arrival durably; apply its key if new. The answer to send."""
        with self.lock:
            self.arrivals += 1
            first = key not in self.applied
            if first:
                self.applied[key] = {"key": key, "applied_as": len(self.applied) + 1}
            response = self.applied[key]
            row = {
                "key": key,
                "run": run,
                "step": step,
                "delivery": delivery,
                "epoch": epoch,
                "t": time.time(),
                "arrival": self.arrivals,
                "applied": first,
                "response": response,
            }
            os.write(self.fd, (json.dumps(row, separators=(",", ":")) + "\n").encode())
            os.fsync(self.fd)
            return response


def serve(log: Path, port_file: Path) -> None:
    """Listen until killed."""
    ledger = Ledger(log)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            key = self.headers.get("Idempotency-Key")
            if not key:
                self.send_error(400, "Idempotency-Key required")
                return
            epoch_text = self.headers.get("X-Ratchet-Epoch")
            response = ledger.arrive(
                key,
                self.headers.get("X-Ratchet-Run", ""),
                self.headers.get("X-Ratchet-Step", ""),
                self.headers.get("X-Ratchet-Delivery", ""),
                int(epoch_text) if epoch_text else None,
            )
            body = json.dumps(response).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.replace(port_file)  # the runner never reads a half-written port
    server.serve_forever()


def read_log(path: Path) -> list[dict[str, Any]]:
    """The arrivals in LOG, in order (a torn last line is skipped)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


if __name__ == "__main__":
    serve(Path(sys.argv[1]), Path(sys.argv[2]))
