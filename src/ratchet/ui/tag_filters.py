"""The runs list's tag filters: ``?tag=key=value``, repeatable (a run must have all of
them), as chips a person removes with a click, and each run's tags as chips that add
their filter."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from ratchet.errors import InvalidInput
from ratchet.names import MAX_TAGS, parse_tag


def parse(given: list[str] | None) -> tuple[dict[str, str], str | None]:
    """The tag filters asked for, and the problem with the first bad one (None: none);
    a blank one (the empty "add a tag" field) is no filter."""
    tags: dict[str, str] = {}
    for text in given or []:
        text = text.strip()
        if not text:
            continue
        try:
            key, value = parse_tag(text)
        except InvalidInput as e:
            return tags, str(e)
        if tags.setdefault(key, value) != value:
            return tags, f"tag {key!r} is asked for twice with different values"
        if len(tags) > MAX_TAGS:
            return tags, f"over {MAX_TAGS} tag filters: no run has that many tags"
    return tags, None


def url(filters: dict[str, Any]) -> str:
    """The runs list with ``filters`` (a tag filter is a list of ``key=value``)."""
    return f"/runs?{urlencode(filters, doseq=True)}"


def removing(filters: dict[str, Any]) -> list[dict[str, str]]:
    """A chip per active tag filter: its text and the list without it."""
    active: list[str] = filters.get("tag", [])
    return [
        {"text": t, "url": url(filters | {"tag": [x for x in active if x != t]})} for t in active
    ]


def adding(filters: dict[str, Any], tags: dict[str, str]) -> list[dict[str, str]]:
    """A chip per tag of a run: its text and the list filtered by it too."""
    active: list[str] = filters.get("tag", [])
    chips = []
    for key, value in sorted(tags.items()):
        text = f"{key}={value}"
        more = active if text in active else [*active, text]
        chips.append({"text": text, "url": url(filters | {"tag": more})})
    return chips
