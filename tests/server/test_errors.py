"""Errors as responses: the ledger database going away is a 503 in the OpenAI envelope (never a 500, never the
database's address), and requests that do not need it keep flowing."""

from __future__ import annotations

from contextlib import contextmanager

import httpx

from gateway.server.auth import Authenticator
from tests.support.gateway import running_gateway
from tests.support.policies import make_policy

ADMIN, USER = "sk-admin-errors", "sk-user-errors"


@contextmanager
def refusing_connections(postgres_server, url: str):
    """The database refuses new connections and its open ones are closed, as in a restart; then it is back."""
    name = url.rsplit("/", 1)[1]
    with postgres_server.connect(autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
    try:
        yield
    finally:
        with postgres_server.connect(autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def test_an_unreachable_ledger_database_is_a_503_and_answers_still_flow(
    upstream, postgres_server, postgres_url, tmp_path, monkeypatch
):
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    admin = {"authorization": f"Bearer {ADMIN}"}
    with running_gateway(
        tmp_path / "data",
        make_policy(upstream[0]),
        ledger_url=postgres_url,
        auth=Authenticator([USER], admin_key=ADMIN),
    ) as (url, app):
        created = httpx.post(f"{url}/v1/admin/keys", headers=admin, json={"name": "team"}, timeout=30)
        assert created.status_code == 201, created.text
        named = {"authorization": f"Bearer {created.json()['key']}"}
        body = {"model": "openai/fake-cheap", "messages": [{"role": "user", "content": "a b c"}]}
        port = postgres_url.rsplit(":", 1)[1].split("/")[0]
        with refusing_connections(postgres_server, postgres_url):
            for method, path, headers, payload in [
                ("GET", "/v1/admin/requests", admin, None),
                ("GET", "/v1/admin/summary", admin, None),
                ("GET", "/v1/admin/costs", admin, None),
                ("GET", "/v1/admin/keys", admin, None),
                ("POST", "/v1/chat/completions", named, body),  # its key is looked up in the database
            ]:
                response = httpx.request(method, f"{url}{path}", headers=headers, json=payload, timeout=30)
                assert response.status_code == 503, (path, response.text)
                error = response.json()["error"]
                assert error["code"] == "ledger_unavailable" and error["type"] == "service_unavailable_error"
                assert response.headers["retry-after"] == "2"
                assert port not in response.text and "127.0.0.1" not in response.text
            # a key from the environment needs no database: its answer comes, its record waits for the writer
            assert (
                httpx.post(
                    f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {USER}"}, json=body, timeout=30
                ).status_code
                == 200
            )
        # back: the same gateway reconnects
        assert httpx.get(f"{url}/v1/admin/requests", headers=admin, timeout=30).status_code == 200
        assert httpx.post(f"{url}/v1/chat/completions", headers=named, json=body, timeout=30).status_code == 200


def test_an_unreachable_document_store_is_a_503(upstream, tmp_path, monkeypatch):
    """Collections on S3 whose server goes away: the collections API and a chat naming a collection answer 503
    store_unavailable (no endpoint or bucket in it), and a chat without a collection still answers."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)  # this test's own: it is stopped
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "OPENAI_API_BASE": f"{upstream[0]}/v1",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket="errors-test")
    user = {"authorization": f"Bearer {USER}"}
    try:
        with running_gateway(
            tmp_path / "data",
            make_policy(upstream[0]),
            vector_store_uri="s3://errors-test/sr",
            auth=Authenticator([USER], admin_key=ADMIN),
        ) as (url, app):
            added = httpx.post(
                f"{url}/v1/collections/notes/documents",
                headers=user,
                timeout=120,
                json={"documents": [{"id": "a", "text": "Valve V2 opens clockwise."}]},
            )
            assert added.status_code == 201, added.text
            server.stop()
            server = None
            ask = {"model": "selfroute", "messages": [{"role": "user", "content": "How does V2 open?"}]}
            for method, path, payload in [
                ("GET", "/v1/collections", None),
                ("GET", "/v1/collections/notes", None),
                ("POST", "/v1/collections/notes/documents", {"documents": [{"id": "b", "text": "More."}]}),
                ("POST", "/v1/chat/completions", {**ask, "selfroute": {"collection": "notes", "route": "rag"}}),
            ]:
                response = httpx.request(method, f"{url}{path}", headers=user, json=payload, timeout=120)
                assert response.status_code == 503, (path, response.text)
                assert response.json()["error"]["code"] == "store_unavailable"
                assert str(port) not in response.text and "errors-test" not in response.text
            assert httpx.post(f"{url}/v1/chat/completions", headers=user, json=ask, timeout=120).status_code == 200
    finally:
        if server is not None:
            server.stop()
