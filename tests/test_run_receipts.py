"""Signed run receipts, on SQLite and PostgreSQL: signed in the commit that ends a run,
signed on demand for runs that ended elsewhere, exported with the journal and verified
offline by ``ratchet verify``, which names the first bad seq or the reason for every kind
of tampering."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clirun import data_dir as data_dir
from clirun import ok, refused
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from proc import Harness

import ratchet
from ratchet.errors import ConfigError, RunNotFinished
from ratchet.model import Event, dumps
from ratchet.receipts import PAYLOAD_TYPE, PREDICATE_TYPE, load_signer, verify
from ratchet.store import retention

fail_step = {"on": True}


@pytest.fixture(autouse=True)
def _own_key(data_dir: Path) -> None:
    """Every test here signs with a key of its own."""


@pytest.fixture
def app(db_url: str) -> Iterator[ratchet.Ratchet]:
    fail_step["on"] = True
    app = ratchet.Ratchet(db_url, lease_ttl=3.0, recovery_interval=0.5)

    @app.step
    async def fetch(n: int) -> dict[str, Any]:
        return {"n": n, "text": 'héllo\n"quoted"', "ratio": 0.1 * n, "big": 1e20}

    @app.step
    async def flaky() -> str:
        if fail_step["on"]:
            raise ValueError("boom")
        return "fine"

    @app.workflow()
    async def report(n: int) -> dict[str, Any]:
        parts = [await fetch(i) for i in range(n)]
        return {"parts": parts}

    @app.workflow()
    async def shaky() -> str:
        return await flaky()

    try:
        yield app
    finally:
        app.shutdown()


def finish(app: ratchet.Ratchet, run_id: str) -> None:
    try:
        app.result(run_id, timeout_s=30)
    except ratchet.RatchetError:
        pass
    assert app.get(run_id).status.terminal


def statement(envelope: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(base64.b64decode(envelope["payload"])))


def export(db_url: str, run_id: str, path: Path) -> list[str]:
    ok("export", run_id, "--db", db_url, "-o", str(path))
    # split("\n"), not splitlines(): a payload may hold U+2028, which JSON keeps as it is.
    return path.read_text("utf-8").split("\n")[:-1]


def test_a_run_is_signed_as_it_ends_and_verifies_offline(
    app: ratchet.Ratchet, db_url: str, tmp_path: Path
) -> None:
    app.launch()
    run_id = app.start("report", 3, run_id="r-1")
    finish(app, run_id)
    # Stored by the commit that ended the run, before anyone asked for it.
    stored = app.portal.call(retention.get_receipt(app.store, run_id))
    assert stored is not None and stored.seq == len(app.events(run_id))
    app.shutdown()

    receipt = tmp_path / "receipt.json"
    ok("receipt", run_id, "--db", db_url, "-o", str(receipt))
    envelope = json.loads(receipt.read_text())
    assert json.loads(ok("receipt", run_id, "--db", db_url).stdout) == envelope
    assert envelope == stored.envelope  # nothing re-signed
    assert envelope["payloadType"] == PAYLOAD_TYPE
    stmt = statement(envelope)
    events = app.events(run_id)
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["predicateType"] == PREDICATE_TYPE
    assert stmt["subject"] == [{"name": run_id, "digest": {"sha256": events[-1].hash}}]
    pred = stmt["predicate"]
    assert pred["status"] == "succeeded" and pred["workflow"] == "report"
    assert pred["event_count"] == len(events) == events[-1].seq
    output = app.get(run_id).output
    assert pred["output_digest"]["sha256"] == hashlib.sha256(dumps(output).encode()).hexdigest()
    assert pred["first_event_at"].endswith("Z") and pred["first_event_at"] <= pred["last_event_at"]
    assert pred["llm"] == {"calls": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}

    key = tmp_path / "key.pem"
    shown = ok("keys", "show", "--db", db_url).stdout
    ok("keys", "show", "--db", db_url, "-o", str(key))
    assert key.read_text() == shown
    assert pred["key_id"] == envelope["signatures"][0]["keyid"] and pred["key_id"] in shown
    lines = export(db_url, run_id, tmp_path / "events.jsonl")
    assert len(lines) == len(events)
    out = ok(
        "verify", str(receipt), "--events", str(tmp_path / "events.jsonl"), "--public-key", str(key)
    ).stdout
    assert f"ok: run {run_id} (succeeded), {len(events)} events" in out


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), "utf-8")
    return path


def _edit(line: str, **changes: Any) -> str:
    d = json.loads(line)
    d.update(changes)
    return dumps(d)


def test_every_kind_of_tampering_fails_naming_the_first_bad_seq_or_the_reason(
    app: ratchet.Ratchet, db_url: str, tmp_path: Path
) -> None:
    app.launch()
    run_id = app.start("report", 3, run_id="r-main")
    other_id = app.start("report", 1, run_id="r-other")
    finish(app, run_id)
    finish(app, other_id)
    receipt = tmp_path / "receipt.json"
    receipt.write_text(json.dumps(app.run_receipt(run_id)))
    other_receipt = tmp_path / "other.json"
    other_receipt.write_text(json.dumps(app.run_receipt(other_id)))
    key = tmp_path / "key.pem"
    key.write_text(ok("keys", "show", "--db", db_url).stdout)
    lines = export(db_url, run_id, tmp_path / "events.jsonl")
    n = len(lines)
    assert n >= 8

    def verdict(events: list[str], rec: Path = receipt, pub: Path = key) -> str:
        path = _write(tmp_path / "tampered.jsonl", events)
        return refused(1, "verify", str(rec), "--events", str(path), "--public-key", str(pub))

    # changed: a step's output
    changed = list(lines)
    d = json.loads(lines[3])
    assert d["kind"] == "step_completed"
    d["payload"]["output"]["n"] = 99
    changed[3] = dumps(d)
    assert "seq 4: its hash does not match its content" in verdict(changed)
    # changed, with its hash recomputed: the next event's link breaks
    rehashed = Event.chain(
        run_id, 4, d["kind"], d["step_id"], d["attempt"], d["payload"], d["at"], d["prev_hash"]
    )
    changed[3] = dumps(rehashed.export_dict())
    assert "seq 5: its prev_hash is not the hash of seq 4" in verdict(changed)
    # changed: a header field (the time)
    assert "seq 3: its hash does not match" in verdict(
        [*lines[:2], _edit(lines[2], at=json.loads(lines[2])["at"] + 1), *lines[3:]]
    )
    # removed
    assert "seq 4: found seq 5 where seq 4 should be" in verdict(lines[:3] + lines[4:])
    # inserted (a copy of an event)
    assert "seq 4: found seq 3 where seq 4 should be" in verdict([*lines[:3], lines[2], *lines[3:]])
    # inserted and renumbered, every hash recomputed: the head is not the signed one
    forged: list[str] = []
    prev = "0" * 64
    source = [json.loads(x) for x in lines]
    source.insert(2, dict(source[2], payload={"idempotency_key": "forged"}))
    for seq, e in enumerate(source, start=1):
        ev = Event.chain(
            run_id, seq, e["kind"], e["step_id"], e["attempt"], e["payload"], e["at"], prev
        )
        forged.append(dumps(ev.export_dict()))
        prev = ev.hash
    assert f"seq {n + 1}: the journal goes on past the {n} events" in verdict(forged)
    rewritten = []
    prev = "0" * 64
    for seq, e in enumerate(source[:n], start=1):
        ev = Event.chain(
            run_id, seq, e["kind"], e["step_id"], e["attempt"], e["payload"], e["at"], prev
        )
        rewritten.append(dumps(ev.export_dict()))
        prev = ev.hash
    assert "the chain's head" in verdict(rewritten) and "events were rewritten" in verdict(
        rewritten
    )
    # reordered
    assert "seq 3: found seq 4 where seq 3 should be" in verdict(
        [*lines[:2], lines[3], lines[2], *lines[4:]]
    )
    # truncated
    assert f"truncated: the journal ends at seq {n - 1}, the receipt covers {n} events" in verdict(
        lines[:-1]
    )
    assert f"truncated: the journal ends at seq 0, the receipt covers {n} events" in verdict([])
    # a receipt for another run
    assert f"seq 1: an event of run {run_id}, but the receipt is for run {other_id}" in verdict(
        lines, rec=other_receipt
    )
    # a wrong key
    wrong = tmp_path / "wrong.pem"
    wrong.write_bytes(
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    assert "wrong key: the receipt was signed by key" in verdict(lines, pub=wrong)
    # the receipt itself changed: its statement claims another status
    env = json.loads(receipt.read_text())
    stmt = statement(env)
    stmt["predicate"]["status"] = "failed"
    env["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    forged_receipt = tmp_path / "forged.json"
    forged_receipt.write_text(json.dumps(env))
    assert "bad signature" in verdict(lines, rec=forged_receipt)
    # not a receipt, not an event
    assert "not a receipt" in verdict(lines, rec=_write(tmp_path / "x.json", ['{"a": 1}']))
    assert "line 2 of the events is not a journal event (no run_id)" in verdict(
        [lines[0], "{}", *lines[2:]]
    )
    assert "line 3 of the events is not a journal event (step_id is int)" in verdict(
        [*lines[:2], _edit(lines[2], step_id=5), *lines[3:]]
    )
    assert "line 1 of the events is not JSON" in verdict(["{", *lines[1:]])
    # a key given twice (a reader taking the last one would see another output), at the
    # top or inside the payload, and a field the export does not have
    twice = lines[3].replace('"kind":', '"kind":"step_failed","kind":', 1)
    assert "line 4 of the events gives the key 'kind' twice" in verdict(
        [*lines[:3], twice, *lines[4:]]
    )
    inner = lines[3].replace('"output":', '"output":{"n":99},"output":', 1)
    assert "line 4 of the events gives the key 'output' twice" in verdict(
        [*lines[:3], inner, *lines[4:]]
    )
    assert "line 3 of the events is not a journal event (unknown field 'note')" in verdict(
        [*lines[:2], _edit(lines[2], note="trust me"), *lines[3:]]
    )
    # and the untouched export still holds
    ok("verify", str(receipt), "--events", str(tmp_path / "events.jsonl"), "--public-key", str(key))


def test_failed_retried_and_cancelled_runs_get_receipts_signed_on_demand_once(
    app: ratchet.Ratchet,
) -> None:
    # Cancelled while queued: no worker ever drove it, so no drive signed it.
    queued = app.start("report", 1, run_id="r-queued")
    app.cancel(queued)
    assert app.portal.call(retention.get_receipt(app.store, queued)) is None
    envelope = app.run_receipt(queued)
    assert statement(envelope)["predicate"]["status"] == "cancelled"
    assert app.run_receipt(queued) == envelope  # stored once, given back

    app.launch()
    failed = app.start("shaky", run_id="r-failed")
    finish(app, failed)
    first = app.run_receipt(failed)
    assert statement(first)["predicate"]["status"] == "failed"
    n_failed = statement(first)["predicate"]["event_count"]

    # A receipt lost after the end (as if the signing commit never came) is signed again
    # on demand, identically: Ed25519 is deterministic and the statement has no clock.
    store = app.store
    app.portal.call(
        store._run(lambda tx: tx._cur.execute("DELETE FROM run_receipts WHERE run_id = 'r-failed'"))
    )
    assert app.portal.call(retention.get_receipt(store, failed)) is None
    assert app.run_receipt(failed) == first

    # Retried and succeeded: a new receipt over the longer journal replaces the old one.
    fail_step["on"] = False
    app.retry(failed)
    wait = app.result(failed, timeout_s=30)
    assert wait == "fine"
    after = statement(app.run_receipt(failed))["predicate"]
    assert after["status"] == "succeeded" and after["event_count"] > n_failed
    assert after["event_count"] == len(app.events(failed))


def test_an_unfinished_or_unknown_run_has_no_receipt_and_says_why(
    app: ratchet.Ratchet, db_url: str
) -> None:
    run_id = app.start("report", 1, run_id="r-pending")
    with pytest.raises(RunNotFinished, match="has not finished \\(status queued\\)"):
        app.run_receipt(run_id)
    assert "run r-pending has not finished (status queued)" in refused(
        2, "receipt", run_id, "--db", db_url
    )
    assert "unknown run id 'nope'" in refused(2, "receipt", "nope", "--db", db_url)
    assert "unknown run id 'nope'" in refused(2, "export", "nope", "--db", db_url)


def test_the_key_is_made_once_private_and_the_configured_one_wins(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_url: str
) -> None:
    first = load_signer(data_dir)
    path = data_dir / "signing_key.pem"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_signer(data_dir).key_id == first.key_id  # made once, then read
    assert [p.name for p in data_dir.iterdir()] == ["signing_key.pem"]  # no temp file left

    own = tmp_path / "own.pem"
    own.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    monkeypatch.setenv("RATCHET_SIGNING_KEY", str(own))
    configured = load_signer(data_dir)
    assert configured.key_id != first.key_id and configured.path == own
    assert configured.key_id in ok("keys", "show", "--db", sqlite_url).stdout

    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    monkeypatch.setenv("RATCHET_SIGNING_KEY", str(bad))
    with pytest.raises(ConfigError, match="is not an unencrypted PEM private key"):
        load_signer(data_dir)
    assert "RATCHET_SIGNING_KEY" in refused(2, "keys", "show", "--db", sqlite_url)
    monkeypatch.setenv("RATCHET_SIGNING_KEY", str(tmp_path / "missing.pem"))
    assert "cannot read the signing key" in refused(2, "keys", "show", "--db", sqlite_url)


def test_verify_refuses_unreadable_inputs_clearly(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_bytes(
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    events = _write(tmp_path / "e.jsonl", [])
    assert "cannot read" in refused(
        2, "verify", str(tmp_path / "none.json"), "--events", str(events), "--public-key", str(key)
    )
    notjson = _write(tmp_path / "r.json", ["{"])
    assert "is not JSON" in refused(
        2, "verify", str(notjson), "--events", str(events), "--public-key", str(key)
    )
    assert "is not a PEM public key" in refused(
        2, "verify", str(notjson), "--events", str(events), "--public-key", str(notjson)
    )


def test_the_api_serves_a_receipt_to_the_runs_tenant_only(app: ratchet.Ratchet) -> None:
    import httpx
    from serving import serving

    from ratchet.store import tokens

    app.launch()
    done = app.start("report", 2, run_id="r-api")
    finish(app, done)
    app.shutdown()
    pending = app.start("report", 1, run_id="r-api-pending")
    scopes = ("runs:read",)
    _, mine = app.portal.call(tokens.create_token(app.store, "default", scopes))
    _, theirs = app.portal.call(tokens.create_token(app.store, "globex", scopes))
    with serving(app, workers=0) as base, httpx.Client(base_url=base, timeout=30) as client:
        r = client.get(f"/v1/runs/{done}/receipt", headers={"Authorization": f"Bearer {mine}"})
        assert r.status_code == 200, r.text
        assert r.json() == app.run_receipt(done)
        r = client.get(f"/v1/runs/{done}/receipt", headers={"Authorization": f"Bearer {theirs}"})
        assert r.status_code == 404 and r.json()["message"] == "unknown run id 'r-api'"
        r = client.get(f"/v1/runs/{pending}/receipt", headers={"Authorization": f"Bearer {mine}"})
        assert r.status_code == 409 and "has not finished" in r.json()["message"]
        assert client.get(f"/v1/runs/{done}/receipt").status_code == 401


# -- the documented encoding, written again from docs/how-to/receipts.md alone ---------------

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def _doc_json(v: Any) -> str:
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if abs(v) >= 1e16:
            return str(int(v))
        if v == 0:
            return "0.0"
        return repr(v)  # shortest round trip; exponent form below 1e-4
    if isinstance(v, str):
        return (
            '"'
            + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if ord(c) < 0x20 else c) for c in v)
            + '"'
        )
    if isinstance(v, list):
        return "[" + ",".join(_doc_json(x) for x in v) + "]"
    return "{" + ",".join(f"{_doc_json(k)}:{_doc_json(v[k])}" for k in sorted(v)) + "}"


def _doc_hash(e: dict[str, Any]) -> str:
    sid = e["step_id"] or ""
    attempt = "None" if e["attempt"] is None else str(e["attempt"])
    text = (
        f"{e['prev_hash']}|{e['run_id']}|{e['seq']}|{e['kind']}|{attempt}|{e['at']:.6f}|"
        f"{len(sid)}:{sid}|{_doc_json(e['payload'])}"
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _doc_pae(payload: bytes) -> bytes:
    t = PAYLOAD_TYPE.encode()
    return (
        b"DSSEv1 "
        + str(len(t)).encode()
        + b" "
        + t
        + b" "
        + str(len(payload)).encode()
        + b" "
        + payload
    )


def test_the_documented_encoding_recomputes_every_hash_and_the_signature(
    db_url: str, tmp_path: Path
) -> None:
    app = ratchet.Ratchet(db_url, lease_ttl=3.0)

    @app.step(name="étape")  # a step id with a non-ASCII name
    async def odd(x: Any) -> Any:
        return x

    @app.workflow()
    async def awkward() -> Any:
        return await odd(
            {
                "ctl": 'a\x01b\x1f\u007f\t"\\/',
                "uni": "日本 😀 \u2028",
                "tiny": 1e-07,
                "small": 2.5e-05,
                "big": 1e20,
                "neg0": -0.0,
                "f": 2.0,
                "pi": 3.141592653589793,
                "n": [1, -2, None, True],
                "Zk": 1,
                "ak": 2,
                "ék": 3,
                "😀k": 4,
                "\uff61k": 5,
            }
        )

    try:
        app.launch()
        run_id = app.start("awkward")
        app.result(run_id, timeout_s=30)
        envelope = app.run_receipt(run_id)
        lines = export(db_url, run_id, tmp_path / "e.jsonl")
    finally:
        app.shutdown()
    prev = "0" * 64
    for n, line in enumerate(lines, start=1):
        e = json.loads(line)
        assert e["seq"] == n and e["prev_hash"] == prev
        assert _doc_hash(e) == e["hash"], line
        prev = e["hash"]
    body = base64.b64decode(envelope["payload"])
    stmt = json.loads(body)
    assert stmt["subject"][0]["digest"]["sha256"] == prev
    assert stmt["predicate"]["event_count"] == len(lines)
    app.signer.public.verify(base64.b64decode(envelope["signatures"][0]["sig"]), _doc_pae(body))


@pytest.mark.crash
@pytest.mark.parametrize("crash_at", ["before_terminal:1", "after_terminal:1"])
def test_a_worker_killed_at_the_end_still_leaves_a_receipt_over_the_whole_journal(
    h: Harness, crash_at: str, data_dir: Path
) -> None:
    env = {"RATCHET_DATA_DIR": str(data_dir)}  # the workers sign with the test's key
    run_id = h.app.start("chain", n=3)
    first = h.spawn("a", worker_id="w-end", crash_at=crash_at, env_extra=env)
    assert first.wait_exit() == -signal.SIGKILL
    h.spawn("a-again", worker_id="w-end", env_extra=env)
    h.wait_status(run_id, "succeeded")
    events = h.app.events(run_id)
    # Stored by the worker that ended the run, in the same commit: nobody asked for it.
    stored = h.app.portal.call(retention.get_receipt(h.app.store, run_id))
    assert stored is not None and stored.seq == len(events)
    lines = [dumps(e.export_dict()) for e in events]
    assert verify(stored.envelope, lines, h.app.signer.public).event_count == len(events)
