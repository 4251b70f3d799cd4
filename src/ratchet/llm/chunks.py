"""A stream's chunks as the journal keeps them: small, and given back the same.

A streamed answer is journaled as the response it assembles into (the body a call without
``stream=True`` would have returned) plus what it takes to cut that body back into the
chunks the stream brought, boundary for boundary. A chunk's text pieces are pieces of the
body's texts, in order, so they are kept as lengths; parts of a chunk equal to a part of the
body (a "done" event repeating a finished item, say) are kept as where that part is. What
is left of a chunk is its *shape*, and the chunks of one shape in a row are one *run*: its
shape's number, how many, and their lengths. A chat answer of 1,000 chunks is a few bytes a
chunk beside its body, not 1,000 chunk objects.

Which fields are text pieces, and of which body text, is the endpoint's to say (``texts``);
each claim is checked against the body (the pieces must join to exactly that text), and a
text whose pieces do not is kept as it came, so an odd stream costs bytes, never fidelity.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

Path = tuple[str | int, ...]
Texts = Callable[[dict[str, Any]], Iterable[tuple[Path, Path]]]
"""For one chunk: each of its text pieces (where it is in the chunk) and the body text it
continues (where that is in the body)."""

# Parts of a chunk this long or longer (as JSON) that equal a part of the body are kept as
# where that part is; shorter ones are cheaper kept as they are.
_SAME_MIN_CHARS = 32


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def get(value: Any, path: Sequence[str | int]) -> Any:
    """What is at ``path`` in ``value`` (None where nothing is)."""
    for key in path:
        if isinstance(value, dict) and isinstance(key, str):
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int) and 0 <= key < len(value):
            value = value[key]
        else:
            return None
    return value


def _set(value: Any, path: Sequence[str | int], item: Any) -> None:
    for key in path[:-1]:
        value = value[key]
    value[path[-1]] = item


def encode(
    chunks: Sequence[dict[str, Any]],
    body: dict[str, Any],
    texts: Texts,
    counters: Sequence[Path] = (),
) -> dict[str, Any]:
    """The journal's form of ``chunks`` (JSON objects, in stream order) against ``body``.
    ``counters`` are fields that count the chunks (a ``sequence_number``): where one equals
    the chunk's position it is not kept."""
    pieces: list[list[tuple[Path, Path, str]]] = []
    joined: dict[Path, list[str]] = {}
    for chunk in chunks:
        found = []
        for where, of in texts(chunk):
            text = get(chunk, where)
            if isinstance(text, str):
                found.append((where, of, text))
                joined.setdefault(of, []).append(text)
        pieces.append(found)
    # A body text is cut into lengths only if its pieces join to exactly that text.
    cuttable = {
        of
        for of, parts in joined.items()
        if "".join(parts) == (get(body, of) or "") and isinstance(get(body, of) or "", str)
    }
    same = _index(body)
    shapes: list[dict[str, Any]] = []
    numbers: dict[str, int] = {}
    runs: list[list[Any]] = []
    for position, (chunk, found) in enumerate(zip(chunks, pieces, strict=True)):
        skeleton = json.loads(_dumps(chunk))
        cut: list[list[Any]] = []
        lengths: list[int] = []
        for where, of, text in found:
            if of in cuttable:
                _set(skeleton, where, None)
                cut.append([list(where), list(of)])
                lengths.append(len(text))
        holes = {tuple(c[0]) for c in cut}
        shape: dict[str, Any] = {}
        seq = [
            list(p)
            for p in counters
            if get(chunk, p) == position and not isinstance(get(chunk, p), bool)
        ]
        for path in seq:
            _set(skeleton, path, None)
        refs = list(_same_parts(skeleton, same, (), holes))
        for where, _of in refs:
            _set(skeleton, where, None)
        shape["chunk"] = skeleton
        if cut:
            shape["cut"] = cut
        if refs:
            shape["same"] = [[list(w), list(o)] for w, o in refs]
        if seq:
            shape["seq"] = seq
        key = _dumps(shape)
        number = numbers.get(key)
        if number is None:
            number = numbers[key] = len(shapes)
            shapes.append(shape)
        if runs and runs[-1][0] == number:
            runs[-1][1] += 1
            runs[-1].extend(lengths)
        else:
            runs.append([number, 1, *lengths])
    return {"shapes": shapes, "runs": runs}


def _index(body: Any) -> dict[str, Path]:
    """Where each part of ``body`` long enough to be worth naming is, by its JSON."""
    found: dict[str, Path] = {}

    def walk(value: Any, path: Path) -> None:
        if isinstance(value, dict | list | str):
            text = _dumps(value)
            if len(text) >= _SAME_MIN_CHARS:
                found.setdefault(text, path)
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, (*path, key))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, (*path, i))

    walk(body, ())
    return found


def _same_parts(
    value: Any, same: dict[str, Path], path: Path, holes: set[Path]
) -> Iterator[tuple[Path, Path]]:
    """The parts of a chunk equal to a part of the body: (where in the chunk, where in the
    body), outermost first; a part with a text hole in it is not one."""
    if (
        path
        and isinstance(value, dict | list | str)
        and not any(h[: len(path)] == path for h in holes)
    ):
        where = same.get(_dumps(value))
        if where is not None:
            yield path, where
            return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _same_parts(item, same, (*path, key), holes)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _same_parts(item, same, (*path, i), holes)


def decode(encoded: dict[str, Any], body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The chunks :func:`encode` was given, rebuilt from its output and the same body."""
    shapes = [
        (_dumps(s["chunk"]), s.get("cut", ()), s.get("same", ()), s.get("seq", ()))
        for s in encoded["shapes"]
    ]
    same_json: dict[tuple[str | int, ...], str] = {}
    cursors: dict[tuple[str | int, ...], int] = {}
    position = 0
    for run in encoded["runs"]:
        skeleton, cut, refs, seq = shapes[run[0]]
        lengths = iter(run[2:])
        for _ in range(run[1]):
            chunk = json.loads(skeleton)
            for where, of in cut:
                key = tuple(of)
                start = cursors.get(key, 0)
                end = start + next(lengths)
                _set(chunk, where, (get(body, of) or "")[start:end])
                cursors[key] = end
            for where, of in refs:
                key = tuple(of)
                text = same_json.get(key)
                if text is None:
                    text = same_json[key] = _dumps(get(body, of))
                _set(chunk, where, json.loads(text))
            for where in seq:
                _set(chunk, where, position)
            position += 1
            yield chunk
