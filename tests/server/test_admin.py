import asyncio
import json
import re
import time

import pytest
from starlette.testclient import TestClient

from gateway.ledger import reports
from gateway.server.auth import Authenticator
from tests.support.ledger import ADMIN_KEY, BASE, CHEAP, LONG, USER_KEY, admin_app, sample_records, write_ledger
from tests.support.policies import DROP, Whole, write_policy

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture
def ledger(ledger_location, tmp_path):
    ledger = write_ledger(ledger_location, sample_records(), tmp_path)
    yield ledger
    ledger.close()


@pytest.fixture
def client(ledger):
    with TestClient(admin_app(ledger)) as client:
        yield client


@pytest.mark.parametrize(
    "path", ["/v1/admin/requests", "/v1/admin/requests/r01", "/v1/admin/costs", "/v1/admin/summary"]
)
def test_admin_endpoints_need_the_admin_key(client, path):
    missing = client.get(path)
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    wrong = client.get(path, headers={"Authorization": "Bearer sk-nobody"})
    assert wrong.status_code == 401
    user = client.get(path, headers={"Authorization": f"Bearer {USER_KEY}"})
    assert user.status_code == 403
    assert user.json()["error"]["code"] == "admin_key_required"
    assert client.get(path, headers=ADMIN).status_code == 200


def test_admin_endpoints_are_disabled_when_keys_exist_but_no_admin_key(ledger):
    with TestClient(admin_app(ledger, auth=Authenticator([USER_KEY]))) as client:
        response = client.get("/v1/admin/costs", headers={"Authorization": f"Bearer {USER_KEY}"})
    assert response.status_code == 403 and response.json()["error"]["code"] == "admin_disabled"


def test_requests_filters_and_cursor_pagination(client):
    first = client.get(
        "/v1/admin/requests", params={"limit": 2, "since": "2026-01-01", "until": "2026-01-02"}, headers=ADMIN
    ).json()
    assert [i["id"] for i in first["data"]] == ["r06", "r05"] and first["has_more"]
    second = client.get(
        "/v1/admin/requests",
        params={"limit": 2, "since": "2026-01-01", "until": "2026-01-02", "cursor": first["next_cursor"]},
        headers=ADMIN,
    ).json()
    assert [i["id"] for i in second["data"]] == ["r04", "r03"]
    assert second["data"][0]["models"] == [CHEAP, LONG]
    fallbacks = client.get("/v1/admin/requests", params={"route": "rag>long"}, headers=ADMIN).json()
    assert [i["id"] for i in fallbacks["data"]] == ["r09", "r04"] and not fallbacks["has_more"]
    errors = client.get("/v1/admin/requests", params={"status": "error", "key": "k_bob"}, headers=ADMIN).json()
    assert [i["id"] for i in errors["data"]] == ["r06"]


def test_request_detail_and_unknown_id(client):
    detail = client.get("/v1/admin/requests/r04", headers=ADMIN).json()
    assert [c["model"] for c in detail["calls"]] == [CHEAP, LONG]
    assert detail["route"] == "rag>long" and detail["saving_usd"] == pytest.approx(-0.001)
    assert client.get("/v1/admin/requests/r01", headers=ADMIN).json()["provenance"]["chunks"][0]["chunk"] == 3
    missing = client.get("/v1/admin/requests/does-not-exist", headers=ADMIN)
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "request_not_found"


def test_a_nul_in_a_parameter_is_a_400_on_both_engines(client):
    """PostgreSQL refuses a NUL in a query's text: it was a 500 there."""
    for path, params in [
        ("/v1/admin/requests", {"key": "a\x00b"}),
        ("/v1/admin/requests", {"route": "rag\x00"}),
        ("/v1/admin/costs", {"policy": "\x00"}),
    ]:
        refused = client.get(path, params=params, headers=ADMIN)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == next(iter(params)), refused.text
    refused = client.get("/v1/admin/requests/r%0001", headers=ADMIN)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_request_id"


def test_costs_endpoint_groups_and_rejects_bad_input(client):
    body = client.get("/v1/admin/costs", params={"by": "day"}, headers=ADMIN).json()
    assert [g["group"] for g in body["groups"]] == ["2026-01-01", "2026-01-02"]
    assert body["total"]["saving_usd"] == pytest.approx(0.2833 - 0.1651)
    routes = client.get("/v1/admin/costs", params={"by": "route", "policy": "strict"}, headers=ADMIN).json()
    assert {g["group"] for g in routes["groups"]} == {"direct", "rag"}
    bad_by = client.get("/v1/admin/costs", params={"by": "colour"}, headers=ADMIN)
    assert bad_by.status_code == 400 and bad_by.json()["error"]["param"] == "by"
    bad_time = client.get("/v1/admin/costs", params={"since": "last tuesday"}, headers=ADMIN)
    assert bad_time.status_code == 400 and bad_time.json()["error"]["code"] == "invalid_time"
    bad_limit = client.get("/v1/admin/requests", params={"limit": "many"}, headers=ADMIN)
    assert bad_limit.status_code == 400


