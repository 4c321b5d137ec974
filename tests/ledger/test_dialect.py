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
