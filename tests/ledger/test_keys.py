"""Named keys in the ledger database: hashed at rest, found by their secret, revoked and expired for good."""

from __future__ import annotations

import stat
import time

import pytest

from gateway.ledger.errors import InvalidQuery, NotFound
from gateway.ledger.keys import KeyConflict, KeyStore, expiry_time, period_seconds
from gateway.ledger.records import RequestRecord
from gateway.ledger.writer import Ledger


@pytest.fixture
def store(ledger_location):
    """A key store on each engine: the SQLite file, then a PostgreSQL database."""
    store = KeyStore(ledger_location)
    yield store
    store.close()


def test_a_key_is_found_by_its_secret_and_never_stored_in_clear(store, tmp_path):
    key, secret = store.create(
        "alice", models=["openai/*", "selfroute"], collections=["contracts"], budget_usd=2.5, rpm=10, tpm=1000
    )
    assert store.lookup(secret) == key
    assert (key.models, key.collections, key.budget_usd, key.rpm, key.tpm) == (
        ("openai/*", "selfroute"),
        ("contracts",),
        2.5,
        10,
        1000,
    )
    assert store.lookup(secret + "x") is None and store.lookup(secret[:-1]) is None
    assert store.lookup("sk-anything") is None
    if isinstance(store.location, str):  # PostgreSQL: nothing in any column of the table
        import psycopg

        with psycopg.connect(store.location) as conn:
            stored = repr(conn.execute("SELECT * FROM api_keys").fetchall())
        assert "alice" in stored and secret not in stored and secret[len(key.prefix) :] not in stored
        return
    store.close()
    for path in tmp_path.iterdir():  # the database, its WAL and shared memory
        assert secret.encode() not in path.read_bytes()
        assert secret[len(key.prefix) :].encode() not in path.read_bytes()


def test_each_key_has_its_own_secret(store):
    _, one = store.create("one")
    _, two = store.create("two")
    assert one != two and store.lookup(one).name == "one" and store.lookup(two).name == "two"


def test_revoked_and_expired_keys_are_not_found(store):
    _, secret = store.create("bob")
    revoked = store.revoke("bob")
    assert revoked.revoked_at is not None and not revoked.active()
    assert store.lookup(secret) is None
    assert store.revoke("bob").revoked_at == revoked.revoked_at  # revoking again changes nothing
    _, soon = store.create("carol", expires_at=time.time() + 0.2)
    assert store.lookup(soon) is not None
    time.sleep(0.3)
    assert store.lookup(soon) is None
    assert store.any_keys()  # revoked and expired keys still count: the gateway never falls open


def test_names_are_checked_and_never_reused(store):
    store.create("dave")
    store.revoke("dave")
    with pytest.raises(KeyConflict):
        store.create("dave")
    for bad in ["", "k_abc", "has space", "-x", "x" * 65, "é"]:
        with pytest.raises(InvalidQuery):
            store.create(bad)
    with pytest.raises(NotFound):
        store.revoke("nobody")


@pytest.mark.parametrize("field, value", [("budget_usd", -1), ("rpm", 0), ("tpm", "many"), ("rpm", 10**13)])
def test_limits_must_be_positive_numbers(store, field, value):
    with pytest.raises(InvalidQuery):
        store.create("erin", **{field: value})


def test_expiry_ages():
    now = 1000.0
    assert expiry_time("30d", now) == now + 30 * 86400
    assert expiry_time("12h", now) == now + 12 * 3600
    assert expiry_time("2w", now) == now + 14 * 86400
    for bad in ["30", "0d", "d", "1y", "9" * 20 + "d"]:
        with pytest.raises(InvalidQuery):
            expiry_time(bad, now)


def test_spend_and_tokens_come_from_the_ledger(store, tmp_path):
    ledger = Ledger(store.location, dead_letter_dir=tmp_path)
    store.create("frank")
    now = time.time()
    for i, (cost, tokens, age) in enumerate([(0.5, 100, 10), (0.25, 50, 30), (1.0, 400, 120)]):
        ledger.submit(
            RequestRecord(
                id=f"r{i}",
                created_at=now - age,
                key_id="frank",
                policy="p",
                alias="m",
                route="passthrough",
                reason=None,
                status=200,
                cost_usd=cost,
                prompt_tokens=tokens,
                completion_tokens=0,
            )
        )
    ledger.flush()
    ledger.close()
    assert store.spend(["frank"]) == {"frank": pytest.approx(1.75)}
    assert store.spend() == {"frank": pytest.approx(1.75)}
    tokens, oldest = store.tokens_since("frank", now - 60)
    assert tokens == 150 and oldest == pytest.approx(now - 30)


def test_request_counts_are_per_minute_and_shared_between_connections(ledger_location):
    """Two stores on one database (two replicas on one PostgreSQL) count into the same minute."""
    one, two = KeyStore(ledger_location), KeyStore(ledger_location)
    minute = 60 * 1000
    assert one.count_request("k", minute + 1)[0] == 1
    count, until_next = two.count_request("k", minute + 15)
    assert count == 2 and until_next == pytest.approx(45)
    two.uncount_request("k", minute + 16)
    assert one.count_request("k", minute + 20)[0] == 2
    assert one.count_request("k", minute + 61)[0] == 1  # a new minute starts from zero
    one.close()
    two.close()


def test_collection_owners_first_claim_wins(store):
    assert store.collection_owner("c") is None
    assert store.claim_collection("c", "alice") == "alice"
    assert store.claim_collection("c", "bob") == "alice"
    assert store.collection_owners() == {"c": "alice"}


