"""Per-key limits on a real gateway with two named keys: model allow-lists (403), budgets and rate limits
(429 with Retry-After), shared by two gateway processes' worth of apps on one data directory; and the
policy's pass-through allow-list for everyone."""

from __future__ import annotations

import contextlib
import math
import re
import subprocess
import sys
import time

import httpx
import openai
import pytest

from gateway.ledger.database import IDENTITY_CHECK_S
from gateway.ledger.keys import KeyStore
from gateway.server.auth import Authenticator
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.policies import DROP, make_policy, policy_data, rule

ADMIN = "sk-admin-test"


def _ask(
    url: str, key: str, model: str = "openai/fake-cheap", text: str = "a b c", max_tokens: int | None = None, **fields
) -> httpx.Response:
    bound = {} if max_tokens is None else {"max_tokens": max_tokens}
    return httpx.post(
        f"{url}/v1/chat/completions",
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
        json={"model": model, "messages": [{"role": "user", "content": text}], **bound, **fields},
    )


@pytest.fixture()
def keys(tmp_path):
    store = KeyStore(tmp_path / "ledger.sqlite3")
    yield store
    store.close()


@pytest.fixture()
def gateway(upstream, tmp_path, keys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    with running_gateway(tmp_path, make_policy(upstream[0]), auth=Authenticator(admin_key=ADMIN)) as (url, app):
        yield url, app


def test_model_allow_list_is_403_and_aliases_count(gateway, keys):
    url, _ = gateway
    _, cheap_only = keys.create("cheap-only", models=["openai/fake-*"])
    _, routed_only = keys.create("routed-only", models=["selfroute"])
    assert _ask(url, cheap_only).status_code == 200
    for key, model in [(cheap_only, "gpt-test"), (cheap_only, "selfroute"), (routed_only, "openai/fake-cheap")]:
        response = _ask(url, key, model)
        assert response.status_code == 403, model
        assert response.json()["error"]["code"] == "model_not_allowed"
    assert _ask(url, routed_only, "selfroute").status_code == 200
    listed = openai.OpenAI(base_url=f"{url}/v1", api_key=routed_only).models.list()
    assert [m.id for m in listed.data] == ["selfroute"]


def test_budget_is_429_once_the_ledger_records_it_spent(gateway, keys):
    url, app = gateway
    # at the policy's prices a request reserves $0.000018 with max_tokens 4 (10 prompt tokens counted, 4 of
    # completion) and costs $0.000011 (3 + 4 tokens): the second's reservation does not fit in what is left
    _, small = keys.create("small", budget_usd=0.00002)
    _, other = keys.create("other", budget_usd=1.0)
    assert _ask(url, small, max_tokens=4).status_code == 200
    ledger_rows(app)  # flush: spend is what the ledger recorded
    refused = _ask(url, small, max_tokens=4)
    assert refused.status_code == 429
    assert "more than the $0.0000 left" in refused.json()["error"]["message"]
    assert "retry-after" not in refused.headers  # a budget for life does not come back
    assert refused.json()["error"] == {
        "message": refused.json()["error"]["message"],
        "type": "rate_limit_error",
        "param": None,
        "code": "budget_exceeded",
    }
    assert _ask(url, other).status_code == 200  # the other key's budget is its own
    assert keys.spend(["small"])["small"] == pytest.approx(0.000011)


def test_rpm_is_429_with_retry_after_across_two_apps_on_one_database(gateway, keys, upstream, tmp_path):
    url, _ = gateway
    _, free = keys.create("free")
    with running_gateway(tmp_path, make_policy(upstream[0]), auth=Authenticator(admin_key=ADMIN)) as (url2, _):
        for attempt in range(2):  # requests per calendar minute: start again if a minute ended mid-test
            _, limited = keys.create(f"limited-{attempt}", rpm=3)
            started = time.time()
            statuses = [_ask(u, limited).status_code for u in (url, url2, url)]
            refused = _ask(url2, limited)
            if started // 60 == time.time() // 60:
                break
    assert statuses == [200, 200, 200]
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert _ask(url, free).status_code == 200


@contextlib.contextmanager
def _locked_by_another_process(path):
    """The SQLite file held under an exclusive lock (no other connection may write) by another process until the
    block ends, as `sqlite3 ledger.sqlite3` with `BEGIN EXCLUSIVE` left open would."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], timeout=10); c.execute('BEGIN EXCLUSIVE');"
            " print('locked', flush=True); sys.stdin.read()",
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)


def test_a_sqlite_ledger_locked_by_another_process_is_down_after_a_short_wait(gateway, keys, tmp_path):
    """A locked file takes the outage path, as a PostgreSQL that is down does: after a short wait (not the 30 s busy
    timeout) a key without limits is answered, its rows spooled and replayed once the lock goes; a key with limits
    gets 503 ledger_unavailable (its limits cannot be checked)."""
    url, app = gateway
    _, free = keys.create("free")
    _, budgeted = keys.create("budgeted", budget_usd=100.0)
    _, paced = keys.create("paced", rpm=1000)
    assert [_ask(url, k).status_code for k in (free, budgeted, paced)] == [200, 200, 200]  # connections open
    with _locked_by_another_process(tmp_path / "ledger.sqlite3"):
        started = time.monotonic()
        answered = [_ask(url, free, text=f"while locked {i}") for i in range(3)]
        refused = [_ask(url, budgeted), _ask(url, paced)]
        took = time.monotonic() - started
    assert [r.status_code for r in answered] == [200, 200, 200]
    assert [(r.status_code, r.json()["error"]["code"]) for r in refused] == [(503, "ledger_unavailable")] * 2
    assert took < 20, took  # waiting out the busy timeout: 30 s for each of the five
    ids = {r.headers["x-selfroute-request-id"] for r in answered}
    deadline = time.monotonic() + 30
    while True:  # the writer replays the spooled rows once the file can be written again
        found = [row for row in ledger_rows(app) if row["id"] in ids]
        if len(found) == len(ids) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sorted((row["id"], row["status"]) for row in found) == sorted((i, 200) for i in ids)
    assert [row for row in ledger_rows(app, "requests_in_flight") if row["request_id"] in ids] == []


def test_a_sqlite_ledger_deleted_under_the_gateway_is_reopened_at_its_path(upstream, tmp_path, monkeypatch):
    """`rm ledger.sqlite3` under a running gateway: the rows of what it answers afterwards go to a new file at the
    path (migrated as at start), not to the unlinked inode a restart never sees; a key made then, with a budget,
    is reserved and recorded there too."""
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    auth = Authenticator(keys=["sk-env"], admin_key=ADMIN)
    with running_gateway(tmp_path, make_policy(upstream[0]), auth=auth) as (url, app):
        _, before = app.state.gateway.keys.create("before")
        assert [_ask(url, k).status_code for k in ("sk-env", before)] == [200, 200]  # every connection open
        ledger_rows(app)
        path = app.state.gateway.ledger.path
        path.unlink()  # its -wal and -shm stay, as after `rm ledger.sqlite3`
        time.sleep(IDENTITY_CHECK_S)  # rows written sooner go with the deleted file
        answered = [_ask(url, "sk-env", text=f"after the file went {i}") for i in range(3)]
        _, budgeted = app.state.gateway.keys.create("budgeted", budget_usd=1.0)
        answered.append(_ask(url, budgeted))
        assert [r.status_code for r in answered] == [200] * 4
        ids = {r.headers["x-selfroute-request-id"] for r in answered}
        found = {row["id"]: row["key_id"] for row in ledger_rows(app) if row["id"] in ids}
        assert len(found) == 4 and sorted(found.values())[0] == "budgeted"
        assert ledger_rows(app, "requests_in_flight") == []
        assert app.state.gateway.keys.spend(["budgeted"])["budgeted"] > 0


def test_tpm_is_429_with_retry_after(gateway, keys):
    url, app = gateway
    _, limited = keys.create("tokens", tpm=20)
    assert _ask(url, limited, max_tokens=4).status_code == 200  # reserves 10 + 4 tokens, uses 3 + 4
    ledger_rows(app)
    refused = _ask(url, limited, max_tokens=4)  # 7 used and 14 asked for: past 20
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 60


def test_env_keys_and_the_admin_key_keep_working_beside_named_keys(upstream, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    auth = Authenticator(keys=["sk-env"], admin_key=ADMIN)
    with running_gateway(tmp_path, make_policy(upstream[0]), auth=auth) as (url, app):
        _, named = app.state.gateway.keys.create("named")
        assert [_ask(url, k).status_code for k in ("sk-env", ADMIN, named)] == [200, 200, 200]
        assert _ask(url, "sk-wrong").status_code == 401
        assert [r["key_id"] for r in ledger_rows(app)][-1] == "named"


PASSTHROUGH_POLICY = {"passthrough": {"allow": ["openai/*"]}}


def test_policy_passthrough_allow_list_holds_for_everyone(upstream, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    with running_gateway(tmp_path, make_policy(upstream[0], **PASSTHROUGH_POLICY)) as (url, _):
        refused = _ask(url, "any", "gpt-test")
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"
        assert _ask(url, "any", "openai/fake-cheap").status_code == 200
        assert _ask(url, "any", "selfroute").status_code == 200


DEFAULT_PASSTHROUGH_POLICY = {"passthrough": DROP}
ALLOW_ALL_POLICY: dict = {}  # the test policy's own passthrough, allow: ["*"]


def test_local_services_and_unnamed_models_are_refused_by_default(upstream, tmp_path, monkeypatch):
    """issue 21: with passthrough.allow at its default, {"model": "ollama/llama3"} made the gateway POST to
    localhost:11434 and `local/smollm2...` ran in-process for any key. Now only the policy's models pass, and a
    wildcard never reaches a local service's provider: the local service (a capture server) sees nothing."""
    from tests.support.capture import capture_server

    assert "passthrough" not in policy_data(upstream[0], **DEFAULT_PASSTHROUGH_POLICY)
    with capture_server() as ollama:
        monkeypatch.setenv("OLLAMA_API_BASE", ollama.url)
        monkeypatch.setenv("LLAMAFILE_API_BASE", ollama.url + "/v1")
        monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
        for n, overrides in enumerate((DEFAULT_PASSTHROUGH_POLICY, ALLOW_ALL_POLICY)):  # the default, allow: ["*"]
            with running_gateway(tmp_path / str(n), make_policy(upstream[0], **overrides)) as (url, _):
                for model in ("ollama/llama3", "llamafile/x", "local/smollm2-135m-instruct"):
                    for stream in (False, True):
                        refused = httpx.post(
                            f"{url}/v1/chat/completions",
                            timeout=30,
                            json={"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]},
                        )
                        assert refused.status_code == 403, (model, refused.text)
                        assert refused.json()["error"]["code"] == "model_not_allowed"
                assert _ask(url, "any", "openai/fake-cheap").status_code == 200  # the policy's own model
                assert _ask(url, "any", "gpt-test").status_code == (
                    403 if overrides is DEFAULT_PASSTHROUGH_POLICY else 200
                )
        assert ollama.connections == []


def test_a_provider_error_carries_no_traceback_or_path(upstream, tmp_path, monkeypatch):
    """huggingface/x answered with litellm's traceback, file paths of the install included."""
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz123456")
    with running_gateway(tmp_path, make_policy(upstream[0])) as (url, _):
        response = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=60,
            json={"model": "huggingface/x", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert 400 <= response.status_code < 600 and response.status_code != 500, response.text
    text = response.text
    assert "Traceback" not in text and ".py" not in text and "site-packages" not in text, text
    assert "hf_abcdefghijklmnopqrstuvwxyz123456" not in text


# ------------------------------------------------------------------------------ reservations: bursts, disconnects

PRICED = {"input_cost_per_mtok": 1000.0, "output_cost_per_mtok": 2000.0}
PRICED_POLICY = {
    "cheap": {"model": "openai/sleep-1", **PRICED, "context_window": DROP},
    "long": {"model": "openai/dribble-long", **PRICED},
    "passthrough": DROP,
}
SLOW = "openai/sleep-1"  # answers after a second: a burst's requests are all in flight at once
DRIBBLE = "openai/dribble-long"  # streams a word every 0.25 s for 10 s, usage at the end
# "a b c" with max_tokens 10: reserved 10 prompt tokens (3 + 4 + 3 of overhead) + 10 = $0.03; the fake upstream
# reports 3 + 4 words: $0.011
RESERVATION_USD = 10 * 0.001 + 10 * 0.002
COST_USD = 3 * 0.001 + 4 * 0.002


@pytest.fixture(params=["sqlite", "postgresql"])
def priced(request, upstream, tmp_path, monkeypatch):
    """(url, app, rows()) of a gateway on SQLite or PostgreSQL with the priced slow models."""
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    kwargs = {}
    if request.param == "postgresql":
        kwargs["ledger_url"] = request.getfixturevalue("postgres_url")
    with running_gateway(
        tmp_path, make_policy(upstream[0], **PRICED_POLICY), auth=Authenticator(admin_key=ADMIN), **kwargs
    ) as (url, app):
        yield url, app, lambda table="requests": _rows(app, table)


def _rows(app, table: str) -> list[dict]:
    ledger = app.state.gateway.ledger
    ledger.flush()
    if ledger.path is not None:
        return ledger_rows(app, table)
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(str(ledger.location), row_factory=dict_row) as conn:
        return list(conn.execute(f"SELECT * FROM {table}"))


def _burst(url: str, key: str, n: int = 20, **body) -> list[int]:
    import concurrent.futures

    def one(_):
        return httpx.post(
            f"{url}/v1/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            timeout=60,
            json={"model": SLOW, "max_tokens": 10, "messages": [{"role": "user", "content": "a b c"}], **body},
        ).status_code

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_bursts_of_20_never_pass_a_budget(priced):
    """$0.05 budget, bursts of 20 concurrent requests until one is refused whole: the spend ends within one
    reservation below the budget, never past it (before round seven: all 20 of the first burst passed, $0.22, 4.3x;
    until round eleven the last request let in could pass it by its reservation)."""
    url, app, rows = priced
    keys = app.state.gateway.keys
    _, key = keys.create("burst", budget_usd=0.05)
    answered = []
    for _ in range(8):
        statuses = _burst(url, key)
        assert set(statuses) <= {200, 429}
        answered.append(statuses.count(200))
        if not answered[-1]:
            break
    assert answered[0] < 20 and answered[-1] == 0
    mine = [r for r in rows() if r["key_id"] == "burst"]
    spent = sum(r["cost_usd"] for r in mine)
    assert sum(answered) == sum(1 for r in mine if r["status"] == 200)
    assert spent == pytest.approx(sum(answered) * COST_USD)
    assert 0.05 - RESERVATION_USD <= spent <= 0.05
    assert keys.spend(["burst"])["burst"] == pytest.approx(spent)
    assert rows("requests_in_flight") == []  # every reservation settled by its request's row
    refused = [r for r in mine if r["status"] == 429]
    assert refused and all(r["cost_usd"] == 0 for r in refused)


def test_a_burst_of_20_never_passes_tpm(priced):
    """TPM 300, 20 concurrent requests of ~120 tokens each: the tokens of the minute stay within the limit (before
    round seven: TPM 3,000 let 8,060 through; until round eleven the last one let in could pass it)."""
    url, app, rows = priced
    _, key = app.state.gateway.keys.create("tpm", tpm=300)
    text = " ".join(["tok"] * 100)  # 107 prompt tokens reserved, 30 of completion; the fake reports 100 + 21
    statuses = _burst(url, key, messages=[{"role": "user", "content": text}], max_tokens=30)
    assert 1 <= statuses.count(200) < 20 and set(statuses) == {200, 429}
    used = sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows() if r["key_id"] == "tpm")
    assert used <= 300  # a reservation must fit in what the window has left
    assert rows("requests_in_flight") == []


def _wait_rows(rows, predicate, timeout: float = 15.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        found = [r for r in rows() if predicate(r)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_clients_that_leave_early_are_charged_and_refused_once_the_budget_is_spent(priced):
    """The attack: a $0.05 budget and clients that disconnect before the answer (plain requests with a short
    client timeout, streams closed after the first event). Before, 60 such requests were all ledgered at $0.00
    and never refused. Now each 499 carries the upstream's usage or, when none arrived, the estimate, and the key
    is refused once that is spent."""
    url, app, rows = priced
    _, key = app.state.gateway.keys.create("leaver", budget_usd=0.05)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    outcomes = []
    for attempt in range(60):
        try:
            if attempt % 2:  # plain, the client gives up after 0.3 s of a 1 s answer
                response = httpx.post(
                    f"{url}/v1/chat/completions",
                    headers={"authorization": f"Bearer {key}"},
                    timeout=0.3,
                    json={"model": SLOW, "max_tokens": 10, "messages": [{"role": "user", "content": "a b c"}]},
                )
                if response.status_code == 429:
                    assert response.json()["error"]["code"] == "budget_exceeded"
                    outcomes.append("refused")
                    break
                outcomes.append("answered")
            else:  # a stream read to its first event, then closed
                stream = client.chat.completions.create(
                    model=DRIBBLE, max_tokens=10, stream=True, messages=[{"role": "user", "content": "a b c"}]
                )
                next(iter(stream))
                stream.close()
                outcomes.append("left")
        except httpx.ReadTimeout:
            outcomes.append("left")
        except openai.RateLimitError as exc:
            assert exc.body["code"] == "budget_exceeded"
            outcomes.append("refused")
            break
        # the gateway ledgers the leaver's request a moment after the client has gone
        assert _wait_rows(
            rows,
            lambda r, seen=attempt: (
                r["key_id"] == "leaver"
                and r["status"] == 499
                and len([x for x in rows() if x["key_id"] == "leaver"]) > seen
            ),
        )
    # the stream is charged its prompt's estimate and a token a chunk it was sent, the plain request its whole
    # reservation ($0.03: nobody knows how much of it the provider wrote); a third $0.03 reservation does not fit
    assert outcomes == ["left", "left", "refused"]
    left = sorted((r for r in rows() if r["key_id"] == "leaver" and r["status"] == 499), key=lambda r: r["created_at"])
    assert len(left) == len(outcomes) - 1
    streamed, plain = left
    assert 10 * 0.001 < streamed["cost_usd"] <= 10 * 0.001 + 3 * 0.002  # 10 prompt tokens, 1-3 chunks relayed
    assert plain["cost_usd"] == pytest.approx(RESERVATION_USD)
    legs = [c for c in rows("upstream_calls") if c["request_id"] in {r["id"] for r in left}]
    assert len(legs) == len(left) and all("charged at the estimate" in c["error"] for c in legs)
    assert 0.05 - RESERVATION_USD <= sum(r["cost_usd"] for r in left) <= 0.05
    assert rows("requests_in_flight") == []


def test_a_stream_the_upstream_breaks_is_charged_its_prompt_and_what_it_sent(upstream, tmp_path, monkeypatch):
    """probe11: a stream the upstream cut after sending content (or that timed out) was recorded at $0 and 0 prompt
    tokens, though the provider had read the prompt. Now, as for a client that leaves: the prompt's estimate and a
    token a chunk relayed."""
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    policy = make_policy(upstream[0], cheap={"model": "openai/breaks-cheap", **PRICED}, passthrough=DROP)
    with running_gateway(tmp_path, policy, auth=Authenticator(admin_key=ADMIN)) as (url, app):
        with httpx.stream(
            "POST",
            f"{url}/v1/chat/completions",
            headers={"authorization": f"Bearer {ADMIN}"},
            json={
                "model": "openai/breaks-cheap",
                "stream": True,
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "a b c"}],
            },
            timeout=30,
        ) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert "error" in events[-2] and events[-1] == "data: [DONE]"
        [row] = ledger_rows(app)
        [leg] = ledger_rows(app, "upstream_calls")
    assert row["status"] == 502 and "charged at the estimate's prompt" in leg["error"]
    assert (leg["prompt_tokens"], leg["completion_tokens"]) == (10, 1)  # one chunk was sent before the cut
    assert row["cost_usd"] == pytest.approx(10 * 0.001 + 1 * 0.002)


def test_a_request_that_fails_before_any_upstream_call_releases_its_reservation(priced):
    url, app, rows = priced
    # a named collection's size is not known at admission: each reserves the model's whole window ($40.58 at these
    # prices), which must fit in the budget to be let in; none may keep it
    _, key = app.state.gateway.keys.create("release", budget_usd=50.0)
    for _ in range(3):
        missing = httpx.post(
            f"{url}/v1/chat/completions",
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
            json={
                "model": "selfroute",
                "messages": [{"role": "user", "content": "a b c"}],
                "selfroute": {"collection": "nope"},
            },
        )
        assert missing.status_code == 404, missing.text
    assert rows("requests_in_flight") == []
    assert [r["cost_usd"] for r in rows() if r["key_id"] == "release"] == [0, 0, 0]
    assert _burst(url, key, n=1) == [200]  # nothing was held against the budget


def test_a_request_whose_bound_does_not_fit_what_the_key_has_left_is_refused(gateway, keys):
    """probe11: only what was spent or reserved was compared with the limits, so one request of any size got in:
    $0.37 spent on a $0.01 budget by one request with a 200 kB document, 2,000 tokens through a TPM of 50. Now its
    own reservation must fit too; a TPM it can never fit in says so (OpenAI's "Request too large")."""
    url, app = gateway
    _, small = keys.create("tiny-budget", budget_usd=0.001)
    refused = _ask(url, small)  # no max_tokens: 4,096 tokens of completion reserved, $0.0082
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
    assert "could cost up to $0.0082" in refused.json()["error"]["message"]
    assert "max_tokens" in refused.json()["error"]["message"]
    assert _ask(url, small, text=" ".join(["word"] * 2000), max_tokens=4).status_code == 429  # $0.002 of prompt
    assert _ask(url, small, max_tokens=4).status_code == 200  # $0.000018: fits
    # both bounds go upstream: the larger is reserved (it was max_completion_tokens alone, 1 token)
    both = _ask(url, small, max_tokens=100_000, max_completion_tokens=1)
    assert both.status_code == 429 and both.json()["error"]["code"] == "budget_exceeded"
    _, narrow = keys.create("tiny-tpm", tpm=50)
    too_large = _ask(url, narrow, text=" ".join(["word"] * 2000), max_tokens=4)
    assert too_large.status_code == 429 and too_large.json()["error"]["code"] == "rate_limit_exceeded"
    assert "more than this key's limit of 50 tokens per minute" in too_large.json()["error"]["message"]
    assert _ask(url, narrow, max_tokens=4).status_code == 200
    ledger_rows(app)
    assert keys.spend(["tiny-budget"])["tiny-budget"] <= 0.001
    assert ledger_rows(app, "requests_in_flight") == []


def test_a_budget_per_period_says_when_it_comes_back(gateway, keys):
    url, app = gateway
    _, periodic = keys.create("hourly", budget_usd=0.00002, budget_period_s=3600)
    assert _ask(url, periodic, max_tokens=4).status_code == 200
    ledger_rows(app)
    refused = _ask(url, periodic, max_tokens=4)
    assert refused.status_code == 429 and "budget of $2e-05 for this period" in refused.json()["error"]["message"]
    start = keys.get("hourly").period_start()
    assert 1 <= int(refused.headers["retry-after"]) <= math.ceil(start + 3600 - time.time()) + 1


def test_rate_limit_headers_as_openai_sends_them(gateway, keys):
    url, app = gateway
    _, limited = keys.create("headers", rpm=5, tpm=100_000)
    _, unlimited = keys.create("no-limits")
    for attempt in range(2):  # requests per calendar minute: start again if a minute ended mid-test
        started = time.time()
        answers = [_ask(url, limited) for _ in range(2)]
        ledger_rows(app)
        streamed = httpx.post(
            f"{url}/v1/chat/completions",
            headers={"authorization": f"Bearer {limited}"},
            json={"model": "openai/fake-cheap", "stream": True, "messages": [{"role": "user", "content": "a b c"}]},
        )
        if started // 60 == time.time() // 60:
            break
        _, limited = keys.create(f"headers-{attempt}", rpm=5, tpm=100_000)
    first, second = answers
    assert [a.status_code for a in answers] == [200, 200] and streamed.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "5"
    assert [a.headers["x-ratelimit-remaining-requests"] for a in (first, second, streamed)] == ["4", "3", "2"]
    assert re.fullmatch(r"(\d+s|\d+ms|1m0s)", first.headers["x-ratelimit-reset-requests"])
    assert first.headers["x-ratelimit-limit-tokens"] == "100000"
    used = ledger_rows(app)[0]["prompt_tokens"] + ledger_rows(app)[0]["completion_tokens"]
    assert int(second.headers["x-ratelimit-remaining-tokens"]) == 100_000 - used  # what the ledger had recorded
    assert "x-ratelimit-limit-requests" not in _ask(url, unlimited).headers  # a key without limits: none
    with openai.OpenAI(base_url=f"{url}/v1", api_key=limited, max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="openai/fake-cheap", messages=[{"role": "user", "content": "x"}]
        )
        assert raw.headers["x-ratelimit-remaining-requests"] == "1"


def test_a_refused_request_tells_its_windows_too(gateway, keys):
    url, _ = gateway
    for attempt in range(2):
        _, limited = keys.create(f"tiny-{attempt}", rpm=1)
        started = time.time()
        _ask(url, limited)
        refused = _ask(url, limited)
        if started // 60 == time.time() // 60:
            break
    assert refused.status_code == 429
    assert (refused.headers["x-ratelimit-limit-requests"], refused.headers["x-ratelimit-remaining-requests"]) == (
        "1",
        "0",
    )
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")


def test_reset_text():
    from gateway.server.limits import reset_text

    assert [reset_text(s) for s in (0.25, 0.0, 17.2, 60, 61.5, 359.9)] == [
        "250ms",
        "0ms",
        "18s",
        "1m0s",
        "1m2s",
        "6m0s",
    ]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_negative_completion_bound_cannot_buy_spend_back(priced, field):
    """The attack (probe, round seven): a stream with max_tokens -10**9, closed after its first event, was charged
    at its estimate: -10**9 completion tokens, -$2,000,000 of spend, and the key's budget never ran out. A bound
    that is not a positive token count is a 400 before anything is reserved or sent."""
    url, app, rows = priced
    _, key = app.state.gateway.keys.create(f"negative-{field}", budget_usd=0.05)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    for bound in (-(10**9), 0, 2**70):
        with pytest.raises(openai.BadRequestError) as refused:
            stream = client.chat.completions.create(
                model=DRIBBLE, stream=True, messages=[{"role": "user", "content": "a b c"}], **{field: bound}
            )
            next(iter(stream))
            stream.close()
        assert refused.value.body["code"] == "invalid_value" and refused.value.body["param"] == field
    mine = [r for r in rows() if r["key_id"] == f"negative-{field}"]
    assert all(r["cost_usd"] >= 0 for r in mine) and keys_spend(app, f"negative-{field}") >= 0
    assert rows("requests_in_flight") == []


def keys_spend(app, name: str) -> float:
    return app.state.gateway.keys.spend([name])[name]


EMBEDDER = "local/all-minilm-l6-v2"  # the gateway's own embedding model, as its legs are recorded
WORDS = "the pump at berth seven opens the valve before the tide"  # one token a word for tiktoken and MiniLM alike


def test_the_documents_an_explain_embeds_count_in_its_row_against_tpm(upstream, tmp_path, keys, monkeypatch):
    """The probe (round eight): an explain's finished row released its reservation and recorded 0 tokens, so
    explains one after another with new ~10k-token documents were limited by nothing but --rpm. Now the tokens its
    planning embedded are a leg of the gateway's embedding model in its row, counted in the key's TPM window."""
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    # a rule on a retrieval feature: planning runs the retrieval pass, which embeds new documents (as with the
    # shipped classifier)
    retrieving = make_policy(upstream[0], routing={"rules": [rule("never", "top_score", ">", 2.0, "rag")]})
    _, key = keys.create("explainer", tpm=25_000)
    text = " ".join([WORDS] * 910)  # 10,010 tokens

    def explain_body(i: int) -> dict:
        return {
            "model": "selfroute",
            "messages": [{"role": "user", "content": "When does the valve open?"}],
            "selfroute": {"documents": [{"id": f"d{i}", "text": f"{i} {text}"}]},
        }

    def explain(url: str, key: str, i: int) -> httpx.Response:
        return httpx.post(
            f"{url}/v1/route/explain", headers={"authorization": f"Bearer {key}"}, json=explain_body(i), timeout=300
        )

    with running_gateway(tmp_path, retrieving, auth=Authenticator(admin_key=ADMIN)) as (url, app):
        statuses = []
        for i in range(3):
            statuses.append(explain(url, key, i).status_code)
            ledger_rows(app)  # flush: the window is what the ledger recorded
        rows = [r for r in ledger_rows(app) if r["key_id"] == "explainer" and r["status"] == 200]
        legs = [c for c in ledger_rows(app, "upstream_calls") if c["request_id"] in {r["id"] for r in rows}]
        chats = []  # a chat with new documents records them too; asking again about them embeds nothing
        for _ in range(2):
            chats.append(
                httpx.post(
                    f"{url}/v1/chat/completions",
                    headers={"authorization": f"Bearer {ADMIN}"},
                    json={**explain_body(7), "max_tokens": 8},
                    timeout=300,
                ).headers["x-selfroute-request-id"]
            )
            app.state.gateway.store.wait_inline(60)  # its background embedding done: the store holds them
        calls = ledger_rows(app, "upstream_calls")
        embedded = [
            [c["prompt_tokens"] for c in calls if c["request_id"] == i and c["model"] == EMBEDDER] for i in chats
        ]
    assert embedded == [[10_011], []]
    assert statuses == [200, 200, 429]  # the window holds 20,022 tokens after two: a third 10,011 do not fit
    assert [r["prompt_tokens"] for r in rows] == [10_011, 10_011]
    assert [(c["model"], c["prompt_tokens"]) for c in legs] == [(EMBEDDER, 10_011)] * 2


@pytest.mark.parametrize("endpoint", ["embeddings", "documents", "explain"])
def test_a_burst_of_embedding_work_never_passes_tpm(gateway, keys, endpoint):
    """The probe's finding (round seven): embeddings and added documents reserved no tokens, so 20 at once all
    passed a key's TPM (230,000 tokens in a minute against 20,000). Now each holds its inputs' tokens. Round eight:
    the same for explain with attached documents, which it embeds to plan (10 at once had all passed)."""
    url, app = gateway
    _, key = keys.create(f"tpm-{endpoint}", tpm=1000)
    text = " ".join([WORDS] * 30)  # 330 tokens

    def one(i: int) -> int:
        if endpoint == "embeddings":
            body = {"model": "local/all-minilm-l6-v2", "input": [f"{i} {text}"]}
            path = "/v1/embeddings"
        elif endpoint == "explain":
            body = {
                "model": "selfroute",
                "messages": [{"role": "user", "content": "When does the valve open?"}],
                "selfroute": {"documents": [{"id": f"d{i}", "text": f"{i} {text}"}]},
            }
            path = "/v1/route/explain"
        else:
            body = {"documents": [{"id": f"d{i}", "text": f"{i} {text}"}]}
            path = f"/v1/collections/burst-{i}/documents"
        return httpx.post(
            f"{url}{path}", headers={"authorization": f"Bearer {key}"}, json=body, timeout=300
        ).status_code

    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        statuses = list(pool.map(one, range(20)))
    assert set(statuses) <= {200, 201, 429} and 1 <= statuses.count(429) < 20
    used = sum(r["prompt_tokens"] for r in ledger_rows(app) if r["key_id"] == f"tpm-{endpoint}")
    assert used <= 1000


def _chat_legs(app, request_ids: list[str]) -> list[list[int]]:
    calls = ledger_rows(app, "upstream_calls")
    return [[c["prompt_tokens"] for c in calls if c["request_id"] == i and c["model"] == EMBEDDER] for i in request_ids]


def test_the_long_prompt_s_unit_scores_record_the_documents_they_embed(upstream, tmp_path, monkeypatch):
    """No retrieval pass (no classifier, no retrieval rule): the long route's prompt is packed from attached documents
    over its window, its units scored by the store (StoreScorer), which embeds new documents: those tokens were
    recorded as 0 (round eight). Now a leg of the gateway's embedding model, once: asking again embeds nothing."""
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    text = " ".join([WORDS] * 1820)  # 20,020 tokens: past the long model's 16,000-token window, so units are scored
    body = {
        "model": "selfroute",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "When does the valve open?"}],
        "selfroute": {"documents": [{"id": "d", "text": f"1 {text}"}]},
    }
    with running_gateway(tmp_path, make_policy(upstream[0]), auth=Authenticator(admin_key=ADMIN)) as (url, app):
        ids = []
        for _ in range(2):
            answer = httpx.post(
                f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {ADMIN}"}, json=body, timeout=300
            )
            assert answer.status_code == 200, answer.text
            ids.append(answer.headers["x-selfroute-request-id"])
            app.state.gateway.store.wait_inline(120)
        routes = {r["id"]: r["route"] for r in ledger_rows(app)}
        assert _chat_legs(app, ids) == [[20_021], []]
    assert [routes[i] for i in ids] == ["long", "long"]


