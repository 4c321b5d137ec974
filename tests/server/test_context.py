"""One wrapper for every endpoint that takes a key (gateway.server.context): chat, embeddings, explain and adding
documents are admitted alike (a spent budget or a reached rate limit is the same 429 on each, and ledgered), and
the status the ledger records is the status the client got, for every error class of the one exception table."""

from __future__ import annotations

import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from gateway.errors import GatewayError
from gateway.ledger.errors import InvalidQuery, LedgerError, NotFound, Unavailable
from gateway.ledger.writer import Ledger
from gateway.routing.errors import InvalidRequest, ModelNotFound, RequestTooLarge
from gateway.server.auth import Authenticator
from gateway.server.context import RequestContext, keyed
from gateway.server.disconnect import ClientDisconnected
from gateway.server.errors import handle_error
from gateway.server.metrics import GatewayMetrics
from gateway.server.middleware import RequestMiddleware
from gateway.upstreams.errors import (
    MalformedAnswer,
    UnsupportedRequest,
    UpstreamCredentialsRefused,
    UpstreamError,
    UpstreamFailed,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
    UpstreamUnreachable,
)
from pipelines.embedding import Embedder
from pipelines.errors import CollectionNotFound, StoreUnavailable
from tests.support.gateway import ledger_rows, running_gateway
from tests.support.ledger import bare_gateway
from tests.support.policies import make_policy
from tests.support.servers import serve_app

ADMIN = "sk-admin-context"
LIMIT = 20_000  # the gateway's body limit in these tests

# one request of each family that does model work: (path, body)
FAMILIES = {
    "chat": (
        "/v1/chat/completions",
        {"model": "openai/fake-cheap", "messages": [{"role": "user", "content": "a b c"}]},
    ),
    "embeddings": ("/v1/embeddings", {"model": "local/all-minilm-l6-v2", "input": ["Open valve V2 first."]}),
    "explain": ("/v1/route/explain", {"model": "selfroute", "messages": [{"role": "user", "content": "Which valve?"}]}),
    "collections": (
        "/v1/collections/notes/documents",
        {"documents": [{"id": "a", "text": "Valve V2 opens clockwise."}]},
    ),
}


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


