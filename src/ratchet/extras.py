"""Optional dependencies: which extra brings which modules, and the one line that says
which extra to install when a feature needs one that is missing.

The core (SQLite, the CLI, workflows and steps) imports none of these modules; each
feature that needs one calls :func:`require` where it is first used, so a missing extra is
reported as ``<feature> needs ... pip install 'ratchet-engine[<extra>]'`` instead of an
ImportError traceback from deep inside the package (with the clone's folder or the wheel
instead of the name when the package was installed from one).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import urllib.parse

from ratchet.errors import MissingExtra

DISTRIBUTION = "ratchet-engine"

# The top-level modules each extra installs (pyproject.toml's optional-dependencies).
EXTRAS: dict[str, tuple[str, ...]] = {
    "postgres": ("psycopg", "psycopg_pool"),
    "server": ("starlette", "uvicorn", "fastapi", "prometheus_client"),
    "openai": ("openai",),
    "anthropic": ("anthropic",),
    "pydantic-ai": ("pydantic_ai",),
    "otel": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
}


def install_line(*extras: str) -> str:
    """``pip install 'ratchet-engine[a,b]'``; for a copy installed from a clone or a wheel
    file (until a release is on PyPI, the only ways to install it), the line that installs
    the extras from the same place: ``pip install -e '/src/ratchet[a,b]'``."""
    wanted = f"[{','.join(extras)}]"
    source = installed_from()
    if source is None:
        return f"pip install '{DISTRIBUTION}{wanted}'"
    path, editable = source
    return f"pip install {'-e ' if editable else ''}'{path}{wanted}'"


def installed_from() -> tuple[str, bool] | None:
    """Where this copy was installed from, when it was a local folder or file (PEP 610's
    ``direct_url.json``): (its path, whether editable); None for an index (PyPI)."""
    try:
        text = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        info = json.loads(text or "null")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    url = info.get("url") if isinstance(info, dict) else None
    if not isinstance(url, str) or not url.startswith("file://"):
        return None
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    return path, bool((info.get("dir_info") or {}).get("editable"))


def _failure(module: str) -> str | None:
    """Why ``module`` cannot be imported (the first line of the error), or None if it can."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        lines = str(e).strip().splitlines()
        return lines[0] if lines else f"no module named {module!r}"
    return None


def require(feature: str, *extras: str) -> None:
    """Raise :class:`MissingExtra` naming every extra in ``extras`` whose modules do not
    import, for ``feature`` (``"a postgresql:// database"``); return if all import."""
    missing: list[str] = []
    reasons: list[str] = []
    for extra in extras:
        for module in EXTRAS[extra]:
            reason = _failure(module)
            if reason is not None:
                missing.append(extra)
                reasons.append(reason)
                break
    if missing:
        names = " and ".join(missing)
        noun = "extra" if len(missing) == 1 else "extras"
        raise MissingExtra(
            f"{feature} needs the {names} {noun}: {install_line(*missing)} ({'; '.join(reasons)})"
        )
