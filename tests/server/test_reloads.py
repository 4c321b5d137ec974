"""The policy reload across processes (gateway.server.reloads): one POST /v1/admin/reload puts the policy file's
thresholds and model files in force in every worker of `serve --workers 2` (SQLite) and in every replica on one
PostgreSQL ledger, each process says what it has in force, and a model file that does not load is refused without
touching any answer. Real `selfroute serve` subprocesses, the official openai client, the fake upstream."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from gateway.ledger.database import connect
from gateway.routing.model_files import builtin_model_path
from tests.support.policies import DROP, Whole, write_policy
from tests.support.routing import document_text
from tests.support.servers import REPLICA_ADMIN_KEY as ADMIN_KEY
from tests.support.servers import REPLICA_USER_KEY as USER_KEY
from tests.support.servers import ServeProcess, start_replica, wait_ready

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
KEYS = {"SELFROUTE_ADMIN_KEY": ADMIN_KEY, "SELFROUTE_API_KEYS": USER_KEY}
CLASSIFIER_SHA = hashlib.sha256(builtin_model_path("default").read_bytes()).hexdigest()
VERIFIER_SHA = hashlib.sha256(builtin_model_path("verifier").read_bytes()).hexdigest()


def policy(path: Path, base: str, threshold: float, verifier: str = "builtin:verifier", refusal: float = 1.0) -> Path:
    """Both routes on the fake upstream, the shipped classifier at `threshold` (0.0: every question goes rag, 1.0:
    every one long) and a verifier (`verifier`'s file) at 0.3 with `refusal` as its refusal threshold."""
    unpriced = {"input_cost_per_mtok": DROP, "output_cost_per_mtok": DROP}
    routing = Whole(
        classifier={"model_path": "builtin:default", "threshold": threshold},
        default_route="rag",
        verifier={"model_path": verifier, "threshold": 0.3, "refusal_threshold": refusal},
    )
    return write_policy(path, base, name="fleet", cheap=unpriced, long=unpriced, routing=routing, passthrough=DROP)


def broken_model(folder: Path) -> str:
    """A verifier file that is not a model (a half-written or corrupted file): its name, beside the policy."""
    (folder / "broken.skops").write_bytes(b"PK\x03\x04 not a whole skops file")
    return "broken.skops"


def ask(url: str, n: int = 1) -> list[str]:
    """`n` routed questions through the official client; the route each took."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=USER_KEY, max_retries=0, timeout=120)
    routes = []
    for i in range(n):
        raw = client.chat.completions.with_raw_response.create(
            model="selfroute",
            messages=[{"role": "user", "content": f"Who is the keeper of the lighthouse? ({i})"}],
            extra_body={"selfroute": {"documents": [{"text": document_text(0)}]}},
        )
        assert raw.http_response.status_code == 200
        assert raw.parse().choices[0].message.content
        routes.append(raw.headers["x-selfroute-route"])
    return routes


def reload(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/admin/reload", headers=ADMIN, timeout=120)


def status(url: str) -> dict:
    answer = httpx.get(f"{url}/v1/admin/reload", headers=ADMIN, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def converged(url: str, count: int, check, timeout: float = 60.0) -> list[dict]:
    """Every live process on the ledger (`count` of them) as `check` wants it, within `timeout` seconds (each
    process checks every 2 s, then writes its row)."""
    deadline = time.monotonic() + timeout
    while True:
        live = [p for p in status(url)["processes"] if not p["stale"]]
        if len(live) == count and all(check(p) for p in live):
            return live
        assert time.monotonic() < deadline, json.dumps(live, indent=1)
        time.sleep(0.3)


def recorded(location, since: float) -> list[dict]:
    """The learning records of the requests made since `since`: each says the threshold and model that decided."""
    conn = connect(location)
    try:
        rows = conn.execute("SELECT data FROM request_features WHERE created_at >= ?", (since,)).fetchall()
    finally:
        conn.close()
    return [json.loads(r[0]) for r in rows]


def wait_recorded(location, since: float, count: int) -> list[dict]:
    deadline = time.monotonic() + 30
    while len(found := recorded(location, since)) < count:  # each writer commits off the request path
        assert time.monotonic() < deadline, found
        time.sleep(0.2)
    return found


def test_one_reload_reaches_both_workers_and_a_broken_model_is_refused_by_all(upstream, tmp_path):
    base, _ = upstream
    policy_file = policy(tmp_path / "policy.yaml", base, threshold=0.0)
    served = ServeProcess(
        "--policy",
        str(policy_file),
        "--data-dir",
        str(tmp_path / "data"),
        "--workers",
        "2",
        "--log-level",
        "WARNING",
        env=KEYS,
    ).wait_ready(timeout=600, in_a_row=20)  # both workers ready (a loaded machine takes minutes)
    ledger = tmp_path / "data" / "ledger.sqlite3"
    try:
        workers = converged(served.url, 2, lambda p: p["ready"] and p["generation"] == 0)
        assert len({p["pid"] for p in workers}) == 2 and served.process.pid not in {p["pid"] for p in workers}
        assert all(
            p["classifier"] == {"model_path": "builtin:default", "sha256": CLASSIFIER_SHA, "threshold": 0.0}
            for p in workers
        )
        assert all(p["verifier"]["sha256"] == VERIFIER_SHA and p["last_error"] is None for p in workers)
        assert set(ask(served.url, 4)) <= {"rag", "rag>long"}

        # the new threshold, one call: the worker that takes it loads it, the other follows within seconds
        policy(policy_file, base, threshold=1.0, refusal=0.5)
        answer = reload(served.url)
        assert answer.status_code == 200, answer.text
        generation = answer.json()["generation"]
        assert generation == 1 and answer.json()["process"]["classifier"]["threshold"] == 1.0
        workers = converged(
            served.url,
            2,
            lambda p: p["generation"] == p["loaded_generation"] == generation and p["classifier"]["threshold"] == 1.0,
        )
        assert all(p["verifier"]["refusal_threshold"] == 0.5 for p in workers)
        since = time.time()
        assert ask(served.url, 12) == ["long"] * 12  # every answer, whichever worker: the new threshold
        rows = wait_recorded(ledger, since, 12)
        assert {(r["threshold"], r["classifier_model"]) for r in rows} == {(1.0, CLASSIFIER_SHA[:16])}
        metrics = httpx.get(f"{served.url}/metrics", timeout=30).text
        pids = {p["pid"] for p in workers}
        for pid in pids:  # per worker, whichever answers the scrape
            assert f'selfroute_policy_generation{{pid="{pid}"}} 1.0' in metrics, metrics
            assert f'selfroute_routing_threshold{{model="classifier",pid="{pid}"}} 1.0' in metrics

        # a model file that does not load: refused by the worker that takes the call, told to nobody else
        policy(policy_file, base, threshold=0.0, verifier=broken_model(tmp_path))
        failed = reload(served.url)
        assert failed.status_code == 409 and failed.json()["error"]["code"] == "reload_failed"
        assert "broken.skops" not in failed.text  # file paths stay in the log and the admin's views
        time.sleep(5)  # more than two checks of every worker
        fleet = status(served.url)
        assert fleet["generation"] == generation
        workers = converged(served.url, 2, lambda p: p["generation"] == generation)
        assert all(p["verifier"]["sha256"] == VERIFIER_SHA and p["classifier"]["threshold"] == 1.0 for p in workers)
        errors = [p["last_error"] for p in workers if p["last_error"] is not None]
        assert len(errors) == 1 and errors[0]["generation"] is None and "broken.skops" in errors[0]["error"]
        assert ask(served.url, 6) == ["long"] * 6  # answers as before
    finally:
        output = served.stop()
    assert "Traceback" not in output, output[-3000:]


def test_replicas_on_one_postgres_ledger_follow_a_reload_each_from_its_own_policy_file(
    upstream, postgres_url, tmp_path
):
    base, _ = upstream
    files = {name: policy(tmp_path / f"{name}.yaml", base, threshold=0.0) for name in ("a", "b")}
    replicas = {name: start_replica(tmp_path, name, files[name], postgres_url) for name in ("a", "b")}
    try:
        for name, (proc, url) in replicas.items():
            wait_ready(proc, url, tmp_path / f"{name}.log", timeout=600)
        (_, a), (_, b) = replicas["a"], replicas["b"]
        converged(a, 2, lambda p: p["ready"] and p["generation"] == 0)

        # A takes the call; B loads the same change from its own copy of the policy
        for name in ("a", "b"):
            policy(files[name], base, threshold=1.0)
        first = reload(a)
        assert first.status_code == 200, first.text
        g1 = first.json()["generation"]
        converged(b, 2, lambda p: p["loaded_generation"] == g1 and p["classifier"]["threshold"] == 1.0)
        since = time.time()
        assert ask(b) == ["long"] and ask(a) == ["long"]
        assert {r["threshold"] for r in wait_recorded(postgres_url, since, 2)} == {1.0}

        # B's copy names a model file that does not load: B keeps its models, says so, and answers as before
        policy(files["a"], base, threshold=0.0)
        policy(files["b"], base, threshold=0.0, verifier=broken_model(tmp_path))
        second = reload(a)
        assert second.status_code == 200, second.text
        g2 = second.json()["generation"]
        assert g2 == g1 + 1
        live = converged(a, 2, lambda p: p["generation"] == g2)
        a_id = second.json()["process"]["id"]
        b_state = next(p for p in live if p["id"] != a_id)
        assert b_state["loaded_generation"] == g1 and b_state["classifier"]["threshold"] == 1.0
        assert b_state["verifier"]["sha256"] == VERIFIER_SHA
        assert b_state["last_error"]["generation"] == g2 and "broken.skops" in b_state["last_error"]["error"]
        a_state = next(p for p in live if p["id"] == a_id)
        assert a_state["loaded_generation"] == g2 and a_state["classifier"]["threshold"] == 0.0
        assert a_state["last_error"] is None
        ready = httpx.get(f"{b}/health/readiness", timeout=30)
        assert ready.status_code == 200 and ready.json()["reload_failed"] is True
        assert ready.json()["policy_generation"] == g1 and "reload" not in ready.json()  # details: admin only
        assert "broken.skops" in httpx.get(f"{b}/health/readiness", headers=ADMIN, timeout=30).text
        assert "selfroute_policy_reload_error 1.0" in httpx.get(f"{b}/metrics", timeout=30).text
        assert "selfroute_policy_reload_error 0.0" in httpx.get(f"{a}/metrics", timeout=30).text
        assert ask(b, 3) == ["long"] * 3 and set(ask(a, 3)) <= {"rag", "rag>long"}

        # B's file mended, the call through B: both on the newest generation, no error left
        policy(files["b"], base, threshold=0.0)
        third = reload(b)
        assert third.status_code == 200, third.text
        converged(a, 2, lambda p: p["loaded_generation"] == third.json()["generation"] and p["last_error"] is None)
    finally:
        for proc, _ in replicas.values():
            proc.terminate()
        for proc, _ in replicas.values():
            proc.wait(60)
    assert not any("Traceback" in (tmp_path / f"{name}.log").read_text() for name in ("a", "b"))


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_the_reload_log_on_both_engines(engine, tmp_path, request):
    """Generations in order, process rows written and replaced, forgotten on stop (gateway.ledger.reloads)."""
    from gateway.ledger.reloads import ReloadLog
    from gateway.ledger.writer import Ledger

    location = tmp_path / "l.sqlite3" if engine == "sqlite" else request.getfixturevalue("postgres_url")
    Ledger(location, dead_letter_dir=tmp_path).close()  # migrated
    log = ReloadLog(location)
    try:
        assert log.latest() == 0
        assert [log.add("p1", "abc"), log.add("p2", None)] == [1, 2] and log.latest() == 2
        row = {"id": "h:1:0", "host": "h", "pid": 1, "started_at": 0.0, "generation": 2, "classifier": None}
        log.publish(row)
        log.publish({**row, "generation": 3})
        [found] = log.processes()
        assert found["generation"] == 3 and found["updated_at"] > time.time() - 60
        log.forget("h:1:0")
        assert log.processes() == []
    finally:
        log.close()