def test_requests_for_the_same_new_documents_at_once_are_charged_their_embedding_once(upstream, tmp_path, monkeypatch):
    """Four requests with the same new documents at once: one ingestion (single flight), whose tokens every one of them
    was charged (round eight: each saw the store without them). Now only the request whose call started it records
    them; the others waited for it or read its first pass, and their rows carry no embedding leg."""
    import concurrent.futures

    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    retrieving = make_policy(upstream[0], routing={"rules": [rule("never", "top_score", ">", 2.0, "rag")]})
    text = " ".join([WORDS] * 910)
    body = {
        "model": "selfroute",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "When does the valve open?"}],
        "selfroute": {"documents": [{"id": "d", "text": f"2 {text}"}]},
    }
    with running_gateway(tmp_path, retrieving, auth=Authenticator(admin_key=ADMIN)) as (url, app):

        def ask(_: int) -> str:
            answer = httpx.post(
                f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {ADMIN}"}, json=body, timeout=300
            )
            assert answer.status_code == 200, answer.text
            return answer.headers["x-selfroute-request-id"]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            ids = list(pool.map(ask, range(4)))
        app.state.gateway.store.wait_inline(120)
        legs = _chat_legs(app, ids)
    assert sorted(legs) == [[], [], [], [10_011]]


