"""`selfroute serve` as a real process: two replicas on different ports sharing one PostgreSQL ledger and one S3
bucket behave as one gateway (every request through either is one ledger row; the admin endpoints on either see all
traffic; a key's rate limit and budget hold across both; a collection ingested through one is answered from through
the other, and documents attached to a request are embedded once for both)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from tests.support.policies import write_policy
from tests.support.servers import REPLICA_ADMIN_KEY as ADMIN_KEY
from tests.support.servers import REPLICA_USER_KEY as USER_KEY
from tests.support.servers import start_replica, wait_ready


def admin(url: str, path: str) -> dict:
    response = httpx.get(f"{url}{path}", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_two_replicas_share_one_postgres_ledger(upstream, postgres_url, tmp_path):
    import psycopg

    base, _ = upstream
    policy = write_policy(tmp_path / "policy.yaml", base)
    replicas = [start_replica(tmp_path, name, policy, postgres_url) for name in ("a", "b")]
    try:
        for (proc, url), name in zip(replicas, ("a", "b")):
            wait_ready(proc, url, tmp_path / f"{name}.log")
        clients = [openai.OpenAI(base_url=f"{url}/v1", api_key=USER_KEY, max_retries=0) for _, url in replicas]

        def ask(i: int) -> str:
            raw = clients[i % 2].chat.completions.with_raw_response.create(
                model="selfroute", messages=[{"role": "user", "content": f"question {i}"}]
            )
            return raw.headers["x-selfroute-request-id"]

        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(ask, range(40)))
        assert len(set(ids)) == 40
        deadline = time.monotonic() + 30
        while True:  # each replica's writer commits its batch off the request path
            with psycopg.connect(postgres_url) as conn:
                rows = sorted(r[0] for r in conn.execute("SELECT id FROM requests"))
            if len(rows) >= 40 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert rows == sorted(ids)  # ledger rows = requests, none lost, none twice
        for _, url in replicas:  # either replica's admin view shows all traffic
            assert admin(url, "/v1/admin/summary?window=1h")["totals"]["requests"] == 40
            assert admin(url, "/v1/admin/costs?by=route")["total"]["requests"] == 40
            listed = admin(url, "/v1/admin/requests?limit=100")["data"]
            assert sorted(item["id"] for item in listed) == sorted(ids)

        # a key created through A works on B; its requests-per-minute limit counts requests through both
        (_, a), (_, b) = replicas
        created = httpx.post(
            f"{a}/v1/admin/keys",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
            json={"name": "team", "rpm": 4},
        )
        assert created.status_code == 201, created.text
        secret = created.json()["key"]
        statuses = []
        if time.time() % 60 > 40:  # the six requests below fall inside one minute window
            time.sleep(60.5 - time.time() % 60)
        for i in range(6):
            response = httpx.post(
                f"{[a, b][i % 2]}/v1/chat/completions",
                timeout=30,
                headers={"Authorization": f"Bearer {secret}"},
                json={"model": "selfroute", "messages": [{"role": "user", "content": "hi"}]},
            )
            statuses.append(response.status_code)
        assert statuses == [200, 200, 200, 200, 429, 429]
        # revoked through A: B refuses it once its short lookup cache (2 s) has passed
        revoked = httpx.delete(f"{a}/v1/admin/keys/team", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
        assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
        time.sleep(2.5)
        refused = httpx.post(
            f"{b}/v1/chat/completions",
            headers={"Authorization": f"Bearer {secret}"},
            timeout=30,
            json={"model": "selfroute", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert refused.status_code == 401

        # a USD budget holds across replicas: spent through A, refused by B once the ledger has recorded the spend
        created = httpx.post(
            f"{a}/v1/admin/keys",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
            json={"name": "budgeted", "budget_usd": 1.0},
        )  # room for the one request's reservation ($0.09); lowered below its spend once it is recorded
        assert created.status_code == 201, created.text
        budgeted = {"Authorization": f"Bearer {created.json()['key']}"}
        assert httpx.get(f"{b}/v1/models", headers=budgeted, timeout=30).status_code == 200  # B knows the key
        spent = httpx.post(
            f"{a}/v1/chat/completions",
            headers=budgeted,
            timeout=30,
            json={"model": "selfroute", "messages": [{"role": "user", "content": "spend it"}]},
        )
        assert spent.status_code == 200, spent.text
        deadline = time.monotonic() + 30
        while True:  # A's writer commits the request off the request path; B reads the spend from the database
            recorded = {k["name"]: k["spend_usd"] for k in admin(b, "/v1/admin/keys")["data"]}["budgeted"]
            if recorded > 1e-9 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert recorded > 1e-9
        lowered = httpx.patch(
            f"{a}/v1/admin/keys/budgeted",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
            json={"budget_usd": 1e-9},
        )
        assert lowered.status_code == 200, lowered.text
        deadline = time.monotonic() + 30
        while True:  # B reads the key's limits again once its short look-up cache (2 s) has passed
            over = httpx.post(
                f"{b}/v1/chat/completions",
                headers=budgeted,
                timeout=30,
                json={"model": "selfroute", "messages": [{"role": "user", "content": "more"}]},
            )
            if over.status_code != 200 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert over.status_code == 429, over.text
        assert "is spent" in over.json()["error"]["message"]
        assert over.json()["error"]["code"] == "budget_exceeded"
        ok = httpx.post(
            f"{b}/v1/chat/completions",
            headers={"Authorization": f"Bearer {USER_KEY}"},
            timeout=30,
            json={"model": "selfroute", "messages": [{"role": "user", "content": "other key"}]},
        )
        assert ok.status_code == 200  # the budget is the key's own
    finally:
        for proc, _ in replicas:
            proc.terminate()
        for proc, _ in replicas:
            proc.wait(timeout=30)
    # and neither replica hit an error on the way (a failed ledger write or migration logs one)
    logs = [(tmp_path / f"{name}.log").read_text() for name in ("a", "b")]
    assert all("Traceback" not in text for text in logs), logs


PUMP_MANUAL = "\n\n".join(
    f"Section {n}. Operating notes\n\nInspect the pump housing every {n} weeks for corrosion."
    + (" The maintenance password for the Zephyr pump is BLUE-HERON-42." if n == 7 else "")
    for n in range(1, 13)
)
VALVE_MANUAL = "\n\n".join(
    f"Section {n}. Valve V{n}\n\nValve V{n} is opened after valve V{n - 1} and checked for leaks weekly."
    + (" Its handle is painted ULTRAMARINE so divers can find it." if n == 9 else "")
    for n in range(1, 15)
)
RAG_POLICY = {"routing": {"default_route": "rag"}}


def test_two_replicas_share_collections_on_s3(upstream, postgres_url, s3_bucket, tmp_path):
    """A collection ingested through replica A (LanceDB on the bucket, AWS_* variables) is listed and answered from
    through replica B, which never saw the upload; so is the inline collection of documents attached to a request."""
    base, fake = upstream
    policy = write_policy(tmp_path / "policy.yaml", base, **RAG_POLICY)
    # A is given the ledger and the store by environment variables, B by flags; both get the bucket's credentials
    # from the AWS_* variables
    replicas = [
        start_replica(tmp_path, "a", policy, postgres_url, {**s3_bucket.env, "SELFROUTE_STORE_URI": s3_bucket.uri}),
        start_replica(
            tmp_path,
            "b",
            policy,
            postgres_url,
            s3_bucket.env,
            ["--ledger-url", postgres_url, "--store-uri", s3_bucket.uri],
        ),
    ]
    try:
        for (proc, url), name in zip(replicas, ("a", "b")):
            wait_ready(proc, url, tmp_path / f"{name}.log")
        (_, a), (_, b) = replicas
        auth = {"Authorization": f"Bearer {USER_KEY}"}
        posted = httpx.post(
            f"{a}/v1/collections/pumps/documents",
            headers=auth,
            timeout=120,
            json={"documents": [{"id": "zephyr", "title": "Zephyr manual", "text": PUMP_MANUAL}]},
        )
        assert posted.status_code == 201, posted.text
        listed = httpx.get(f"{b}/v1/collections/pumps", headers=auth, timeout=60)
        assert listed.status_code == 200, listed.text
        assert [d["id"] for d in listed.json()["documents"]] == ["zephyr"]
        raw = openai.OpenAI(
            base_url=f"{b}/v1", api_key=USER_KEY, max_retries=0
        ).chat.completions.with_raw_response.create(
            model="selfroute",
            messages=[{"role": "user", "content": "What is the Zephyr pump's maintenance password?"}],
            extra_body={"selfroute": {"collection": "pumps"}},
        )
        assert raw.headers["x-selfroute-route"] == "rag"
        assert "BLUE-HERON-42" in fake.state.received[-1]["body"]["messages"][-1]["content"]  # retrieved on B
        keys = [o["Key"] for o in s3_bucket.client().list_objects_v2(Bucket=s3_bucket.bucket)["Contents"]]
        assert any(k.startswith(f"{s3_bucket.prefix}/pumps") for k in keys)
        assert not (tmp_path / "a" / "lancedb").exists() and not (tmp_path / "b" / "lancedb").exists()

        # documents attached to a request: A embeds them once into an inline collection in the bucket; B, asked
        # about the same documents, answers from that collection and writes nothing (no second chunk + embed)
        def ask_attached(url: str, question: str):
            return openai.OpenAI(base_url=f"{url}/v1", api_key=USER_KEY, max_retries=0).chat.completions.create(
                model="selfroute",
                messages=[{"role": "user", "content": question}],
                extra_body={"selfroute": {"documents": [{"id": "valves", "text": VALVE_MANUAL}]}},
            )

        def stored(name_part: str) -> set[str]:
            pages = (
                s3_bucket.client()
                .get_paginator("list_objects_v2")
                .paginate(Bucket=s3_bucket.bucket, Prefix=f"{s3_bucket.prefix}/")
            )
            return {o["Key"] for page in pages for o in page.get("Contents", []) if name_part in o["Key"]}

        def inline_files() -> set[str]:  # the inline collections' files, not the record of their use
            return {key for key in stored("inline-") if "selfroute-inline-usage" not in key}

        assert not stored("inline-")
        assert ask_attached(a, "Which valve is opened first?").selfroute["route"] == "rag"
        # A answered from its first pass; the rest of the documents are embedded in the background, and the
        # collection is whole once A logs the ingestion (after its full-text index)
        deadline = time.monotonic() + 300
        while "ingested inline-" not in (tmp_path / "a.log").read_text():
            assert time.monotonic() < deadline, (tmp_path / "a.log").read_text()[-3000:]
            time.sleep(0.2)
        after_a, usage_after_a = inline_files(), stored("selfroute-inline-usage")
        assert any(key.endswith(".lance") for key in after_a), after_a  # A's inline collection, in the bucket
        assert usage_after_a  # and when it was used, for every replica's cap
        assert ask_attached(b, "What colour is valve V9's handle?").selfroute["route"] == "rag"
        assert "ULTRAMARINE" in fake.state.received[-1]["body"]["messages"][-1]["content"]  # retrieved on B
        assert inline_files() == after_a  # B added no data, version or index file to the collection
        assert stored("selfroute-inline-usage") > usage_after_a  # only a record that B used it too
        logs = {name: (tmp_path / f"{name}.log").read_text() for name in ("a", "b")}
        assert "ingested inline-" in logs["a"] and "ingested inline-" not in logs["b"], logs["b"][-3000:]
        assert not (tmp_path / "b" / "lancedb").exists()
        assert not list(tmp_path.glob("*/ledger.sqlite3*"))  # both ledgered on PostgreSQL, by variable and by flag
        assert [c["name"] for c in httpx.get(f"{b}/v1/collections", headers=auth, timeout=60).json()["data"]] == [
            "pumps"
        ]  # inline collections are a cache, not listed
    finally:
        for proc, _ in replicas:
            proc.terminate()
        for proc, _ in replicas:
            proc.wait(timeout=30)


def test_serve_takes_ledger_url_and_reports_a_database_it_cannot_open_without_the_password(tmp_path, capsys):
    from gateway.cli import main

    secret = "Hunter2Secret"
    for url in (
        f"postgresql://app:{secret}@127.0.0.1:1/db",
        f"postgresql://app:{secret[:7]} {secret[7:]}@127.0.0.1:1/db",
        f"postgresql://app:{secret}@[::1:1/db",
    ):
        assert main(["serve", "--data-dir", str(tmp_path), "--ledger-url", url, "--port", "0"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("selfroute serve: cannot open the ledger database: ") and "Traceback" not in err, err
        assert secret[:7] not in err and secret[7:] not in err, err


def _closed_within(sock, seconds: float) -> tuple[bool, bytes]:
    """(whether the server closed the connection within `seconds`, what it sent before)."""

    sock.settimeout(seconds)
    received = b""
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True, received
            received += data
    except (ConnectionResetError, BrokenPipeError):
        return True, received
    except TimeoutError:
        return False, received


def test_serve_bounds_slow_and_silent_clients(upstream, tmp_path):
    """issue 21: no header, body or idle timeouts (3 slow connections still open at 45 s; a Content-Length larger than
    the body waited for ever). With --header-timeout 1 --body-timeout 1 --keep-alive-timeout 1: a silent connection,
    a trickled request head and an idle kept-alive connection are closed, a short body is a 408 body_timeout, and
    ordinary requests still work."""
    import socket

    policy = write_policy(tmp_path / "policy.yaml", upstream[0])
    proc, url = start_replica(
        tmp_path,
        "slow",
        policy,
        str(tmp_path / "ledger.sqlite3"),
        flags=["--header-timeout", "1", "--body-timeout", "1", "--keep-alive-timeout", "1"],
    )
    port = int(url.rsplit(":", 1)[1])
    try:
        wait_ready(proc, url, tmp_path / "slow.log")
        silent = socket.create_connection(("127.0.0.1", port))
        trickle = socket.create_connection(("127.0.0.1", port))
        trickle.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        assert _closed_within(silent, 8)[0] and _closed_within(trickle, 8)[0]
        assert time.monotonic() - started < 6
        short = socket.create_connection(("127.0.0.1", port))
        short.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + USER_KEY.encode()
            + b'\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model"'
        )
        closed, answer = _closed_within(short, 10)
        assert answer.split(b"\r\n", 1)[0].endswith(b"408 Request Timeout"), answer[:300]
        assert b"body_timeout" in answer
        kept = socket.create_connection(("127.0.0.1", port))
        kept.sendall(b"GET /health/liveness HTTP/1.1\r\nHost: x\r\n\r\n")
        closed, answer = _closed_within(kept, 8)
        assert closed and b" 200 " in answer.split(b"\r\n", 1)[0]  # answered, then closed once idle
        ok = httpx.post(
            f"{url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {USER_KEY}"},
            timeout=60,
            json={"model": "openai/fake-cheap", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert ok.status_code == 200, ok.text
    finally:
        proc.terminate()
        proc.wait(30)


def test_serve_preload_loads_the_embedding_session_before_readiness_and_plain_serve_at_first_use(upstream, tmp_path):
    """`serve --preload` (Settings.preload) loads the in-process models before readiness; plain `serve` only checks
    them and the first request that embeds loads the session (the log line comes after readiness)."""
    from tests.support.servers import ServeProcess

    policy = write_policy(tmp_path / "policy.yaml", upstream[0])
    for flags, loaded_when_ready in (([], False), (["--preload"], True)):
        data = tmp_path / ("preload" if flags else "lazy")
        proc = ServeProcess("--policy", str(policy), "--data-dir", str(data), *flags).wait_ready()
        try:
            ready_output = proc.output()
            assert ("loading embedding model" in ready_output) is loaded_when_ready, ready_output[-2000:]
            embedded = httpx.post(
                f"{proc.url}/v1/embeddings", json={"model": "local/all-minilm-l6-v2", "input": "a harbour"}, timeout=300
            )
            assert embedded.status_code == 200, embedded.text
            assert proc.output().count("loading embedding model") == 1
        finally:
            proc.stop()
