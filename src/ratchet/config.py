"""Configuration from the environment: database URL, lease TTL, recovery interval."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ratchet.errors import ConfigError

log = logging.getLogger("ratchet.config")

DEFAULT_DATABASE_URL = "sqlite:///.ratchet/ratchet.db"
DEFAULT_LEASE_TTL = 15.0
DEFAULT_RECOVERY_INTERVAL = 30.0
# Below this a lease would expire between renewals (every TTL/3) at the first pause of a
# busy worker or database, and runs would change hands for no reason.
MIN_LEASE_TTL = 1.0

# The sign is part of the grammar so that "-5s" is told "must be positive", not "malformed".
_DURATION = re.compile(r"\s*([-+]?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``"500ms"``, ``"30s"``, ``"2m"``, ``"1h"`` or bare seconds → seconds.

    Raises :class:`ConfigError` for anything else, including zero or negative values.
    """
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ConfigError(f"invalid duration {text!r}: expected a number with ms, s, m or h")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ConfigError(f"invalid duration {text!r}: must be positive")
    return seconds


def duration_from_env(name: str, default: float) -> float:
    """A positive duration from ``name``; an invalid value falls back to ``default`` with a
    warning, so a typo cannot switch the mechanism off."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return parse_duration(raw)
    except ConfigError as e:
        log.warning(
            "action=config_fallback name=%s value=%r default=%ss: %s", name, raw, default, e
        )
        return default


@dataclass(frozen=True, slots=True)
class DatabaseURL:
    """A parsed ``RATCHET_DATABASE_URL``."""

    scheme: str  # sqlite | postgresql
    url: str
    path: str = ""  # sqlite only

    @staticmethod
    def parse(url: str) -> DatabaseURL:
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(
                "RATCHET_DATABASE_URL is empty: expected sqlite:///path or postgresql://..."
            )
        url = url.strip()
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme == "sqlite":
            # sqlite:///relative/path and sqlite:////absolute/path, as SQLAlchemy spells them.
            if not url.startswith("sqlite:///") or parts.netloc:
                raise ConfigError(
                    f"malformed database URL {url!r}: a SQLite URL is sqlite:///path/to/file.db"
                )
            path = url[len("sqlite:///") :].split("?", 1)[0]
            if not path or path.endswith("/"):
                raise ConfigError(f"malformed database URL {url!r}: no database file named")
            if "\x00" in path:
                raise ConfigError(f"malformed database URL {url!r}: NUL in the path")
            # sqlite:///~/x.db means the home folder, as in a shell, not a folder named "~".
            return DatabaseURL("sqlite", url, os.path.expanduser(path))
        if scheme in ("postgresql", "postgres"):
            if not parts.hostname and "host=" not in (parts.query or ""):
                raise ConfigError(f"malformed database URL {url!r}: no host named")
            try:
                _ = parts.port
            except ValueError as e:
                raise ConfigError(f"malformed database URL {url!r}: {e}") from e
            return DatabaseURL("postgresql", url)
        raise ConfigError(
            f"malformed database URL {url!r}: scheme {parts.scheme!r} is not sqlite or postgresql"
        )


_DAYS = re.compile(r"\s*(\d+(?:\.\d+)?)\s*d\s*")


def parse_age(text: str) -> float:
    """An age for retention: ``"30d"`` (days), or any :func:`parse_duration` form."""
    match = _DAYS.fullmatch(text)
    if match is None:
        try:
            return parse_duration(text)
        except ConfigError:
            raise ConfigError(
                f"invalid age {text!r}: expected a number with d, h, m, s or ms, e.g. 30d"
            ) from None
    days = float(match.group(1))
    if days <= 0:
        raise ConfigError(f"invalid age {text!r}: must be positive")
    return days * 86400.0


def data_dir(database_url: str) -> Path:
    """Where Ratchet keeps its own files (the receipt signing key): ``RATCHET_DATA_DIR``,
    else the SQLite database's folder, else ``./.ratchet``."""
    configured = os.environ.get("RATCHET_DATA_DIR")
    if configured:
        return Path(configured).expanduser()
    parsed = DatabaseURL.parse(database_url)
    if parsed.scheme == "sqlite":
        return Path(parsed.path).parent
    return Path(".ratchet")


def private_paths(database_url: str) -> list[str]:
    """Ratchet's own files for ``database_url``, which no sandbox may see: the data
    directory (the signing key, the demo's logs) and, for SQLite, the database with its
    ``-wal``, ``-shm`` and ``-journal`` files and its workers' liveness locks
    (``-workers``). Absolute paths."""
    paths = [os.path.abspath(data_dir(database_url))]
    parsed = DatabaseURL.parse(database_url)
    if parsed.scheme == "sqlite":
        db = os.path.abspath(parsed.path)
        paths += [db, f"{db}-wal", f"{db}-shm", f"{db}-journal", f"{db}-workers"]
    return paths


def database_url_from_env() -> str:
    return os.environ.get("RATCHET_DATABASE_URL") or DEFAULT_DATABASE_URL


def lease_ttl_from_env() -> float:
    """``RATCHET_LEASE_TTL``; a value below :data:`MIN_LEASE_TTL` is raised to that floor
    with a warning that names it."""
    ttl = duration_from_env("RATCHET_LEASE_TTL", DEFAULT_LEASE_TTL)
    if ttl < MIN_LEASE_TTL:
        log.warning(
            "action=config_floor name=RATCHET_LEASE_TTL value=%r floor=%gs: "
            "a lease TTL must be at least %gs; using %gs",
            os.environ.get("RATCHET_LEASE_TTL"),
            MIN_LEASE_TTL,
            MIN_LEASE_TTL,
            MIN_LEASE_TTL,
        )
        return MIN_LEASE_TTL
    return ttl


def recovery_interval_from_env() -> float:
    return duration_from_env("RATCHET_RECOVERY_INTERVAL", DEFAULT_RECOVERY_INTERVAL)