def test_chat_admission_reserves_the_embedding_of_new_documents(upstream, tmp_path, keys, monkeypatch):
    """A routed chat with new attached documents embeds them ($0, tokens in the key's TPM window) but its reservation
    held only the cheap and long legs (round eight), so concurrent chats passed the key's TPM: three at once with new
    ~10k-token documents each under 56,000 were all let in and recorded 60,246 tokens. The reservation now holds
    the documents' embedding too (10,011 tokens more each); the finished rows record what was spent."""
    import concurrent.futures

    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    retrieving = make_policy(upstream[0], routing={"rules": [rule("never", "top_score", ">", 2.0, "rag")]})
    _, key = keys.create("chatter", tpm=56_000)
    text = " ".join([WORDS] * 910)

    def ask(i: int) -> int:
        body = {
            "model": "selfroute",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "When does the valve open?"}],
            "selfroute": {"documents": [{"id": f"d{i}", "text": f"{i} {text}"}]},
        }
        return httpx.post(
            f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json=body, timeout=300
        ).status_code

    with running_gateway(tmp_path, retrieving, auth=Authenticator(admin_key=ADMIN)) as (url, app):
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            statuses = list(pool.map(ask, range(3)))
        app.state.gateway.store.wait_inline(120)
        rows = [r for r in ledger_rows(app) if r["key_id"] == "chatter" and r["status"] == 200]
    assert 200 in statuses and set(statuses) <= {200, 429}
    spent = sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
    assert spent <= 56_000, (statuses, spent)


