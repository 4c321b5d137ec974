"""Named keys over the admin API on a real gateway: create (the key shown once), list with spend, revoke."""

from __future__ import annotations

import stat

import httpx
import pytest

from gateway.server.auth import Authenticator
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import make_policy

ADMIN = "sk-admin-keys"


@pytest.fixture()
def gateway(upstream, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    with running_gateway(tmp_path / "data", make_policy(upstream[0]), auth=Authenticator(admin_key=ADMIN)) as (
        url,
        app,
    ):
        yield url, app


def _admin(method: str, url: str, **kwargs) -> httpx.Response:
    return httpx.request(method, url, headers={"authorization": f"Bearer {ADMIN}"}, timeout=30, **kwargs)


def _ask(url: str, key: str) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
        json={"model": "openai/fake-cheap", "messages": [{"role": "user", "content": "a b c"}]},
    )


def test_create_use_list_and_revoke_a_key(gateway):
    url, app = gateway
    created = _admin(
        "POST",
        f"{url}/v1/admin/keys",
        json={"name": "alice", "models": ["openai/*"], "rpm": 100, "budget_usd": 5, "expires": "30d"},
    )
    assert created.status_code == 201
    key = created.json()["key"]
    assert key.startswith(created.json()["prefix"]) and created.json()["models"] == ["openai/*"]
    assert _ask(url, key).status_code == 200
    [row] = ledger_rows(app)
    assert row["key_id"] == "alice"  # the ledger shows the key's name

    listed = _admin("GET", f"{url}/v1/admin/keys").json()["data"]
    assert [(k["name"], k["active"], k["rpm"]) for k in listed] == [("alice", True, 100)]
    assert listed[0]["spend_usd"] == pytest.approx(row["cost_usd"]) and "key" not in listed[0]
    costs = _admin("GET", f"{url}/v1/admin/costs", params={"by": "key"}).json()
    assert [g["group"] for g in costs["groups"]] == ["alice"]
    assert _admin("GET", f"{url}/v1/admin/requests", params={"key": "alice"}).json()["data"][0]["id"] == row["id"]

    assert _admin("DELETE", f"{url}/v1/admin/keys/alice").json()["active"] is False
    assert _ask(url, key).status_code == 401  # revoked in this process: at once
    assert _admin("DELETE", f"{url}/v1/admin/keys/nobody").status_code == 404


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"name": "k_x"}, 400, "name"),
        ({"name": "ok", "rpm": -1}, 400, "rpm"),
        ({"name": "ok", "expires": "soon"}, 400, "expires"),
        ({"name": "ok", "extra": 1}, 400, "extra"),
        ({}, 400, "name"),
        ({"name": "ok", "admin": "yes"}, 400, "admin"),  # made an admin key (probe11): types as sent
        ({"name": "ok", "rpm": "10"}, 400, "rpm"),
    ],
)
def test_bad_key_requests_are_400(gateway, body, status, param):
    url, _ = gateway
    response = _admin("POST", f"{url}/v1/admin/keys", json=body)
    assert response.status_code == status and response.json()["error"]["param"] == param


def test_names_are_never_reused_and_only_the_admin_key_manages_keys(gateway):
    url, _ = gateway
    first = _admin("POST", f"{url}/v1/admin/keys", json={"name": "bob"}).json()["key"]
    assert _admin("POST", f"{url}/v1/admin/keys", json={"name": "bob"}).status_code == 409
    for method in ("GET", "POST"):
        response = httpx.request(
            method, f"{url}/v1/admin/keys", headers={"authorization": f"Bearer {first}"}, json={"name": "mallory"}
        )
        assert response.status_code == 403
    assert httpx.get(f"{url}/v1/admin/keys").status_code == 401
    assert httpx.get(f"{url}/v1/collections").status_code == 401
    assert "selfroute_unauthenticated_requests_total 2.0" in httpx.get(f"{url}/metrics").text


def test_no_key_in_clear_in_the_database_logs_or_metrics(gateway, caplog):
    url, app = gateway
    key = _admin("POST", f"{url}/v1/admin/keys", json={"name": "carol"}).json()["key"]
    _ask(url, key)
    _ask(url, key + "-wrong")
    ledger_rows(app)
    data_dir = app.state.gateway.settings.data_dir
    for path in data_dir.iterdir():
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
    assert key not in httpx.get(f"{url}/metrics").text
    assert key not in caplog.text


def test_the_data_directory_and_ledger_are_private(gateway):
    url, app = gateway
    data_dir = app.state.gateway.settings.data_dir
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(app.state.gateway.ledger.path.stat().st_mode) == 0o600


