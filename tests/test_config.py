"""Configuration parsing: durations, the recovery interval's fallback, database URLs."""

from __future__ import annotations

import logging

import pytest

from ratchet.config import (
    DEFAULT_RECOVERY_INTERVAL,
    MIN_LEASE_TTL,
    DatabaseURL,
    lease_ttl_from_env,
    parse_duration,
    recovery_interval_from_env,
)
from ratchet.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("500ms", 0.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        ("7", 7.0),
    ],
)
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30s", "500ms", "2m"])
def test_recovery_interval_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("RATCHET_RECOVERY_INTERVAL", text)
    assert recovery_interval_from_env() == parse_duration(text)


@pytest.mark.parametrize("text", ["0", "-1s", "abc", "0ms", "1d", "s"])
def test_invalid_recovery_interval_falls_back_to_30s_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    monkeypatch.setenv("RATCHET_RECOVERY_INTERVAL", text)
    with caplog.at_level(logging.WARNING, logger="ratchet.config"):
        assert recovery_interval_from_env() == DEFAULT_RECOVERY_INTERVAL == 30.0
    [record] = caplog.records
    assert "RATCHET_RECOVERY_INTERVAL" in record.getMessage()
    assert repr(text) in record.getMessage()


def test_lease_ttl_defaults_to_15s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RATCHET_LEASE_TTL", raising=False)
    assert lease_ttl_from_env() == 15.0
    monkeypatch.setenv("RATCHET_LEASE_TTL", "2s")
    assert lease_ttl_from_env() == 2.0


def test_database_urls() -> None:
    assert DatabaseURL.parse("sqlite:///.ratchet/ratchet.db").path == ".ratchet/ratchet.db"
    assert DatabaseURL.parse("sqlite:////tmp/x.db").path == "/tmp/x.db"
    assert DatabaseURL.parse("postgresql://u@h:5432/db").scheme == "postgresql"
    with pytest.raises(ConfigError, match="scheme 'mysql' is not sqlite or postgresql"):
        DatabaseURL.parse("mysql://h/db")
    with pytest.raises(ConfigError, match="no host named"):
        DatabaseURL.parse("postgresql:///db")


def test_ratchet_refuses_a_malformed_url_before_opening_anything(tmp_path: object) -> None:
    import ratchet

    with pytest.raises(ratchet.ConfigError, match="malformed database URL 'sqlite:/x.db'"):
        ratchet.Ratchet("sqlite:/x.db")


@pytest.mark.parametrize("text", ["1ms", "999ms", "0.5s"])
def test_a_lease_ttl_below_the_floor_is_raised_to_it_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    monkeypatch.setenv("RATCHET_LEASE_TTL", text)
    with caplog.at_level(logging.WARNING, logger="ratchet.config"):
        assert lease_ttl_from_env() == MIN_LEASE_TTL == 1.0
    [record] = caplog.records
    assert "RATCHET_LEASE_TTL" in record.getMessage() and repr(text) in record.getMessage()
    assert "must be at least 1s" in record.getMessage()


@pytest.mark.parametrize("text", ["-5s", "-1", "-0.5m", "0s"])
def test_a_negative_or_zero_duration_is_told_it_must_be_positive(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    with pytest.raises(ConfigError, match=f"invalid duration {text!r}: must be positive"):
        parse_duration(text)
    monkeypatch.setenv("RATCHET_RECOVERY_INTERVAL", text)
    with caplog.at_level(logging.WARNING, logger="ratchet.config"):
        assert recovery_interval_from_env() == DEFAULT_RECOVERY_INTERVAL
    [record] = caplog.records
    assert "must be positive" in record.getMessage()
    assert "expected a number" not in record.getMessage()


def test_a_tilde_in_a_sqlite_path_is_the_home_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/ada")
    assert DatabaseURL.parse("sqlite:///~/x.db").path == "/home/ada/x.db"
    assert DatabaseURL.parse("sqlite:///a~b/x.db").path == "a~b/x.db"
