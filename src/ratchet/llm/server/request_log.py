"""The request log and the billing counters derived from it.

Every model request ends in one entry: kept in memory and, when a file is given, appended
to it as one JSON line at once (a harness may read the file while the server runs). An
entry holds what the request was and what it cost, never its headers: API keys and
``Authorization`` values are neither logged nor stored.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from ratchet.errors import ConfigError

#: The fields of an entry, in the order they are written.
FIELDS = (
    "at",
    "path",
    "endpoint",
    "model",
    "idempotency_key",
    "status",
    "billed",
    "replayed",
    "input_tokens",
    "output_tokens",
    "fault",
    "request_id",
)
COUNTERS = (
    "received",
    "requests",
    "billed_calls",
    "billed_input_tokens",
    "billed_output_tokens",
    "replayed",
    "refused",
    "faults",
)


class RequestLog:
    """Entries and counters, thread-safe (the server writes, tests read)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            try:
                self.path.open("a", encoding="utf-8").close()
            except OSError as e:
                raise ConfigError(
                    f"cannot write the request log {str(self.path)!r}: {e.strerror or e}"
                ) from e
        self._lock = threading.Lock()
        self._entries: list[dict[str, Any]] = []
        self._counts = dict.fromkeys(COUNTERS, 0)

    def received(self) -> None:
        """Count a request that has arrived whole, before it is answered."""
        with self._lock:
            self._counts["received"] += 1

    def record(self, entry: dict[str, Any]) -> None:
        """Log a request's outcome and bill it if ``entry["billed"]``."""
        line = {name: entry.get(name) for name in FIELDS}
        with self._lock:
            self._entries.append(line)
            c = self._counts
            c["requests"] += 1
            if line["billed"]:
                c["billed_calls"] += 1
                c["billed_input_tokens"] += line["input_tokens"] or 0
                c["billed_output_tokens"] += line["output_tokens"] or 0
            if line["replayed"]:
                c["replayed"] += 1
            if line["fault"] is not None:
                c["faults"] += 1
            elif isinstance(line["status"], int) and 400 <= line["status"] < 500:
                c["refused"] += 1
            if self.path is not None:
                # Opened per line: nothing stays open for a test to leak, and each line is
                # on disk before the response goes out.
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(line, ensure_ascii=False) + "\n")

    def stats(self) -> dict[str, int]:
        """The counters: received, requests, billed calls and tokens, replayed, refused,
        faults."""
        with self._lock:
            return dict(self._counts)

    def entries(self) -> list[dict[str, Any]]:
        """Every entry so far, oldest first (copies)."""
        with self._lock:
            return [dict(e) for e in self._entries]

    def reset(self) -> None:
        """Forget the entries and zero the counters (the file keeps its lines)."""
        with self._lock:
            self._entries.clear()
            self._counts = dict.fromkeys(COUNTERS, 0)