def test_revoking_the_last_named_key_returns_to_the_configured_mode(upstream, tmp_path, monkeypatch):
    """Open when nothing else gives keys (the CLI says so loudly); still keyed with keys from the environment."""
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    with running_gateway(tmp_path / "open", make_policy(upstream[0]), auth=Authenticator()) as (url, app):
        assert _ask(url, "anything").status_code == 200  # no keys at all: open
        keys = app.state.gateway.keys
        _, secret = keys.create("only")
        app.state.gateway.auth.forget()
        assert _ask(url, "anything").status_code == 401 and _ask(url, secret).status_code == 200
        keys.revoke("only")
        app.state.gateway.auth.forget()
        assert _ask(url, "anything").status_code == 200  # open again, as configured
        assert _ask(url, secret).status_code == 200  # a revoked key is a key of nobody now, like any other
    with running_gateway(tmp_path / "env", make_policy(upstream[0]), auth=Authenticator(["sk-env"])) as (url, app):
        keys = app.state.gateway.keys
        _, secret = keys.create("only")
        keys.revoke("only")
        app.state.gateway.auth.forget()
        assert _ask(url, "anything").status_code == 401 and _ask(url, secret).status_code == 401
        assert _ask(url, "sk-env").status_code == 200


def test_the_stored_admin_key_opens_the_admin_endpoints(upstream, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    with running_gateway(tmp_path, make_policy(upstream[0]), auth=Authenticator()) as (url, app):
        keys = app.state.gateway.keys
        _, user = keys.create("team")
        app.state.gateway.auth.forget()
        refused = httpx.get(f"{url}/v1/admin/keys", headers={"authorization": f"Bearer {user}"}, timeout=30)
        assert refused.status_code == 403 and "selfroute keys create --admin" in refused.json()["error"]["message"]
        _, admin = keys.create("admin", admin=True)
        app.state.gateway.auth.forget()
        listed = httpx.get(f"{url}/v1/admin/keys", headers={"authorization": f"Bearer {admin}"}, timeout=30)
        assert listed.status_code == 200 and {k["name"]: k["admin"] for k in listed.json()["data"]} == {
            "team": False,
            "admin": True,
        }
        assert (
            httpx.get(f"{url}/v1/admin/keys", headers={"authorization": f"Bearer {user}"}, timeout=30).status_code
            == 403
        )
        assert _ask(url, admin).status_code == 200  # the admin key may also ask
        assert _ask(url, "anything").status_code == 401


def test_edit_rotate_and_the_notices_over_http(upstream, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    with running_gateway(tmp_path, make_policy(upstream[0]), auth=Authenticator()) as (url, app):

        def call(method: str, path: str, key: str = "none", **kwargs) -> httpx.Response:
            app.state.gateway.auth.forget()
            return httpx.request(
                method, f"{url}{path}", headers={"authorization": f"Bearer {key}"}, timeout=30, **kwargs
            )

        admin = call("POST", "/v1/admin/keys", json={"name": "ops", "admin": True})
        assert admin.status_code == 201 and "first key" in admin.json()["notice"]
        admin_key = admin.json()["key"]
        assert call("GET", "/v1/admin/keys").status_code == 401  # keyed now
        team = call("POST", "/v1/admin/keys", admin_key, json={"name": "team", "budget_usd": 5, "budget_period": "30d"})
        assert team.status_code == 201 and "notice" not in team.json()
        assert team.json()["budget_period"] == "30d" and team.json()["period_start"] is not None
        edited = call("PATCH", "/v1/admin/keys/team", admin_key, json={"rpm": 7, "budget_period": None})
        assert edited.status_code == 200 and edited.json()["rpm"] == 7 and edited.json()["budget_period"] is None
        assert edited.json()["budget_usd"] == 5
        assert call("PATCH", "/v1/admin/keys/team", admin_key, json={"rpm": -1}).status_code == 400
        assert call("PATCH", "/v1/admin/keys/team", team.json()["key"], json={"rpm": 1}).status_code == 403
        rotated = call("POST", "/v1/admin/keys/team/rotate", admin_key)
        assert rotated.status_code == 200 and rotated.json()["key"] != team.json()["key"]
        assert _ask(url, team.json()["key"]).status_code == 401 and _ask(url, rotated.json()["key"]).status_code == 200
        assert "notice" not in call("DELETE", "/v1/admin/keys/team", admin_key).json()
        last = call("DELETE", "/v1/admin/keys/ops", admin_key)
        assert last.status_code == 200 and "configured mode" in last.json()["notice"]
        assert call("GET", "/v1/admin/keys").status_code == 200  # open again