def test_a_large_request_is_counted_off_the_ledger_writer_so_other_keys_do_not_wait(gateway, keys, monkeypatch):
    """probe10: a reservation's estimate was counted on the ledger's one writer thread, so routed requests with a
    479 kB document held every other key's request behind their tiktoken passes (pass-through p50 34 ms alone,
    2.3-6.0 s beside them). A large body is now counted in a worker thread: here three requests whose counting
    takes 1.5 s each do not hold up another key's small request, and none is counted on the writer thread."""
    import concurrent.futures
    import threading

    from gateway.server import limits

    url, _ = gateway
    counted_on: list[str] = []
    count = limits.count_tokens

    def slow_count(text: str) -> int:
        if len(text) > limits.WRITER_COUNT_BYTES:
            counted_on.append(threading.current_thread().name)
            time.sleep(1.5)
        return count(text)

    monkeypatch.setattr(limits, "count_tokens", slow_count)
    _, heavy = keys.create("heavy")
    _, light = keys.create("light")
    big = " ".join(["clause"] * 8_000)  # 56 kB

    def timed(key: str, text: str) -> tuple[int, float]:
        started = time.perf_counter()
        status = _ask(url, key, text=text).status_code
        return status, time.perf_counter() - started

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        heavies = [pool.submit(timed, heavy, big) for _ in range(3)]
        time.sleep(0.4)  # the three are counting
        status, waited = timed(light, "a b c")
        assert [f.result()[0] for f in heavies] == [200, 200, 200]
    assert status == 200
    assert waited < 1.0, f"the small request waited {waited:.2f} s behind the large ones' counting"
    assert len(counted_on) == 3 and "selfroute-ledger" not in counted_on, counted_on


def test_a_long_document_s_count_is_kept_per_key(monkeypatch):
    """The same long document in a key's next request is hashed, not tokenised again; another key's request
    counts it for itself (no key learns from its reservation's time what another key sent)."""
    from gateway.server import limits
    from pipelines.cache import LockedLRU
    from pipelines.scope import KeyScope

    a, b = KeyScope("a"), KeyScope("b")
    calls: list[int] = []
    capped = limits.capped_tokens

    def counting(text: str, cap: int) -> int:
        calls.append(len(text))
        return capped(text, cap)

    monkeypatch.setattr(limits, "capped_tokens", counting)
    monkeypatch.setattr(limits, "_counts", LockedLRU(8))
    document = "the valve opens at dawn. " * 1_000  # 25 kB, past COUNTED_CHARS
    first = limits.document_tokens(document, 100_000, a)
    assert limits.document_tokens(document, 100_000, a) == first and len(calls) == 1
    assert limits.document_tokens(document, 100_000, b) == first and len(calls) == 2
    assert limits.document_tokens(document + ".", 100_000, a) >= first and len(calls) == 3
    assert limits.document_tokens("short", 100_000, a) == limits.document_tokens("short", 100_000, a)
    assert len(calls) == 5  # short texts are counted, not kept
