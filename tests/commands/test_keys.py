"""`selfroute keys create|list|revoke` on a data directory, and the created key at a gateway on it."""
from __future__ import annotations

import json

import httpx

from gateway.cli import main
from gateway.server.auth import Authenticator
from tests.gateway_fixtures import ledger_rows, make_policy, running_gateway


def test_create_prints_the_key_last_and_it_works_at_a_gateway(tmp_path, capsys, upstream, monkeypatch):
    assert main(["keys", "create", "alice", "--models", "openai/*", "selfroute", "--collections", "contracts",
                 "--budget-usd", "2", "--rpm", "60", "--tpm", "10000", "--expires", "30d",
                 "--data-dir", str(tmp_path)]) == 0
    key = capsys.readouterr().out.splitlines()[-1]
    assert key.startswith("sr-") and len(key) > 40

    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    with running_gateway(tmp_path, make_policy(upstream[0]), auth=Authenticator(admin_key="sk-admin")) as (url, app):
        answer = httpx.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                            json={"model": "openai/fake-cheap", "messages": [{"role": "user", "content": "a b"}]})
        assert answer.status_code == 200
        ledger_rows(app)

    assert main(["keys", "list", "--data-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["name", "prefix", "models"]
    row = table[1].split()
    assert row[:4] == ["alice", key[:12] + "...", "openai/*,selfroute", "contracts"]
    assert row[4] == "$2.00" and row[5].startswith("$0.0000") and row[-1] == "active"
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
    for url in (f"postgresql://app:{secret}@127.0.0.1:1/db", f"postgresql://app:{secret[:7]} {secret[7:]}@127.0.0.1:1/db",
                f"postgresql://app:{secret}@[::1:1/db"):
        for argv in (["keys", "list"], ["keys", "create", "alice"], ["keys", "revoke", "alice"]):
            assert main([*argv, "--data-dir", str(tmp_path), "--ledger-url", url]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"selfroute {' '.join(argv[:2])}: ") and "Traceback" not in err, err
            assert secret[:7] not in err and secret[7:] not in err, err
