"""`selfroute keys create|list|revoke` on a data directory, and the created key at a gateway on it."""

from __future__ import annotations

import json

import httpx

from gateway.cli import main
from gateway.server.auth import Authenticator
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import make_policy


def test_create_prints_the_key_last_and_it_works_at_a_gateway(tmp_path, capsys, upstream, monkeypatch):
    assert (
        main(
            [
                "keys",
                "create",
                "alice",
                "--models",
                "openai/*",
                "selfroute",
                "--collections",
                "contracts",
                "--budget-usd",
                "2",
                "--rpm",
                "60",
                "--tpm",
                "10000",
                "--expires",
                "30d",
                "--data-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    key = capsys.readouterr().out.splitlines()[-1]
    assert key.startswith("sr-") and len(key) > 40

    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    with running_gateway(tmp_path, make_policy(upstream[0]), auth=Authenticator(admin_key="sk-admin")) as (url, app):
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
            json={"model": "openai/fake-cheap", "messages": [{"role": "user", "content": "a b"}]},
        )
        assert answer.status_code == 200
        ledger_rows(app)

    assert main(["keys", "list", "--data-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["name", "prefix", "models"]
    row = table[1].split()
    assert row[:4] == ["alice", key[:12] + "...", "openai/*,selfroute", "contracts"]
    assert row[4] == "$2.00" and row[5] == "-" and row[6].startswith("$0.0000") and row[-1] == "active"
    assert key not in "\n".join(table)

    assert main(["logs", "--key", "alice", "--json", "--data-dir", str(tmp_path)]) == 0
    assert [json.loads(line)["key_id"] for line in capsys.readouterr().out.splitlines()] == ["alice"]

    assert main(["keys", "revoke", "alice", "--data-dir", str(tmp_path)]) == 0
    assert main(["keys", "list", "--json", "--data-dir", str(tmp_path)]) == 0
    [listed] = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert listed["active"] is False and listed["spend_usd"] > 0


def test_errors_are_messages_and_exit_statuses(tmp_path, capsys):
    assert main(["keys", "create", "bob", "--data-dir", str(tmp_path)]) == 0
    assert main(["keys", "create", "bob", "--data-dir", str(tmp_path)]) == 2
    assert main(["keys", "create", "k_bad", "--data-dir", str(tmp_path)]) == 2
    assert main(["keys", "create", "eve", "--expires", "soon", "--data-dir", str(tmp_path)]) == 2
    assert main(["keys", "revoke", "nobody", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "never reused" in err and "no key named 'nobody'" in err


def test_an_unreachable_or_malformed_ledger_url_is_a_message_without_the_password(tmp_path, capsys):
    secret = "Hunter2Secret"
    for url in (
        f"postgresql://app:{secret}@127.0.0.1:1/db",
        f"postgresql://app:{secret[:7]} {secret[7:]}@127.0.0.1:1/db",
        f"postgresql://app:{secret}@[::1:1/db",
    ):
        for argv in (["keys", "list"], ["keys", "create", "alice"], ["keys", "revoke", "alice"]):
            assert main([*argv, "--data-dir", str(tmp_path), "--ledger-url", url]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"selfroute {' '.join(argv[:2])}: ") and "Traceback" not in err, err
            assert secret[:7] not in err and secret[7:] not in err, err


def test_the_first_key_says_what_changes_and_revoking_the_last_reopens(tmp_path, capsys, upstream, monkeypatch):
    """No lock-out: the first key on an open gateway is announced with the way on (admin key, grants, revoke), the
    admin key comes from the CLI, an unowned collection is granted by edit, and revoking every key reopens it."""
    monkeypatch.delenv("SELFROUTE_API_KEYS", raising=False)
    monkeypatch.delenv("SELFROUTE_ADMIN_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    data = ["--data-dir", str(tmp_path)]
    with running_gateway(tmp_path, make_policy(upstream[0]), auth=Authenticator()) as (url, app):

        def ask(key: str) -> int:
            app.state.gateway.auth.forget()  # what the 2-second cache would do by itself
            return httpx.post(
                f"{url}/v1/chat/completions",
                headers={"authorization": f"Bearer {key}"},
                timeout=30,
                json={"model": "openai/fake-cheap", "messages": [{"role": "user", "content": "a"}]},
            ).status_code

        def admin(key: str) -> int:
            app.state.gateway.auth.forget()
            return httpx.get(f"{url}/v1/admin/keys", headers={"authorization": f"Bearer {key}"}, timeout=30).status_code

        assert ask("none") == 200 and admin("none") == 200  # open: anyone
        assert main(["keys", "create", "team", *data]) == 0
        captured = capsys.readouterr()
        team = captured.out.splitlines()[-1]
        assert "NOTICE: 'team' is the gateway's first key" in captured.err
        assert "selfroute keys create --admin" in captured.err and "selfroute keys revoke team" in captured.err
        assert "selfroute keys edit team --collections" in captured.err
        assert ask("none") == 401 and ask(team) == 200
        assert admin(team) == 403

        assert main(["keys", "create", "--admin", *data]) == 0
        captured = capsys.readouterr()
        admin_key = captured.out.splitlines()[-1]
        assert "NOTICE" not in captured.err and "created admin key 'admin'" in captured.out
        assert admin(admin_key) == 200 and admin(team) == 403

        assert main(["keys", "edit", "team", "--collections", "harbour", "--rpm", "5", *data]) == 0
        assert "collections=['harbour']" in capsys.readouterr().out
        assert main(["keys", "rotate", "team", *data]) == 0
        rotated = capsys.readouterr().out.splitlines()[-1]
        assert ask(team) == 401 and ask(rotated) == 200

        assert main(["keys", "list", "--json", *data]) == 0
        listed = {k["name"]: k for k in json.loads(capsys.readouterr().out)}
        assert listed["team"]["collections"] == ["harbour"] and listed["team"]["rpm"] == 5
        assert listed["admin"]["admin"] is True and listed["team"]["rotated_at"] is not None

        assert main(["keys", "revoke", "team", *data]) == 0
        assert "NOTICE" not in capsys.readouterr().err  # the admin key keeps it keyed
        assert ask("none") == 401
        assert main(["keys", "revoke", "admin", *data]) == 0
        err = capsys.readouterr().err
        assert "was the last key" in err and "OPEN again" in err
        assert ask("none") == 200 and admin("none") == 200


def test_a_budget_period_is_listed_and_edit_clears_limits(tmp_path, capsys):
    data = ["--data-dir", str(tmp_path)]
    assert main(["keys", "create", "kim", "--budget-usd", "10", "--budget-period", "30d", "--rpm", "9", *data]) == 0
    capsys.readouterr()
    assert main(["keys", "list", *data]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[5] == "period" and "30d from " in table[1]
    assert main(["keys", "edit", "kim", "--rpm", "none", "--budget-period", "none", *data]) == 0
    assert main(["keys", "list", "--json", *data]) == 0
    [kim] = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert kim["rpm"] is None and kim["budget_period"] is None and kim["budget_usd"] == 10
    assert main(["keys", "edit", "kim", *data]) == 2
    assert main(["keys", "create", "lee", "--budget-period", "monthly", *data]) == 2
    assert "cannot read budget period" in capsys.readouterr().err
