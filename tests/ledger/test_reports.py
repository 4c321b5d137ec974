import random
import sqlite3

import pytest

from gateway.ledger import reports
from gateway.ledger.database import _migrations, connect, migrate
from gateway.ledger.errors import InvalidQuery, NotFound
from gateway.ledger.records import CALL_COLUMNS, REQUEST_COLUMNS, call_rows, insert_sql, key_id, request_row
from tests.support.ledger import BASE, CHEAP, LONG, cached, call, record, sample_records, write_ledger


@pytest.fixture
def conn(ledger_location, tmp_path):
    """The sample ledger, read-only, on each engine."""
    ledger = write_ledger(ledger_location, sample_records(), tmp_path)
    ledger.close()
    reader = reports.connect_reader(ledger.location)
    yield reader
    reader.close()


def by_group(report):
    return {row["group"]: row for row in report["groups"]}


def test_costs_by_route_counts_cost_counterfactual_and_saving(conn):
    report = reports.costs(conn, "route")
    groups = by_group(report)
    assert set(groups) == {"rag", "long", "rag>long", "direct", None}
    rag = groups["rag"]
    assert rag["requests"] == 4
    assert rag["prompt_tokens"] == 3900 and rag["completion_tokens"] == 150 and rag["total_tokens"] == 4050
    assert rag["cost_usd"] == pytest.approx(0.003)
    assert rag["counterfactual_cost_usd"] == pytest.approx(0.123)
    assert rag["saving_usd"] == pytest.approx(0.120)
    # a fallback costs the cheap attempt on top of the long answer: a negative saving
    assert groups["rag>long"]["saving_usd"] == pytest.approx(-0.002)
    assert groups["long"]["saving_usd"] == pytest.approx(0.0)
    total = report["total"]
    assert total["requests"] == 10
    assert total["cost_usd"] == pytest.approx(0.1651)
    assert total["counterfactual_cost_usd"] == pytest.approx(0.2833)
    assert total["saving_usd"] == pytest.approx(0.2833 - 0.1651)
    # sorted by cost, most expensive first
    assert [r["group"] for r in report["groups"]][:2] == ["rag>long", "long"]


def test_costs_by_model_counts_legs_and_errors(conn):
    groups = by_group(reports.costs(conn, "model"))
    assert groups[CHEAP]["calls"] == 7 and groups[CHEAP]["errors"] == 1
    assert groups[CHEAP]["cost_usd"] == pytest.approx(0.0051)
    assert groups[LONG]["calls"] == 4 and groups[LONG]["prompt_tokens"] == 80000
    assert groups[LONG]["cost_usd"] == pytest.approx(0.16)
    assert groups[LONG]["counterfactual_cost_usd"] is None and groups[LONG]["requests"] is None


def test_costs_by_day_hour_policy_key_use_utc_labels(conn):
    days = by_group(reports.costs(conn, "day"))
    assert list(days) == ["2026-01-01", "2026-01-02"]
    assert days["2026-01-01"]["requests"] == 6 and days["2026-01-01"]["cost_usd"] == pytest.approx(0.0831)
    assert days["2026-01-02"]["counterfactual_cost_usd"] == pytest.approx(0.121)
    hours = by_group(reports.costs(conn, "hour"))
    assert hours["2026-01-01T00:00Z"]["requests"] == 2 and hours["2026-01-01T02:00Z"]["requests"] == 2
    assert by_group(reports.costs(conn, "policy"))["strict"]["requests"] == 2
    assert by_group(reports.costs(conn, "key"))["k_bob"]["requests"] == 2


def test_costs_rejects_unknown_grouping(conn):
    with pytest.raises(InvalidQuery) as info:
        reports.costs(conn, "colour")
    assert info.value.param == "by"


def brute_force(records, since, until, by_route=True):
    out = {}
    for r in records:
        if (since is None or r.created_at >= since) and (until is None or r.created_at < until):
            slot = out.setdefault(r.route, [0, 0.0, 0.0, 0, 0, 0.0])
            slot[0] += 1
            slot[1] += r.cost_usd
            slot[2] += r.counterfactual_cost_usd
            slot[3] += r.cached_tokens > 0  # the provider prompt cache: requests that read it, tokens, saving
            slot[4] += r.cached_tokens
            slot[5] += r.cache_saving_usd
    return out