def test_summary_endpoint_and_window_validation(ledger, client):
    from tests.support.ledger import call, record

    now = time.time()
    for i, route in enumerate(["rag", "rag", "rag>long", "long"]):
        ledger.submit(
            record(f"now{i}", now - 600 * (i + 1), route, [call(CHEAP, route, 10, 1, 0.01)], counterfactual=0.05)
        )
    ledger.flush()
    body = client.get("/v1/admin/summary", params={"window": "1h"}, headers=ADMIN).json()
    assert body["totals"]["requests"] == 4 and body["bucket"] == "minute"
    assert body["fallback"]["rate"] == pytest.approx(1 / 3)
    assert body["totals"]["saving_usd"] == pytest.approx(0.16)
    assert {m["group"] for m in body["route_mix"]} == {"rag", "long", "rag>long"}
    assert client.get("/v1/admin/summary", params={"window": "30d"}, headers=ADMIN).json()["bucket"] == "day"
    assert client.get("/v1/admin/summary", params={"window": "1s"}, headers=ADMIN).status_code == 400
    assert client.get("/v1/admin/summary", params={"window": "soon"}, headers=ADMIN).status_code == 400


def test_queries_run_in_a_worker_thread_not_on_the_event_loop(client, monkeypatch):
    seen = {}
    real = reports.costs

    def spy(conn, by, filters):
        try:
            asyncio.get_running_loop()
            seen["on_loop"] = True
        except RuntimeError:
            seen["on_loop"] = False
        return real(conn, by, filters)

    monkeypatch.setattr(reports, "costs", spy)
    assert client.get("/v1/admin/costs", headers=ADMIN).status_code == 200
    assert seen == {"on_loop": False}


def test_dashboard_page_is_self_contained(client):
    response = client.get("/dashboard")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "/v1/admin/summary" in page
    for external in ("<link", " src=", "@import", "https://", "cdn"):
        assert external not in page.lower(), external
    assert not re.search(r"""(?:href\s*=\s*|url\(\s*)["']?(?:https?:)?//""", page)
    assert page.count("http://") == 1 and "http://www.w3.org/2000/svg" in page  # the SVG namespace, not an asset


def test_admin_reads_see_records_written_after_startup(ledger, client):
    from tests.support.ledger import call, record

    ledger.submit(record("late", BASE + 2 * 86400, "long", [call(LONG, "long", 10, 1, 1.0)], counterfactual=1.0))
    ledger.flush()
    assert client.get("/v1/admin/requests/late", headers=ADMIN).status_code == 200
    body = client.get("/v1/admin/costs", params={"by": "route"}, headers=ADMIN).json()
    assert body["total"]["requests"] == 11


def test_routes_are_mounted_in_the_real_app(tmp_path):
    import httpx

    from tests.support.gateway import running_gateway
    from tests.support.policies import make_policy

    write_ledger(tmp_path / "ledger.sqlite3", sample_records()).close()
    auth = Authenticator([USER_KEY], ADMIN_KEY)
    with running_gateway(tmp_path, make_policy("http://127.0.0.1:9"), auth=auth) as (url, app):
        costs = httpx.get(f"{url}/v1/admin/costs", params={"by": "route"}, headers=ADMIN)
        assert costs.status_code == 200 and costs.json()["total"]["requests"] == 10
        assert httpx.get(f"{url}/v1/admin/requests/r04", headers=ADMIN).json()["route"] == "rag>long"
        assert httpx.get(f"{url}/v1/admin/requests/nope", headers=ADMIN).status_code == 404
        assert httpx.get(f"{url}/v1/admin/summary", headers={"Authorization": f"Bearer {USER_KEY}"}).status_code == 403
        assert "/v1/admin/summary" in httpx.get(f"{url}/dashboard").text
        assert "# TYPE selfroute_requests_total counter" in httpx.get(f"{url}/metrics").text


def reload_policy(path, base: str, threshold: float, shadow_backoff: dict | None = None):
    """Both routes on the fake upstream (unpriced), the shipped classifier and verifier, learning on (with
    `shadow_backoff`, its routing.learning.shadow_backoff)."""
    unpriced = {"input_cost_per_mtok": DROP, "output_cost_per_mtok": DROP}
    backoff = {"shadow_backoff": shadow_backoff} if shadow_backoff is not None else {}
    routing = Whole(
        classifier={"model_path": "builtin:default", "threshold": 0.0},
        default_route="rag",
        verifier={"model_path": "builtin:verifier", "threshold": threshold},
        learning={"judge": True, "shadow_rate": 0.2, **backoff},
    )
    return write_policy(path, base, name="learned", cheap=unpriced, long=unpriced, routing=routing, passthrough=DROP)


