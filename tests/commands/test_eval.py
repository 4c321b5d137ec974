"""`selfroute eval prepare-leval | replay | absent` on tiny fixtures of our own (real MiniLM + LanceDB)."""

import json

import pytest

from gateway.cli import main
from tests.support.policies import DROP, shipped_policy_data, write_shipped_policy
from tests.support.routing import two_corpora

STRATEGIES = [
    "always-long",
    "always-rag",
    "self-route",
    "rules+classifier",
    "router (rules+classifier+fallback)",
    "router + keep-refusal option",
    "verifier only (rag, then verifier)",
    "rules+classifier+verifier",
    "oracle",
]


def test_prepare_leval_converts_rows_and_documents(tmp_path, capsys):
    leval = tmp_path / "leval"
    tasks = leval / "LEval-data" / "Closed-ended-tasks"
    tasks.mkdir(parents=True)
    lines = [
        {"input": "Document zero text.", "instructions": ["Q0a?", "Q0b?"], "outputs": ["a", "b"]},
        {"input": "Document one text.", "instructions": ["Q1a?"], "outputs": ["c"]},
    ]
    (tasks / "quiz.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    paired = [
        {
            "task": "quiz",
            "doc": 0,
            "question": 1,
            "query": "Q0b?",
            "gt": "b",
            "rag_pred": "b",
            "lc_pred": "x",
            "metric": "exam",
            "rag_score": 1.0,
            "lc_score": 0.0,
        },
        {
            "task": "quiz",
            "doc": 1,
            "question": 0,
            "query": "Q1a?",
            "gt": "c",
            "rag_pred": "unanswerable",
            "lc_pred": "c",
            "metric": "exam",
            "rag_score": 0.0,
            "lc_score": 1.0,
        },
        {
            "task": "quiz",
            "doc": 1,
            "question": 0,
            "query": "Different?",
            "gt": "c",
            "rag_pred": "c",
            "lc_pred": "c",
            "metric": "exam",
            "rag_score": 1.0,
            "lc_score": 1.0,
        },
    ]
    (leval / "paired_rag_vs_lc.jsonl").write_text("".join(json.dumps(x) + "\n" for x in paired))
    out = tmp_path / "out"
    assert main(["eval", "prepare-leval", str(leval), str(out)]) == 0
    rows = [json.loads(line) for line in (out / "paired.jsonl").read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == ["quiz-000", "quiz-001", "quiz-001"]
    assert rows[1] == {
        "doc_id": "quiz-001",
        "query": "Q1a?",
        "rag_score": 0.0,
        "lc_score": 1.0,
        "rag_pred": "unanswerable",
        "lc_pred": "c",
        "task": "quiz",
        "gt": "c",
        "group": "quiz-001",
        "metric": "exam",
        "model": "gpt-3.5-turbo",
    }
    assert (out / "docs" / "quiz-000.txt").read_text() == "Document zero text."
    printed = capsys.readouterr().out
    assert "3 questions over 2 documents" in printed and "1 queries differ" in printed
    assert main(["eval", "prepare-leval", str(tmp_path / "missing"), str(out)]) == 2


@pytest.mark.slow
def test_replay_json_has_every_strategy_and_sane_accounting(replay_run, capsys):
    assert main([*replay_run["args"], "--json", "--plot", str(replay_run["plot"])]) == 0
    result = json.loads(capsys.readouterr().out)
    by_name = {s["name"]: s for s in result["strategies"]}
    assert list(by_name) == STRATEGIES
    assert by_name["always-long"]["tokens_vs_long"] == 1.0 and by_name["always-long"]["cost_vs_long"] == 1.0
    assert by_name["always-rag"]["tokens_vs_long"] < 1.0
    for s in result["strategies"]:
        assert by_name["oracle"]["quality"] >= s["quality"] - 1e-12
    # six documents, one refusal each: self-route escalates exactly those
    assert by_name["self-route"]["route_shares"]["rag>long"] == pytest.approx(6 / 30)
    assert result["questions"] == 30 and result["documents"] == 6
    assert "gpt-3.5-turbo" in result["prices"]["source"]
    gap = result["gap_recovery"]
    assert gap["quality_long"] > gap["quality_rag"] and 0.0 <= gap["cpt50"] <= 1.0
    assert replay_run["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    curve = result["curves"]["rules+classifier (thresholds)"]
    assert curve[0]["long_share"] == 0.0 and curve[-1]["long_share"] == 1.0


@pytest.mark.slow
def test_replay_table_output(replay_run, capsys):
    # second run: routing inputs come from the cache under --data-dir
    assert main(replay_run["args"]) == 0
    out = capsys.readouterr().out
    for name in STRATEGIES:
        assert f"| {name}" in out
    assert "APGR" in out and "CPT(50%)" in out and "30 questions over 6 documents" in out
    assert "Per task" in out and "| synthetic" in out
    assert "verifier the policy's, refitted out of fold" in out


@pytest.mark.slow
def test_replay_with_the_long_models_prompt_cache(replay_run, capsys):
    # the reference long model has no cache prices: the replay says so instead of guessing
    assert main([*replay_run["args"], "--prompt-cache", "on"]) == 2
    assert "gpt-3.5-turbo-16k" in capsys.readouterr().err
    assert main([*replay_run["args"], "--json"]) == 0
    cold = {s["name"]: s for s in json.loads(capsys.readouterr().out)["strategies"]}
    assert main([*replay_run["args"], "--json", "--long-cache-prices", "0.3,3.75"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["prices"]["long_cache"]["read"] == 0.3 and result["prices"]["long_cache"]["write"] == 3.75
    warm = {s["name"]: s for s in result["strategies"]}
    # five questions a document: always-long writes each block once and reads it four times
    assert warm["always-long"]["cost_usd"] < 0.6 * cold["always-long"]["cost_usd"]
    assert warm["always-long"]["prompt_tokens"] == cold["always-long"]["prompt_tokens"]
    # the cheap legs cost the same; against a cheaper baseline they are a larger share of it
    assert warm["always-rag"]["cost_usd"] == pytest.approx(cold["always-rag"]["cost_usd"])
    assert warm["always-rag"]["cost_vs_long"] > cold["always-rag"]["cost_vs_long"]
    assert main([*replay_run["args"], "--long-cache-prices", "0.3", "--cache-window", "2"]) == 0
    out = capsys.readouterr().out
    assert "prompt cache: read 0.3/M, writes at the input price" in out and "warm for 2 questions" in out
    assert "30 of 30 questions have a cacheable document block" in out


@pytest.mark.slow
def test_replay_trained_models_as_they_are_and_leave_one_task_out(replay_run, capsys):
    from tests.support.routing import two_task_fixture

    paired = two_task_fixture(replay_run["folder"])
    verifier = replay_run["folder"] / "verifier.skops"
    common = [
        "--docs",
        str(replay_run["folder"] / "docs"),
        "--data-dir",
        str(replay_run["data_dir"]),
        "--prices",
        "reference",
        "--log-level",
        "WARNING",
    ]
    assert (
        main(
            [
                "train",
                "--verifier",
                "--data",
                str(paired),
                "--out",
                str(verifier),
                "--estimator",
                "logistic",
                "--folds",
                "3",
                *common,
            ]
        )
        == 0
    )
    card_threshold = json.loads(verifier.with_suffix(".json").read_text())["threshold"]
    capsys.readouterr()
    model = "classifier/models/default.skops"
    no_threshold = {"routing": {"verifier": {"threshold": DROP}}}  # the verifier's own card threshold then
    assert "threshold" not in shipped_policy_data(**no_threshold)["routing"]["verifier"]
    policy = write_shipped_policy(replay_run["folder"] / "no-threshold.yaml", **no_threshold)
    assert (
        main(
            [
                "eval",
                "replay",
                "--data",
                str(paired),
                "--model",
                model,
                "--verifier",
                str(verifier),
                "--policy",
                str(policy),
                "--protocol",
                "loto",
                "--json",
                *common,
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    by_name = {s["name"]: s for s in result["strategies"]}
    assert result["verifier_threshold"] == pytest.approx(card_threshold)  # the card's: the policy names none
    assert result["model"] == model and result["protocol"] == "loto"
    only = by_name["verifier only (rag, then verifier)"]
    assert set(only["route_shares"]) <= {"rag", "rag>long", "kept-refusal"}
    assert set(only["per_task"]) == {"even", "odd"}
    # one task alone cannot be left out
    assert (
        main(["eval", "replay", "--data", str(replay_run["folder"] / "paired.jsonl"), "--protocol", "loto", *common])
        == 2
    )
    assert "at least two tasks" in capsys.readouterr().err


SQUAD = {
    "version": "v2.0",
    "data": [
        {
            "title": "Harbour",
            "paragraphs": [
                {
                    "context": "Kestrel Harbour was built in 1871. Its keeper, Ada Quill, kept the tide gauge of copper.",
                    "qas": [
                        {
                            "id": "1",
                            "question": "Who kept the tide gauge?",
                            "is_impossible": False,
                            "answers": [{"text": "Ada Quill", "answer_start": 40}],
                        },
                        {
                            "id": "2",
                            "question": "What colour was the lighthouse on Mars?",
                            "is_impossible": True,
                            "answers": [],
                        },
                    ],
                },
                {
                    "context": "The harbour received forty ships in its first year, mostly fishing boats.",
                    "qas": [
                        {
                            "id": "3",
                            "question": "How many ships came in the first year?",
                            "is_impossible": False,
                            "answers": [{"text": "forty", "answer_start": 21}],
                        },
                        {"id": "4", "question": "Which king opened the airport?", "is_impossible": True, "answers": []},
                    ],
                },
            ],
        }
    ],
}


@pytest.mark.slow
def test_absent_reports_kept_and_escalated_refusals(tmp_path, capsys):
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps(SQUAD))
    absent = {"keep_refusal_when_absent": True, "absent_max_top_score": 0.99, "absent_min_probability": 0.0}
    policy = write_shipped_policy(tmp_path / "policy.yaml", routing={"fallback": absent})
    rc = main(
        [
            "eval",
            "absent",
            "--squad",
            str(squad),
            "--policy",
            str(policy),
            "--json",
            "--data-dir",
            str(tmp_path / "data"),
        ]
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n_unanswerable"] == 2 and report["n_answerable"] == 2
    # thresholds that accept any evidence keep every refusal
    assert report["kept_unanswerable"] == 2 and report["kept_answerable"] == 2
    assert set(report["auc_for_absent"]) == {"-top_score", "-term_coverage", "-top_margin", "P(cheap)"}


@pytest.mark.slow
def test_replay_leaves_one_corpus_or_one_model_out(replay_run, capsys):
    pairs = two_corpora(replay_run["folder"] / "corpora")
    common = [
        *pairs,
        "--folds",
        "3",
        "--prices",
        "reference",
        "--estimator",
        "logistic",
        "--data-dir",
        str(replay_run["data_dir"]),
        "--log-level",
        "WARNING",
        "--json",
    ]
    assert main(["eval", "replay", *common, "--protocol", "corpus", "--max-token-share", "0.9"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["corpora"] == ["alpha", "beta"] and result["questions"] == 30
    units = {u["unit"]: u for u in result["units"]}
    assert set(units) == {"alpha", "beta"} and units["alpha"]["n"] == 15
    for u in units.values():
        by_name = {s["name"]: s for s in u["strategies"]}
        assert {"always-long", "always-rag", "self-route", "rules+classifier+verifier", "oracle"} <= set(by_name)
        at_25 = next(t for t in u["transfer"] if t["share"] == 0.25)
        assert at_25["points"] == pytest.approx(u["transfer_points_at_25"])
        assert at_25["points"] == pytest.approx(100 * (at_25["verifier"] - at_25["random"]))
        # the curve starts at no escalation (always-RAG's tokens) and ends escalating everything
        tokens = sorted(p["tokens_vs_long"] for p in u["curve"])
        assert tokens[0] == pytest.approx(by_name["always-rag"]["tokens_vs_long"]) and tokens[-1] > 1.0
    chosen = result["chosen_across_units"]
    assert set(chosen["per_unit"]) == {"alpha", "beta"} and chosen["cap"] == 0.9
    assert main(["eval", "replay", *common, "--protocol", "model"]) == 0
    assert {u["unit"] for u in json.loads(capsys.readouterr().out)["units"]} == {"m0", "m1"}
    # one corpus cannot be left out, and the pairs must match
    assert main(["eval", "replay", *pairs[:4], *common[len(pairs) :], "--protocol", "corpus"]) == 2
    assert "at least two corpora" in capsys.readouterr().err
    assert main(["eval", "replay", *pairs, "--docs", pairs[3], *common[len(pairs) :]]) == 2
    assert "one --docs per --data" in capsys.readouterr().err


@pytest.mark.slow
def test_replay_refits_the_verifier_on_the_portable_features_with_its_own_estimator(replay_run, capsys):
    from classifier.verifier import PORTABLE_FEATURE_NAMES

    common = [
        *two_corpora(replay_run["folder"] / "corpora"),
        "--prices",
        "reference",
        "--data-dir",
        str(replay_run["data_dir"]),
        "--log-level",
        "WARNING",
        "--json",
        "--protocol",
        "corpus",
        "--features",
        "portable",
        "--importance",
    ]
    transfer = {}
    for estimator in ("logistic", "boosting"):
        assert main(["eval", "replay", *common, "--verifier-estimator", estimator]) == 0
        result = json.loads(capsys.readouterr().out)
        # the importance is over the portable set, the first row the unshuffled scores
        assert sorted(name for name, _ in result["importance"][1:]) == sorted(PORTABLE_FEATURE_NAMES)
        transfer[estimator] = [(u["unit"], u["gain_auc"], u["transfer_points_at_25"]) for u in result["units"]]
    # the verifier's estimator is its own (the pre-route model stays boosting, the default --estimator)
    assert transfer["logistic"] != transfer["boosting"]
