"""Named keys in the ledger database: hashed at rest, found by their secret, revoked and expired for good."""
from __future__ import annotations

import stat
import time

import pytest

from gateway.ledger.errors import InvalidQuery, NotFound
from gateway.ledger.keys import KeyConflict, KeyStore, expiry_time
from gateway.ledger.records import RequestRecord
from gateway.ledger.writer import Ledger


@pytest.fixture
def store(ledger_location):
    """A key store on each engine: the SQLite file, then a PostgreSQL database."""
    store = KeyStore(ledger_location)
    yield store
    store.close()


def test_a_key_is_found_by_its_secret_and_never_stored_in_clear(store, tmp_path):
    key, secret = store.create("alice", models=["openai/*", "selfroute"], collections=["contracts"],
                               budget_usd=2.5, rpm=10, tpm=1000)
    assert store.lookup(secret) == key
    assert (key.models, key.collections, key.budget_usd, key.rpm, key.tpm) == (
        ("openai/*", "selfroute"), ("contracts",), 2.5, 10, 1000)
    assert store.lookup(secret + "x") is None and store.lookup(secret[:-1]) is None
    assert store.lookup("sk-anything") is None
    if isinstance(store.location, str):  # PostgreSQL: nothing in any column of the table
        import psycopg

        with psycopg.connect(store.location) as conn:
            stored = repr(conn.execute("SELECT * FROM api_keys").fetchall())
        assert "alice" in stored and secret not in stored and secret[len(key.prefix):] not in stored
        return
    store.close()
    for path in tmp_path.iterdir():  # the database, its WAL and shared memory
        assert secret.encode() not in path.read_bytes()
        assert secret[len(key.prefix):].encode() not in path.read_bytes()


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
        ledger.submit(RequestRecord(id=f"r{i}", created_at=now - age, key_id="frank", policy="p", alias="m",
                                    route="passthrough", reason=None, status=200, cost_usd=cost,
                                    prompt_tokens=tokens, completion_tokens=0))
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