@pytest.fixture()
def gateway(upstream, embedder, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_BASE", f"{upstream[0]}/v1")
    with running_gateway(
        tmp_path, make_policy(upstream[0]), auth=Authenticator(admin_key=ADMIN), embedder=embedder, max_body_bytes=LIMIT
    ) as (url, app):
        yield url, app


def _post(
    url: str, key: str, family: str, body=None, content: bytes | None = None, collection: str = "notes"
) -> httpx.Response:
    path, default = FAMILIES[family]
    path = path.replace("/notes/", f"/{collection}/")
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    payload = {"content": content} if content is not None else {"json": default if body is None else body}
    return httpx.post(f"{url}{path}", headers=headers, timeout=120, **payload)


def _rows_by_id(app) -> dict[str, dict]:
    return {row["id"]: row for row in ledger_rows(app)}


def _refused_alike(url: str, app, key: str, name: str, code: str) -> None:
    """Every family answers 429 `code`, and each refusal is in the ledger with its key and status 429."""
    refused = {family: _post(url, key, family) for family in FAMILIES}
    for family, response in refused.items():
        assert response.status_code == 429, (family, response.text)
        assert response.json()["error"]["code"] == code, family
        assert response.json()["error"]["type"] == "rate_limit_error"
    rows = _rows_by_id(app)
    for family, response in refused.items():
        row = rows[response.headers["x-selfroute-request-id"]]
        assert (row["status"], row["key_id"]) == (429, name), family


def test_a_spent_budget_is_refused_by_every_family_alike(gateway):
    url, app = gateway
    _, small = app.state.gateway.keys.create("small", budget_usd=1.0)  # one chat costs $0.000011
    assert _post(url, small, "chat").status_code == 200
    ledger_rows(app)  # flushed: spend is what the ledger recorded
    app.state.gateway.keys.edit("small", budget_usd=0.00001)  # now spent (a reservation must fit to be let in)
    app.state.gateway.auth.forget()  # as the admin API's edit does
    _refused_alike(url, app, small, "small", "budget_exceeded")


def test_a_reached_token_rate_is_refused_by_every_family_alike(gateway):
    url, app = gateway
    _, limited = app.state.gateway.keys.create("tokens", tpm=100_000)
    assert _post(url, limited, "chat").status_code == 200  # 3 prompt + 4 completion tokens
    ledger_rows(app)
    app.state.gateway.keys.edit("tokens", tpm=5)  # now reached
    app.state.gateway.auth.forget()
    _refused_alike(url, app, limited, "tokens", "rate_limit_exceeded")


def test_every_family_counts_its_requests_per_minute(gateway):
    url, app = gateway
    for attempt in range(2):  # requests per calendar minute: start again if a minute ended mid-test
        started = time.time()
        answers = {}
        for family in FAMILIES:
            name = f"rpm-{family}-{attempt}"
            _, key = app.state.gateway.keys.create(name, rpm=1)
            answers[family] = (_post(url, key, family, collection=name), _post(url, key, family, collection=name))
        if started // 60 == time.time() // 60:
            break
    for family, (first, second) in answers.items():
        assert first.status_code in (200, 201), (family, first.text)
        assert second.status_code == 429 and second.json()["error"]["code"] == "rate_limit_exceeded", family
        assert 1 <= int(second.headers["retry-after"]) <= 60


def test_explain_and_adding_documents_are_metered(gateway):
    url, app = gateway
    _, key = app.state.gateway.keys.create("meter")
    explained, added = _post(url, key, "explain"), _post(url, key, "collections")
    assert (explained.status_code, added.status_code) == (200, 201)
    rows = _rows_by_id(app)
    explain_row = rows[explained.headers["x-selfroute-request-id"]]
    assert (explain_row["route"], explain_row["reason"], explain_row["key_id"]) == ("passthrough", "explain", "meter")
    ingest_row = rows[added.headers["x-selfroute-request-id"]]
    assert (ingest_row["route"], ingest_row["reason"], ingest_row["status"]) == ("passthrough", "ingest", 201)
    [leg] = [c for c in ledger_rows(app, "upstream_calls") if c["request_id"] == ingest_row["id"]]
    assert leg["model"] == "local/all-minilm-l6-v2" and leg["prompt_tokens"] > 0 and leg["cost_usd"] == 0
    assert ingest_row["prompt_tokens"] == leg["prompt_tokens"]


def test_the_ledger_records_the_status_the_client_got_on_every_family(gateway):
    url, app = gateway
    keys = app.state.gateway.keys
    _, owner = keys.create("owner")
    _, other = keys.create("other", models=["nothing-*"])
    assert _post(url, owner, "collections", {"documents": [{"id": "x", "text": "Owned."}]}).status_code == 201
    too_large = b'{"pad": "' + b"x" * LIMIT + b'"}'
    responses = []
    for family in FAMILIES:
        responses.append(_post(url, other, family, content=b"{not json"))
        responses.append(_post(url, other, family, content=too_large))
    for family in ("chat", "embeddings", "explain"):  # a model this key may not use
        responses.append(_post(url, other, family))
    hidden = {"selfroute": {"collection": "notes"}}  # owner's collection: absent to the other key
    responses.append(_post(url, other, "chat", {**FAMILIES["chat"][1], "model": "selfroute", **hidden}))
    responses.append(_post(url, owner, "explain", {**FAMILIES["explain"][1], "selfroute": {"collection": "absent"}}))
    responses.append(_post(url, other, "collections"))  # writing into another key's collection
    responses.append(_post(url, owner, "chat", {**FAMILIES["chat"][1], "model": "openai/status-503"}))
    statuses = {r.status_code for r in responses}
    assert {400, 403, 404, 413} <= statuses and statuses - {400, 403, 404, 413}, statuses
    rows = _rows_by_id(app)
    for response in responses:
        row = rows[response.headers["x-selfroute-request-id"]]
        assert row["status"] == response.status_code, (response.request.url, response.text)
        assert row["error"] == response.json()["error"]["message"]


# -- the exception table itself, on a bare app: every class the server knows -------------------------------------

CLASSES = [
    (GatewayError(400, "bad"), 400),
    (GatewayError(409, "conflict"), 409),
    (GatewayError(502, "upstream"), 502),
    (GatewayError(504, "timeout"), 504),
    (InvalidRequest("no question", param="messages", code="empty_question"), 400),
    (RequestTooLarge("too many bytes", param="selfroute.documents", code="documents_too_large"), 413),
    (ModelNotFound("no such model", param="model", code="model_not_found"), 404),
    (InvalidQuery("bad filter"), 400),
    (NotFound("no such request"), 404),
    (Unavailable("database down"), 503),
    (LedgerError("ledger bug"), 500),
    (StoreUnavailable(), 503),
    (CollectionNotFound("gone"), 404),
    (RuntimeError("a bug"), 500),
    (ClientDisconnected(), 499),
    (UpstreamUnreachable("no connection", model="m"), 502),
    (UpstreamCredentialsRefused("refused the gateway's credentials", provider_status=401), 502),
    (UpstreamTimeout("too slow"), 504),
    (UpstreamRateLimited("slow down", provider_status=429), 429),
    (UpstreamFailed("provider 500", provider_status=500), 502),
    (MalformedAnswer("no choices"), 502),
    (UpstreamUnavailable("no upstream for provider 'x'"), 503),
    (UpstreamRejected("too long for the provider", provider_status=413), 413),
    (UpstreamRejected("provider 404", provider_status=404), 404),
    (UnsupportedRequest("n > 1", param="n", code="unsupported_parameter"), 400),
]


@pytest.fixture()
def raising_app(tmp_path):
    async def handler(ctx: RequestContext):
        raise CLASSES[int(ctx.request.path_params["index"])][0]

    app = Starlette(
        routes=[Route("/raise/{index}", keyed(handler, metered=True), methods=["POST"])],
        exception_handlers={Exception: handle_error},
    )
    app.add_middleware(RequestMiddleware)
    app.state.gateway = bare_gateway(
        Ledger(tmp_path / "ledger.sqlite3", dead_letter_dir=tmp_path), Authenticator(), GatewayMetrics()
    )
    with serve_app(app) as url:
        yield url, app


def test_every_error_class_is_ledgered_with_the_status_it_answers(raising_app):
    url, app = raising_app
    answered = [httpx.post(f"{url}/raise/{i}", timeout=30) for i in range(len(CLASSES))]
    assert [r.status_code for r in answered] == [status for _, status in CLASSES]
    rows = _rows_by_id(app)
    for (exc, status), response in zip(CLASSES, answered, strict=True):
        row = rows[response.headers["x-selfroute-request-id"]]
        assert row["status"] == status, type(exc).__name__
        if status != 499:
            error = response.json()["error"]
            assert error["type"] and "Traceback" not in response.text
            if isinstance(exc, (InvalidRequest, RequestTooLarge, ModelNotFound)):  # routing's own field and code
                assert (error["param"], error["code"]) == (exc.param, exc.code)
            if isinstance(exc, UpstreamError):  # the upstream's own field and code
                assert (error["param"], error["code"]) == (exc.param, exc.code)
                assert error["type"] == GatewayError(status, "").type
            # a bug's cause stays in the ledger (for the admin), never in the answer
            assert row["error"] == (
                f"internal error: RuntimeError: {exc}" if isinstance(exc, RuntimeError) else error["message"]
            )
