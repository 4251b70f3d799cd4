"""OpenAI Embeddings (``POST /v1/embeddings``): a unit vector per input, derived from a
hash of the input and the model, so the same text always gets the same vector.

The SDK asks for ``encoding_format: base64`` unless told otherwise (little-endian float32,
base64-encoded); ``float`` gives JSON numbers.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from dataclasses import dataclass
from typing import Any

from ratchet.llm.server.answer import Answer
from ratchet.llm.server.prompt import (
    BadRequest,
    compact,
    require_model,
    require_object,
    tokens,
)
from ratchet.llm.server.replies import Usage

DEFAULT_DIMENSIONS = 1536
MAX_DIMENSIONS = 8192


@dataclass(frozen=True)
class EmbeddingRequest:
    """An embeddings request, read: the texts to embed and how to send the vectors."""

    model: str
    texts: tuple[str, ...]
    dimensions: int
    base64: bool


def read_embeddings(raw: Any) -> EmbeddingRequest:
    """The embeddings request; refuses a body the API would refuse."""
    body = require_object(raw)
    model = require_model(body)
    given = body.get("input")
    if isinstance(given, str) or (
        isinstance(given, list) and given and all(isinstance(t, int) for t in given)
    ):
        given = [given]  # one text, or one text as token ids
    if not isinstance(given, list) or not given:
        raise BadRequest("'input' is required: a string or a non-empty array of strings", "input")
    texts = tuple(t if isinstance(t, str) else compact(t) for t in given)
    dimensions = body.get("dimensions", DEFAULT_DIMENSIONS)
    if (
        not isinstance(dimensions, int)
        or isinstance(dimensions, bool)
        or not 1 <= dimensions <= MAX_DIMENSIONS
    ):
        raise BadRequest(
            f"'dimensions' must be an integer from 1 to {MAX_DIMENSIONS}", "dimensions"
        )
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be float or base64", "encoding_format")
    return EmbeddingRequest(model, texts, dimensions, encoding == "base64")


def vector(model: str, text: str, dimensions: int) -> list[float]:
    """The unit vector of ``text`` under ``model``: the same for the same inputs."""
    digest = hashlib.shake_256(f"{model}\0{text}".encode()).digest(4 * dimensions)
    raw = [n / 2**31 - 1.0 for n in struct.unpack(f"<{dimensions}I", digest)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    # Rounded through float32, so the float and base64 forms carry the same numbers.
    return list(
        struct.unpack(f"<{dimensions}f", struct.pack(f"<{dimensions}f", *(x / norm for x in raw)))
    )


def render_embeddings(request: EmbeddingRequest) -> Answer:
    """The ``list`` of embeddings, with ``usage.prompt_tokens``."""
    data: list[dict[str, Any]] = []
    for index, text in enumerate(request.texts):
        values = vector(request.model, text, request.dimensions)
        embedding: list[float] | str = values
        if request.base64:
            packed = struct.pack(f"<{len(values)}f", *values)
            embedding = base64.b64encode(packed).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    prompt_tokens = sum(tokens(len(text)) for text in request.texts)
    usage = Usage(input_tokens=prompt_tokens, output_tokens=0)
    body = {
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
    return Answer(usage=usage, body=body)