def test_the_database_file_is_private(tmp_path):
    store = KeyStore(tmp_path / "ledger.sqlite3")
    store.create("gina")
    store.close()
    mode = stat.S_IMODE((tmp_path / "ledger.sqlite3").stat().st_mode)
    assert mode == 0o600


def test_a_name_with_a_final_newline_is_no_name(store):
    with pytest.raises(InvalidQuery):
        store.create("alice\n")


def test_edit_changes_only_what_is_given_and_none_clears(store):
    store.create("gina", models=["openai/*"], budget_usd=5, rpm=10)
    key = store.edit("gina", collections=["harbour"], tpm=1000)
    assert (key.models, key.collections, key.budget_usd, key.rpm, key.tpm) == (("openai/*",), ("harbour",), 5, 10, 1000)
    key = store.edit("gina", models=None, rpm=None)
    assert key.models is None and key.rpm is None and key.budget_usd == 5
    with pytest.raises(InvalidQuery):
        store.edit("gina", rpm=-1)
    with pytest.raises(NotFound):
        store.edit("nobody", rpm=1)
    store.revoke("gina")
    with pytest.raises(InvalidQuery, match="revoked"):
        store.edit("gina", rpm=1)


def test_rotate_gives_a_new_secret_and_the_old_one_stops(store):
    key, old = store.create("hal", budget_usd=3)
    rotated, new = store.rotate("hal")
    assert new != old and store.lookup(old) is None and store.lookup(new).name == "hal"
    assert rotated.budget_usd == 3 and rotated.rotated_at is not None and rotated.created_at == key.created_at


def test_the_admin_key_is_stored_hashed_and_has_no_limits(store):
    assert not store.has_admin_key()
    key, secret = store.create("admin", admin=True)
    assert key.admin and store.has_admin_key() and store.lookup(secret).admin
    with pytest.raises(InvalidQuery, match="no model list"):
        store.create("admin2", admin=True, rpm=5)
    with pytest.raises(InvalidQuery, match="no model list"):
        store.edit("admin", budget_usd=1)
    store.revoke("admin")
    assert not store.has_admin_key()


def test_only_keys_not_revoked_keep_the_gateway_keyed(store):
    assert not store.any_keys()
    store.create("ivy", expires_at=time.time() + 3600)
    assert store.any_keys()
    store.revoke("ivy")
    assert not store.any_keys()  # back to the configured mode


def test_a_budget_period_counts_only_the_current_periods_spend(store, tmp_path):
    assert period_seconds("30d") == 30 * 86400 and period_seconds("1h") == 3600
    for bad in ("30m", "0d", "monthly"):
        with pytest.raises(InvalidQuery):
            period_seconds(bad)
    key, _ = store.create("jo", budget_usd=1, budget_period_s=86400)
    now = key.created_at
    ledger = Ledger(store.location, dead_letter_dir=tmp_path)
    # one request in the previous day-long period (counted from when the period was set), two in this one: one in
    # the period's first, partial hour (read from the requests) and one in a whole hour (read from the rollups)
    periods_start = now + 86400
    spends = [(now + 100, 0.5), (periods_start + 10, 0.25), (periods_start + 7200, 0.125)]
    for i, (at, cost) in enumerate(spends):
        ledger.submit(
            RequestRecord(
                id=f"p{i}",
                created_at=at,
                key_id="jo",
                policy="p",
                alias="m",
                route="passthrough",
                reason=None,
                status=200,
                cost_usd=cost,
                prompt_tokens=1,
                completion_tokens=0,
            )
        )
    ledger.flush()
    ledger.close()
    key = store.get("jo")
    assert key.period_start(periods_start + 8000) == pytest.approx(periods_start)
    assert store.budget_spent(key, periods_start + 8000) == pytest.approx(0.375)
    assert store.budget_spent(key, now + 200) == pytest.approx(0.875)  # all rows after the first period's start
    assert store.spend(["jo"]) == {"jo": pytest.approx(0.875)}
    lifetime = store.edit("jo", budget_period_s=None)
    assert lifetime.period_start() is None and store.budget_spent(lifetime) == pytest.approx(0.875)


def _set_writable(path, writable: bool) -> None:
    """No process may open `path` for writing (root included: the immutable attribute), or again may."""
    import os
    import subprocess

    if os.geteuid() != 0:
        path.chmod(0o600 if writable else 0o400)
        return
    done = subprocess.run(["chattr", "-i" if writable else "+i", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make a file read-only for root here: {done.stderr.decode().strip()}")


def test_a_key_store_that_met_a_read_only_ledger_writes_again_once_it_is_writable(tmp_path):
    """SQLite opens a file it cannot write read-only, and that connection stays read-only: the probe made the
    ledger file immutable for 25 s under a running gateway, and every --rpm key was 503 ledger_unavailable for
    good after it was writable again (the key store's connection, made meanwhile, was never dropped)."""
    from gateway.ledger.errors import Unavailable

    path = tmp_path / "ledger.sqlite3"
    store = KeyStore(path)
    store.create("team", rpm=5)
    store.close()  # the next call connects again: while the file is read-only
    _set_writable(path, False)
    try:
        with pytest.raises(Unavailable):
            store.count_request("team")
    finally:
        _set_writable(path, True)
    assert store.count_request("team")[0] == 1  # the read-only connection went with its failure
    assert store.count_request("team")[0] == 2
    store.close()
