"""The receipt signing key: Ed25519, from ``RATCHET_SIGNING_KEY`` (a PEM file) or made once
under the data directory.

A generated key is written to a private temporary file (mode 0600) and linked into place,
so processes that start together never read half a key, and the first one's key wins.
Every worker that should sign with the same key needs the same file: on many machines,
set ``RATCHET_SIGNING_KEY``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ratchet.errors import ConfigError

KEY_FILE = "signing_key.pem"


def key_id(public: Ed25519PublicKey) -> str:
    """The key's id: sha256 (hex) of its 32 raw public bytes."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def public_pem(public: Ed25519PublicKey) -> str:
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


@dataclass(frozen=True, slots=True)
class Signer:
    """A private key, where it came from, and its public half's id."""

    private: Ed25519PrivateKey
    path: Path
    key_id: str = field(init=False)  # computed once: every receipt names it

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_id", key_id(self.private.public_key()))

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    @property
    def public_pem(self) -> str:
        return public_pem(self.public)

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)


def load_public_key(path: Path) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file (or the public half of a private key PEM)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read public key {str(path)!r}: {e.strerror or e}") from e
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        try:
            key = serialization.load_pem_private_key(data, password=None).public_key()
        except (ValueError, TypeError, UnsupportedAlgorithm) as e:
            raise ConfigError(f"{str(path)!r} is not a PEM public key") from e
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"{str(path)!r} is not an Ed25519 key")
    return key


def _load_private(path: Path, source: str) -> Ed25519PrivateKey:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(
            f"cannot read the signing key {str(path)!r} ({source}): {e.strerror or e}"
        ) from e
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise ConfigError(
            f"the signing key {str(path)!r} ({source}) is not an unencrypted PEM private key: {e}"
        ) from e
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"the signing key {str(path)!r} ({source}) is not an Ed25519 key")
    return key


def _generate(path: Path) -> None:
    """Write a new key to ``path`` unless a file is there already (then keep that one)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the data directory
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd, tmp = tempfile.mkstemp(prefix=".signing_key.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another process made one first
            os.link(tmp, path)
    finally:
        os.unlink(tmp)


def load_signer(data_dir: Path) -> Signer:
    """The signing key: ``RATCHET_SIGNING_KEY`` if set, else ``<data_dir>/signing_key.pem``,
    generated there (mode 0600) the first time."""
    configured = os.environ.get("RATCHET_SIGNING_KEY")
    if configured:
        path = Path(configured).expanduser()
        return Signer(_load_private(path, "RATCHET_SIGNING_KEY"), path)
    path = data_dir / KEY_FILE
    if not path.exists():
        _generate(path)
    return Signer(_load_private(path, "generated"), path)
