"""The dialect layer's connection to PostgreSQL: a URL's password never comes back in an error."""

from __future__ import annotations

import traceback

import pytest

from gateway.ledger.dialect import connect_postgres, redact, url_secrets

PASSWORD = "Hunter2Secret"


@pytest.mark.parametrize(
    "url, message, hidden",
    [
        ("postgresql://app:Hunter2 Secret@h/db", 'unexpected spaces found in "Hunter2 Secret"', "Hunter2 Secret"),
        ("postgresql://app:p%40ssword@h/db", "p@ssword and p%40ssword", "ssword"),
        ("postgresql://app:abcd@efgh@h/db", 'could not translate host name "efgh@h"', "efgh"),
        ("postgresql://app@h/db?sslmode=x&password=zzSecret", "invalid: password=zzSecret sslmode", "zzSecret"),
        ("postgres://u:whatever@h/db", 'in URI: "postgres://u:OtherSecret@[::1/db"', "OtherSecret"),
    ],
)
def test_redact_takes_every_form_of_the_password_out(url, message, hidden):
    assert hidden not in redact(message, url)
    assert "***" in redact(message, url)


def test_url_secrets_of_a_url_without_password():
    assert url_secrets("postgresql://app@h:5432/db") == []
    assert redact("connection refused at h:5432", "postgresql://app@h:5432/db") == "connection refused at h:5432"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://app:{PASSWORD[:7]} {PASSWORD[7:]}@127.0.0.1:1/db",  # libpq quotes the password back
        f"postgresql://app:{PASSWORD}@[::1:1/db",  # libpq quotes the whole URL back
        f"postgresql://app:{PASSWORD}@127.0.0.1:1/db",  # nothing listens on port 1
        f"postgresql://app:{PASSWORD}@127.0.0.1:notaport/db",
    ],
)
def test_a_failed_connection_never_shows_the_password(url):
    import psycopg

    with pytest.raises(psycopg.Error) as raised:
        connect_postgres(url, connect_timeout=2)
    shown = "".join(traceback.format_exception(raised.value))  # what a log or a crash would print, chain included
    assert PASSWORD[:7] not in shown and PASSWORD not in shown
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_a_failed_connection_keeps_its_error_type():
    """The writer tells a transient failure (retried, then dead-lettered) by the driver's type."""
    import psycopg

    with pytest.raises(psycopg.OperationalError):
        connect_postgres(f"postgresql://app:{PASSWORD}@127.0.0.1:1/db", connect_timeout=2)


def test_a_call_to_a_server_that_hangs_is_cut_after_its_limit(postgres_url):
    """probe11: a PostgreSQL that hangs (here its backend is stopped) keeps the TCP connection open, so no driver or
    kernel timeout ends a call, and every request waited for as long as it hung. With stall_s the call fails (the
    outage path) in about that time; without it (the CLI's migrations and reports) it waits for the server."""
    import os
    import signal
    import threading
    import time

    import psycopg

    for stall_s in (1.0, None):
        conn = connect_postgres(postgres_url, autocommit=True, stall_s=stall_s)
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        os.kill(backend, signal.SIGSTOP)
        try:
            outcome: list = []

            def call(conn=conn, outcome=outcome) -> None:
                started = time.monotonic()
                try:
                    outcome.append(conn.execute("SELECT 1").fetchone()[0])
                except psycopg.OperationalError as exc:
                    outcome.append(exc)
                outcome.append(time.monotonic() - started)

            thread = threading.Thread(target=call, daemon=True)
            thread.start()
            thread.join(timeout=3.0)
            if stall_s is not None:
                assert not thread.is_alive() and isinstance(outcome[0], psycopg.OperationalError)
                assert 0.9 <= outcome[1] < 2.5 and conn.broken
            else:
                assert thread.is_alive()  # still waiting on the server
        finally:
            os.kill(backend, signal.SIGCONT)
        thread.join(timeout=10)
        if stall_s is None:
            assert outcome[0] == 1  # answered once the server went on
        conn.close()
    fresh = connect_postgres(postgres_url, autocommit=True, stall_s=1.0)
    assert fresh.execute("SELECT 2").fetchone()[0] == 2  # the server is fine
    fresh.close()
