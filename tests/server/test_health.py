"""/health/liveness answers as soon as the server listens; /health/readiness is 503 until the embedding model,
store and classifier are loaded, with a reason code; why loading failed goes to the log (and the admin), not to
whoever can reach the probe."""

from __future__ import annotations

import threading

import httpx

from gateway.server.app import create_app
from gateway.settings import Settings
from pipelines.embedding import Embedder
from tests.support.policies import DROP, Whole, fake_route, make_policy, model_route
from tests.support.servers import serve_app


class SlowEmbedder(Embedder):
    """Holds start-up until the test lets it go."""

    def __init__(self, release: threading.Event):
        super().__init__()
        self.release = release

    @property
    def dimension(self) -> int:
        return 384


def test_readiness_waits_for_the_models(upstream, tmp_path, monkeypatch):
    release = threading.Event()
    app = create_app(Settings(data_dir=tmp_path), policy=make_policy(upstream[0]), embedder=SlowEmbedder(release))
    startup = app.state.gateway.startup
    real_build = startup.build
    monkeypatch.setattr(startup, "build", lambda: (release.wait(30), real_build()))
    with serve_app(app, wait_ready=False) as url:
        assert httpx.get(f"{url}/health/liveness").json() == {"status": "ok"}
        starting = httpx.get(f"{url}/health/readiness")
        assert starting.status_code == 503 and starting.json() == {"status": "starting", "reason": "not_ready"}
        routed = httpx.post(
            f"{url}/v1/chat/completions", json={"model": "selfroute", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert routed.status_code == 503 and routed.json()["error"]["code"] == "not_ready"
        release.set()
        for _ in range(3000):
            ready = httpx.get(f"{url}/health/readiness")
            if ready.status_code == 200:
                break
        assert ready.json() == {"status": "ready", "policy_generation": 0}  # no policy reload on this ledger yet


def test_a_failed_start_is_a_reason_code_and_its_detail_only_for_the_admin(upstream, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SELFROUTE_ADMIN_KEY", "admin-secret")
    monkeypatch.setenv("SELFROUTE_API_KEYS", "user-key")
    app = create_app(Settings(data_dir=tmp_path), policy=make_policy(upstream[0]))
    startup = app.state.gateway.startup

    def broken():
        raise FileNotFoundError("no classifier at /srv/secret/nowhere.skops")

    monkeypatch.setattr(startup, "build", broken)
    with serve_app(app, wait_ready=False) as url:
        for _ in range(3000):
            failed = httpx.get(f"{url}/health/readiness")
            if failed.json()["status"] != "starting":
                break
        # unauthenticated, and with a user's key or a wrong one: the stable code, no path, no exception text
        for headers in ({}, {"Authorization": "Bearer user-key"}, {"Authorization": "Bearer wrong"}):
            probe = httpx.get(f"{url}/health/readiness", headers=headers)
            assert probe.status_code == 503 and probe.json() == {"status": "failed", "reason": "build_failed"}
        admin = httpx.get(f"{url}/health/readiness", headers={"Authorization": "Bearer admin-secret"})
        assert admin.status_code == 503 and admin.json()["reason"] == "build_failed"
        assert admin.json()["error"] == "FileNotFoundError: no classifier at /srv/secret/nowhere.skops"
        assert httpx.get(f"{url}/health/liveness").status_code == 200
        routed = httpx.post(
            f"{url}/v1/route/explain",
            headers={"Authorization": "Bearer user-key"},
            json={"model": "selfroute", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert routed.status_code == 503 and routed.json()["error"]["code"] == "build_failed"
        assert "nowhere" not in routed.text and "FileNotFoundError" not in routed.text
        listing = httpx.get(f"{url}/v1/collections", headers={"Authorization": "Bearer user-key"})
        assert listing.status_code == 503 and listing.json()["error"]["code"] == "build_failed"
    assert "/srv/secret/nowhere.skops" in caplog.text  # the operator still finds it


class GatedLoadEmbedder(Embedder):
    """A real embedder whose start-up check (prepare) and loading wait for the test."""

    def __init__(self, release: threading.Event):
        super().__init__()
        self.release = release

    def prepare(self) -> None:
        self.release.wait(60)
        super().prepare()

    def load(self) -> None:
        self.release.wait(60)
        super().load()


def _ready_after_release(url: str, release: threading.Event) -> httpx.Response:
    for _ in range(20):
        starting = httpx.get(f"{url}/health/readiness")
        assert starting.status_code == 503 and starting.json()["reason"] == "not_ready"
    release.set()
    for _ in range(3000):
        ready = httpx.get(f"{url}/health/readiness")
        if ready.status_code == 200:
            return ready
    raise AssertionError("never ready")


def test_readiness_waits_for_the_embedding_models_check_and_the_first_request_loads_it(upstream, tmp_path):
    """Ready means checked, not loaded: the model's files and export are there (prepare), the session (~130 MB) is
    loaded by the first request that embeds, and it is the one embedder the store and /v1/embeddings share."""
    release = threading.Event()
    embedder = GatedLoadEmbedder(release)
    app = create_app(Settings(data_dir=tmp_path), policy=make_policy(upstream[0]), embedder=embedder)
    with serve_app(app, wait_ready=False) as url:
        ready = _ready_after_release(url, release)
        assert ready.json() == {"status": "ready", "policy_generation": 0}  # no policy reload on this ledger yet
        assert not embedder.loaded and app.state.gateway.store.embedder is embedder
        embedded = httpx.post(f"{url}/v1/embeddings", json={"model": "local/all-minilm-l6-v2", "input": "a harbour"})
        assert embedded.status_code == 200, embedded.text
        assert embedder.loaded


def test_with_preload_readiness_is_503_until_the_embedding_model_is_loaded(upstream, tmp_path):
    release = threading.Event()
    embedder = GatedLoadEmbedder(release)
    settings = Settings(data_dir=tmp_path, preload=True)
    app = create_app(settings, policy=make_policy(upstream[0]), embedder=embedder)
    with serve_app(app, wait_ready=False) as url:
        assert not embedder.loaded
        _ready_after_release(url, release)
        assert embedder.loaded and app.state.gateway.store.embedder is embedder


def test_twenty_concurrent_first_embedding_requests_load_the_session_once(upstream, tmp_path, caplog):
    import asyncio
    import logging

    import openai

    app = create_app(Settings(data_dir=tmp_path), policy=make_policy(upstream[0]))
    with serve_app(app) as url:
        embedder = app.state.gateway.store.embedder
        assert not embedder.loaded

        async def burst():
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
            return await asyncio.gather(
                *(client.embeddings.create(model="local/all-minilm-l6-v2", input=f"berth {n}") for n in range(20))
            )

        with caplog.at_level(logging.INFO, logger="pipelines.embedding"):
            answers = asyncio.run(burst())
    assert [len(a.data[0].embedding) for a in answers] == [384] * 20
    assert sum(r.getMessage().startswith("loading embedding model") for r in caplog.records) == 1


def test_a_hosted_model_without_its_key_is_a_warning_and_a_readiness_detail(upstream, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    base = upstream[0]
    policy = make_policy(
        base,
        name=DROP,
        cheap=fake_route(base, "fake-cheap", context_window=8192),
        long=model_route("anthropic/claude-sonnet-4-5"),
        routing=Whole(classifier=None),
        passthrough=DROP,
    )
    app = create_app(Settings(data_dir=tmp_path), policy=policy, embedder=Embedder())
    with serve_app(app) as url:
        ready = httpx.get(f"{url}/health/readiness")
        assert ready.status_code == 200
        assert ready.json()["missing_credentials"] == [
            {"role": "long", "model": "anthropic/claude-sonnet-4-5", "missing": "ANTHROPIC_API_KEY"}
        ]
    assert "long model anthropic/claude-sonnet-4-5: ANTHROPIC_API_KEY is not set" in caplog.text