def test_rollup_plus_raw_edges_equal_a_scan_for_any_time_range(ledger_location, tmp_path):
    rng = random.Random(7)
    records = []
    for i in range(400):
        route = rng.choice(["rag", "long", "rag>long", "direct"])
        cost = rng.choice([0.001, 0.01, 0.04])
        leg = call(CHEAP, route, rng.randrange(10, 900), rng.randrange(1, 50), cost)
        # a cache read, a cache write (a negative saving) or neither
        cached(leg, *rng.choice([(0, 0.0), (leg.prompt_tokens // 2, 0.0004), (0, -0.0001)]))
        records.append(
            record(
                f"q{i:04d}",
                BASE + rng.uniform(0, 3 * 86400),
                route,
                [leg],
                counterfactual=0.05,
                key=rng.choice(["k_a", "k_b"]),
            )
        )
    ledger = write_ledger(ledger_location, records, tmp_path)
    conn = reports.connect_reader(ledger.location)
    bounds = [None, BASE + 1234.5, BASE + 3600 * 5, BASE + 3600 * 5 + 17, BASE + 86400 + 59, BASE + 2 * 86400 + 7000]
    for _ in range(30):
        since, until = sorted(rng.sample(bounds[1:], 2)) if rng.random() < 0.7 else (rng.choice(bounds), None)
        filters = reports.Filters(since=since, until=until)
        report = reports.costs(conn, "route", filters)
        got = {
            r["group"]: (
                r["requests"],
                r["cost_usd"],
                r["counterfactual_cost_usd"],
                r["cache_hits"],
                r["cached_tokens"],
                r["cache_saving_usd"],
            )
            for r in report["groups"]
        }
        want = brute_force(records, since, until)
        assert set(got) == set(want), (since, until)
        for route, (n, cost, cf, hits, tokens, saving) in want.items():
            assert got[route][0] == n and got[route][3:5] == (hits, tokens)
            assert got[route][1] == pytest.approx(cost)
            assert got[route][2] == pytest.approx(cf)
            assert got[route][5] == pytest.approx(saving)
        legs = by_group(reports.costs(conn, "model", filters))  # the legs' figures, from the call rollups
        assert (
            (legs[CHEAP]["cache_hits"], legs[CHEAP]["cached_tokens"])
            == (sum(w[3] for w in want.values()), sum(w[4] for w in want.values()))
            if want
            else legs == {}
        )
        assert report["total"]["cache_saving_usd"] == pytest.approx(sum(w[5] for w in want.values()))
    # filters compose with the time split
    filters = reports.Filters(since=BASE + 1234.5, until=BASE + 86400 + 59, key="k_a", route="rag")
    want = [
        r for r in records if r.key_id == "k_a" and r.route == "rag" and BASE + 1234.5 <= r.created_at < BASE + 86459
    ]
    assert reports.costs(conn, "day", filters)["total"]["requests"] == len(want)


def test_filters_by_route_key_policy_status(conn):
    assert reports.costs(conn, "route", reports.Filters(route="rag"))["total"]["requests"] == 4
    assert reports.costs(conn, "route", reports.Filters(key="k_bob"))["total"]["requests"] == 2
    assert reports.costs(conn, "route", reports.Filters(policy="strict"))["total"]["requests"] == 2
    assert reports.costs(conn, "route", reports.Filters.parse(status="5xx"))["total"]["requests"] == 1
    assert reports.costs(conn, "route", reports.Filters.parse(status="error"))["total"]["requests"] == 2
    assert reports.costs(conn, "route", reports.Filters.parse(status="ok"))["total"]["requests"] == 8
    assert reports.costs(conn, "model", reports.Filters.parse(status="502"))["groups"][0]["errors"] == 1
    assert reports.list_requests(conn, reports.Filters(route="rag>long"))["data"][0]["id"] == "r09"


def test_raw_key_is_hashed_like_the_gateway_does():
    assert reports.Filters.parse(key="sk-secret").key == key_id("sk-secret")
    assert reports.Filters.parse(key="k_0123").key == "k_0123"


def test_parse_time_accepts_iso_and_relative_forms():
    now = 1_800_000_000.0
    assert reports.parse_time("1h", now=now) == now - 3600
    assert reports.parse_time("7d", now=now) == now - 7 * 86400
    assert reports.parse_time("30m", now=now) == now - 1800
    assert reports.parse_time("2026-01-01", now=now) == BASE
    assert reports.parse_time("2026-01-01T01:00:00Z", now=now) == BASE + 3600
    assert reports.parse_time("2026-01-01T02:00:00+01:00", now=now) == BASE + 3600
    assert reports.parse_time("now", now=now) == now
    for bad in ("yesterday", "5 parsecs", "2026-13-01"):
        with pytest.raises(InvalidQuery):
            reports.parse_time(bad, now=now)
    with pytest.raises(InvalidQuery):
        reports.Filters.parse(since="2026-01-02", until="2026-01-01")
    with pytest.raises(InvalidQuery):
        reports.Filters.parse(status="teapot")


def test_pagination_walks_every_request_once_newest_first(conn):
    seen, cursor = [], None
    while True:
        page = reports.list_requests(conn, limit=3, cursor=cursor)
        seen += [item["id"] for item in page["data"]]
        if not page["has_more"]:
            assert page["next_cursor"] is None
            break
        cursor = page["next_cursor"]
    assert seen == [f"r{i:02d}" for i in range(10, 0, -1)]
    page = reports.list_requests(conn, reports.Filters.parse(since="2026-01-02"), limit=50)
    assert [i["id"] for i in page["data"]] == ["r10", "r09", "r08", "r07"]
    assert page["data"][1]["models"] == [CHEAP, LONG]
    with pytest.raises(InvalidQuery):
        reports.list_requests(conn, cursor="not-a-cursor")
    with pytest.raises(InvalidQuery):
        reports.list_requests(conn, limit=0)


def test_pagination_breaks_ties_on_created_at_by_id(ledger_location, tmp_path):
    same = [record(f"t{i}", BASE, "rag", []) for i in range(5)]
    ledger = write_ledger(ledger_location, same, tmp_path)
    conn = reports.connect_reader(ledger.location)
    first = reports.list_requests(conn, limit=2)
    second = reports.list_requests(conn, limit=2, cursor=first["next_cursor"])
    third = reports.list_requests(conn, limit=2, cursor=second["next_cursor"])
    ids = [i["id"] for p in (first, second, third) for i in p["data"]]
    assert ids == ["t4", "t3", "t2", "t1", "t0"]


def test_get_request_has_legs_provenance_and_saving(conn):
    item = reports.get_request(conn, "r01")
    assert item["provenance"] == {"chunks": [{"doc": "a.txt", "chunk": 3}]}
    assert item["saving_usd"] == pytest.approx(0.040)
    assert [c["model"] for c in item["calls"]] == [CHEAP]
    assert item["calls"][0]["prompt_tokens"] == 1000
    with pytest.raises(NotFound) as info:
        reports.get_request(conn, "nope")
    assert info.value.code == "request_not_found"


def test_resubmitted_record_replaces_its_row_its_legs_and_its_rollup(ledger_location, tmp_path):
    first = record("x1", BASE + 10, "rag", [call(CHEAP, "rag", 10, 1, 0.5)], counterfactual=1.0)
    ledger = write_ledger(ledger_location, [first], tmp_path)
    ledger.submit(
        record(
            "x1",
            BASE + 10,
            "rag>long",
            [call(CHEAP, "rag", 10, 1, 0.5), call(LONG, "long", 99, 1, 2.0)],
            counterfactual=1.0,
        )
    )
    ledger.flush()
    conn = reports.connect_reader(ledger.location)
    routes = by_group(reports.costs(conn, "route"))
    assert set(routes) == {"rag>long"} and routes["rag>long"]["cost_usd"] == pytest.approx(2.5)
    models = by_group(reports.costs(conn, "model"))
    assert models[CHEAP]["calls"] == 1 and models[LONG]["calls"] == 1
    assert len(reports.get_request(conn, "x1")["calls"]) == 2


def test_deleting_rows_keeps_rollups_consistent(tmp_path):
    ledger = write_ledger(tmp_path / "ledger.sqlite3", sample_records())
    writer = connect(ledger.path)
    with writer:
        writer.execute("DELETE FROM upstream_calls WHERE request_id IN ('r03', 'r04')")
        writer.execute("DELETE FROM requests WHERE id IN ('r03', 'r04')")
    conn = reports.connect_reader(ledger.path)
    assert reports.costs(conn, "route")["total"]["requests"] == 8
    assert by_group(reports.costs(conn, "model"))[LONG]["calls"] == 2
    assert "rag>long" in by_group(reports.costs(conn, "route"))  # r09 is still there


def test_migration_backfills_rollups_from_an_existing_ledger(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL)")
    for version, name, sql in _migrations():
        if version in (1, 5, 6, 11, 12):  # the raw tables as today (requests in flight too), without the rollups
            raw.executescript(sql)
            raw.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (version, name))
    records = sample_records()
    for rec in records:  # the long legs read 15,000 cached prompt tokens, saving $0.0225 each
        for leg in rec.calls:
            if leg.route == "long":
                cached(leg, 15000, 0.0225)
        rec.cached_tokens = sum(leg.cached_tokens for leg in rec.calls)
        rec.cache_saving_usd = sum(leg.cache_saving_usd for leg in rec.calls)
    # the raw rows alone, as a ledger from before the rollups holds them (write_records now adds to the rollups)
    raw.executemany(insert_sql("requests", REQUEST_COLUMNS), [request_row(r) for r in records])
    raw.executemany(insert_sql("upstream_calls", CALL_COLUMNS), [row for r in records for row in call_rows(r)])
    raw.commit()
    raw.close()
    conn = connect(path)
    assert {2, 8} <= set(migrate(conn))
    conn.close()
    reader = reports.connect_reader(path)
    routes = by_group(reports.costs(reader, "route"))
    assert routes["rag"]["cost_usd"] == pytest.approx(0.003)
    assert (routes["long"]["cache_hits"], routes["long"]["cached_tokens"]) == (2, 30000)
    assert routes["rag>long"]["cache_saving_usd"] == pytest.approx(0.045) and routes["rag"]["cache_hits"] == 0
    assert by_group(reports.costs(reader, "model"))[LONG]["calls"] == 4
    assert by_group(reports.costs(reader, "model"))[LONG]["cached_tokens"] == 60000
    assert reports.costs(reader, "day")["groups"][0]["cache_hits"] == 2  # r03, r04 (day tier backfilled)


def test_requests_after_follows_write_order(conn, tmp_path):
    items, last = reports.requests_after(conn, None, reports.Filters(route="long"))
    assert [i["id"] for i in items] == ["r03", "r07"]
    assert reports.requests_after(conn, last, reports.Filters(route="long")) == ([], last)
    assert reports.requests_after(conn, reports.follow_position(conn)) == ([], reports.follow_position(conn))


def test_export_streams_every_request_oldest_first_with_legs(conn):
    items = list(reports.iter_export(conn, batch=3))
    assert [i["id"] for i in items] == [f"r{i:02d}" for i in range(1, 11)]
    assert [c["model"] for c in items[3]["calls"]] == [CHEAP, LONG]
    assert items[0]["provenance"]["chunks"][0]["doc"] == "a.txt"
    assert [i["id"] for i in reports.iter_export(conn, reports.Filters(route="long"))] == ["r03", "r07"]


def test_ensure_schema_needs_an_existing_ledger(tmp_path):
    with pytest.raises(NotFound) as info:
        reports.ensure_schema(tmp_path / "missing.sqlite3")
    assert info.value.code == "ledger_not_found"