def explained(url: str) -> dict:
    import httpx

    from tests.support.routing import document_text

    body = {
        "model": "selfroute",
        "messages": [{"role": "user", "content": "Who is the keeper of the lighthouse?"}],
        "selfroute": {"documents": [{"text": document_text(0)}]},
    }
    answer = httpx.post(f"{url}/v1/route/explain", json=body, headers={"authorization": f"Bearer {USER_KEY}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_policy_reload_puts_the_model_learn_wrote_in_force(upstream, tmp_path, capsys):
    """A real server: `selfroute learn` writes a new classifier and points the policy at it, POST /v1/admin/reload
    loads it, and the next explain decides with it, without a restart; a reload that fails keeps it."""
    import httpx

    from gateway.cli import main
    from gateway.routing.model_files import load_route_model
    from policies.loader import load_policy
    from tests.support.gateway import running_gateway
    from tests.support.ledger import recorded_ledger

    labels = tmp_path / "labels.sqlite3"
    threshold = recorded_ledger(labels, n=420, route_signal=True)
    policy_file = reload_policy(tmp_path / "policy.yaml", upstream[0], threshold)
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    auth = Authenticator([USER_KEY], ADMIN_KEY)
    with running_gateway(tmp_path / "data", None, policy_path=policy_file, auth=auth) as (url, app):
        before = explained(url)
        shipped = load_route_model(*load_policy(policy_file))
        assert before["probability"] == pytest.approx(shipped.cheap_probability(before["features"]))
        assert main(["learn", "--policy", str(policy_file), "--ledger-url", str(labels), "--json"]) == 0
        written = json.loads(capsys.readouterr().out)["classifier"]
        assert written["written"], written
        assert explained(url)["probability"] == before["probability"]  # nothing changes before the reload
        assert httpx.post(f"{url}/v1/admin/reload", headers={"authorization": f"Bearer {USER_KEY}"}).status_code == 403
        reloaded = httpx.post(f"{url}/v1/admin/reload", headers=admin)
        assert reloaded.status_code == 200, reloaded.text
        assert reloaded.json()["classifier"]["model_path"] == written["model_path"]
        learned = load_route_model(*load_policy(policy_file))
        after = explained(url)
        assert after["probability"] == pytest.approx(learned.cheap_probability(after["features"]))
        assert after["probability"] != pytest.approx(before["probability"])
        assert after["threshold"] == pytest.approx(written["new_threshold"])
        # a policy whose model file is gone: 409, and the learned model stays in force
        policy_file.write_text(policy_file.read_text().replace(written["model_path"], "missing.skops"))
        failed = httpx.post(f"{url}/v1/admin/reload", headers=admin)
        assert failed.status_code == 409 and failed.json()["error"]["code"] == "reload_failed"
        assert "missing.skops" not in failed.text  # paths stay in the log
        assert explained(url)["probability"] == pytest.approx(after["probability"])


def test_the_policy_reload_puts_the_shadow_scale_learn_wrote_in_force(upstream, tmp_path, capsys):
    """routing.learning.shadow_backoff: `selfroute learn` doubles the scale after a winning refit and writes it; the
    gateway draws shadows at the old scale until POST /v1/admin/reload, then at the new one."""
    import httpx

    from gateway.cli import main
    from tests.support.gateway import running_gateway
    from tests.support.ledger import recorded_ledger

    labels = tmp_path / "labels.sqlite3"
    backoff = {"factor": 0.5, "min_scale": 0.1, "scale": 0.5}
    policy_file = reload_policy(tmp_path / "policy.yaml", upstream[0], recorded_ledger(labels), backoff)
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    auth = Authenticator([USER_KEY], ADMIN_KEY)
    with running_gateway(tmp_path / "data", None, policy_path=policy_file, auth=auth) as (url, app):
        loop = app.state.gateway.routing.learning
        assert loop.shadow_chance(None) == pytest.approx(0.1)  # 0.2 x 0.5
        args = ["learn", "--policy", str(policy_file), "--ledger-url", str(labels), "--min-model-labels", "50"]
        assert main([*args, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["shadow_backoff"]["scale"] == 1.0
        assert loop.shadow_chance(None) == pytest.approx(0.1)  # nothing changes before the reload
        assert httpx.post(f"{url}/v1/admin/reload", headers=admin).status_code == 200
        assert loop.shadow_chance(None) == pytest.approx(0.2)
