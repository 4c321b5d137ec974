"""`selfroute train`: fit the routing classifier (or, with --verifier, the answer verifier) on labelled
examples and write model + card."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "train",
        parents=parents,
        help="train the routing classifier P(cheap route suffices)",
        description=(
            "Train the routing classifier. Each JSON line has a query, its documents (doc_id -> DIR/<doc_id>.txt, "
            "or `documents`: ids or inline {id, text}) and a label (1 = the cheap route suffices) or rag_score and "
            "lc_score. Features are computed with the gateway's own code, including a retrieval pass over a "
            "LanceDB store under --data-dir."
        ),
    )
    parser.add_argument(
        "--data",
        required=True,
        type=Path,
        action="append",
        help="examples, JSON lines; repeat (each with its --docs) to train on several corpora",
    )
    parser.add_argument(
        "--docs",
        type=Path,
        default=None,
        action="append",
        help="folder of <doc_id>.txt documents (one per --data, in the same order)",
    )
    parser.add_argument("--out", required=True, type=Path, help="model file to write (.skops; the card goes beside it)")
    parser.add_argument("--policy", type=Path, default=None, help="policy whose RAG settings compute the features")
    parser.add_argument("--label-field", default="label", help="field holding a 0/1 label (default: label)")
    parser.add_argument(
        "--score-margin",
        type=float,
        default=0.0,
        help="without a label: cheap suffices when rag_score >= lc_score - margin (default 0: ties go cheap)",
    )
    parser.add_argument(
        "--estimator",
        choices=["logistic", "boosting"],
        default="boosting",
        help="boosting: gradient-boosted trees (the shipped model); logistic: a linear model",
    )
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds, grouped by document")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--oof-out",
        type=Path,
        default=None,
        help="also write out-of-fold P(cheap) per example (JSON lines) for `selfroute calibrate`",
    )
    parser.add_argument(
        "--protocol",
        choices=["grouped", "loto", "corpus", "model"],
        default=None,
        help="also measure the model on held-out units (loto: tasks; corpus: leave one corpus out; "
        "model: leave one model family out and its documents) and write the figures into its "
        "card; for --verifier, the threshold is chosen on these out-of-fold scores",
    )
    verifier = parser.add_argument_group(
        "answer verifier (--verifier)",
        "Fit the verifier of cheap answers instead: paired lines with rag_pred, rag_score and lc_score. Features "
        "are computed as the gateway computes them (our retrieval's passages for the question, the document's "
        "terms, classifier.answer_features); label: rag_score >= lc_score - margin; each example weighted by "
        "|rag_score - lc_score| (ties 0.05). The card's threshold is the best replay quality under "
        "--max-cost-share, on out-of-fold scores (--threshold-protocol).",
    )
    verifier.add_argument("--verifier", action="store_true", help="train the answer verifier")
    verifier.add_argument(
        "--max-cost-share",
        type=float,
        default=0.45,
        help="the card's threshold: best replay quality with cost <= this share of always-long (default 0.45)",
    )
    verifier.add_argument(
        "--threshold-protocol",
        choices=["loto", "grouped", "corpus", "model"],
        default=None,
        help="out-of-fold scores the threshold is chosen on (the same as --protocol): loto = leave "
        "one task out (the lines' `task`; default), grouped = k-fold by document, corpus = leave "
        "one corpus out, model = leave one model family out",
    )
    verifier.add_argument(
        "--max-token-share",
        type=float,
        default=None,
        help="instead of --max-cost-share: the threshold whose replay keeps every held-out unit's "
        "tokens within this share of its always-long, with the best worst-unit quality margin "
        "over the better of always-long and always-RAG",
    )
    verifier.add_argument(
        "--features",
        choices=["transfer", "transfer+support", "portable", "portable+support", "all"],
        default="transfer",
        help="transfer (default): classifier.verifier.TRANSFER_FEATURE_NAMES, without the features "
        "that learn a corpus's or model's style; transfer+support: with the answer's support in "
        "the passages in embedding space (embeds every answer and its sentences once, cached; the "
        "chunks sent are read from the store as ingestion embedded them); "
        "portable: PORTABLE_FEATURE_NAMES, without the features whose effect reverses between "
        "corpora and with the signals that hold on every corpus and model measured (measured with "
        "--estimator logistic); portable+support: it with the answer's support in embedding space; "
        "all: every answer feature",
    )
    verifier.add_argument(
        "--window-tokens",
        type=int,
        default=None,
        action="append",
        help="long route window for the replay's costs (default: the policy's; 16385 for L-Eval, "
        "128000 for LaRA-128k): once, or once per --data",
    )
    verifier.add_argument(
        "--prices",
        choices=["auto", "policy", "reference"],
        default="auto",
        help="prices of the replay's costs (as `selfroute eval replay`)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.verifier:
        return run_verifier(args)
    from classifier.model import RouteModel
    from classifier.training import LABEL_RULE, data_hash, document_hash, model_card, train
    from gateway.evaluation.cards import route_model_limitations
    from gateway.evaluation.examples import ExampleFileError, RouteInputBuilder, example_label
    from gateway.routing.model_files import save_model
    from gateway.settings import resolve_data_dir
    from policies.loader import PolicyError, load_policy

    try:
        policy, policy_file = load_policy(args.policy)
        examples, _ = _load(args)
        labels = [example_label(e, args.label_field, args.score_margin) for e in examples]
    except (PolicyError, ExampleFileError, OSError) as exc:
        print(f"selfroute train: {exc}", file=sys.stderr)
        return 2
    if args.estimator == "boosting" and len(examples) < 200:
        print(
            f"note: {len(examples)} examples are few for boosted trees (leaves need 30 examples); "
            "consider --estimator logistic",
            file=sys.stderr,
        )
    data_dir = resolve_data_dir(args.data_dir)
    builder = RouteInputBuilder(policy, data_dir / "lancedb", cache_dir=data_dir / "cache")
    rows = [i.features for i in builder.all_inputs(examples, with_long=False)]
    groups = [e.group for e in examples]
    try:
        result = train(rows, labels, groups, args.estimator, args.folds, args.seed)
        held_out = _route_model_units(rows, labels, examples, args) if args.protocol else None
    except ValueError as exc:
        print(f"selfroute train: {exc}", file=sys.stderr)
        return 2
    records = [
        {
            "query": e.query,
            "documents": [[d.id, document_hash(d.text)] for d in e.documents],
            "label": y,
            "group": e.group,
        }
        for e, y in zip(examples, labels)
    ]
    uses_scores = any(args.label_field not in e.record for e in examples)
    rule = LABEL_RULE.replace("margin", f"{args.score_margin:g}") if uses_scores else f"field {args.label_field!r}"
    corpora = _corpora_card(examples, args)
    card = model_card(
        result,
        estimator=args.estimator,
        data_sha=data_hash(records),
        label_rule=rule,
        command=_command(args),
        extra={
            "training_examples": len(examples),
            "training_documents": len(set(groups)),
            # lets `selfroute calibrate` skip examples the model was fitted on
            "training_document_hashes": sorted({document_hash(d.text) for e in examples for d in e.documents}),
            "rag_settings": policy.rag.model_dump(mode="json"),
            "policy": str(args.policy) if args.policy else "the shipped default policy",
            **corpora,
            **({"held_out_validation": held_out} if held_out else {}),
            "limitations": route_model_limitations(result.cv_metrics, held_out, corpora["training_corpora"]),
        },
    )
    save_model(RouteModel(result.pipeline, card), args.out)
    if args.oof_out:
        with args.oof_out.open("w", encoding="utf-8") as out:
            for e, y, p in zip(examples, labels, result.oof_probabilities):
                out.write(json.dumps({"group": e.group, "query": e.query, "label": y, "p_cheap": p}) + "\n")
    metrics = result.cv_metrics
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    print(
        f"cross-validated by document ({metrics['n_splits']} folds, {metrics['n_documents']} documents, "
        f"{metrics['n']} examples): ROC AUC {_f(metrics['roc_auc'])}, accuracy {_f(metrics['accuracy'])} "
        f"(majority {_f(metrics['majority_accuracy'])}), Brier {_f(metrics['brier'])} "
        f"(base rate {_f(metrics['brier_base_rate'])})"
    )
    if held_out:
        print(
            f"{held_out['protocol']}: "
            + ", ".join(f"{u} ROC AUC {_f(m['roc_auc'])}" for u, m in held_out["units"].items())
        )
    return 0


def _load(args: argparse.Namespace):
    """The --data/--docs pairs as one list of examples (each tagged with its corpus) and the windows per corpus."""
    from gateway.evaluation.examples import ExampleFileError, corpus_windows, load_corpora

    docs = args.docs or [None] * len(args.data)
    if len(docs) != len(args.data):
        raise ExampleFileError(f"give one --docs per --data ({len(args.data)} --data, {len(docs)} --docs)")
    examples = load_corpora(list(zip(args.data, docs)))
    return examples, corpus_windows(examples, getattr(args, "window_tokens", None))


def _corpora_card(examples, args: argparse.Namespace) -> dict:
    """What the model was trained on, per corpus: examples, documents (and the documents in its --docs folder),
    tasks and model families."""
    from gateway.evaluation.cards import documents_available
    from gateway.evaluation.examples import corpus_name

    corpora: dict[str, dict] = {}
    for e in examples:
        c = corpora.setdefault(e.corpus, {"examples": 0, "documents": set(), "tasks": set(), "models": set()})
        c["examples"] += 1
        c["documents"].add(e.group)
        if e.task:
            c["tasks"].add(e.task)
        c["models"].add(e.model)
    files = [Path(d) for d in args.data]
    folders = dict(zip((corpus_name(f, files) for f in files), args.docs or [None] * len(files)))
    corpora_of: dict[str, set[str]] = {}
    for e in examples:
        corpora_of.setdefault(e.source, set()).add(e.corpus)
    # a folder counts for its corpus only when its file holds that one corpus
    available = documents_available(
        (next(iter(names)), folders.get(source)) for source, names in corpora_of.items() if len(names) == 1
    )
    return {
        "training_corpora": {
            name: {
                "examples": c["examples"],
                "documents": len(c["documents"]),
                **({"documents_available": available[name]} if name in available else {}),
                "tasks": sorted(c["tasks"]),
                "models": sorted(c["models"]),
            }
            for name, c in sorted(corpora.items())
        },
        "training_models": sorted({e.model for e in examples}),
    }


def _route_model_units(rows, labels, examples, args) -> dict:
    """The pre-route classifier's out-of-fold ROC AUC per held-out unit under --protocol."""
    import numpy as np

    from classifier.training import classification_metrics, out_of_fold_probabilities
    from classifier.verifier import PROTOCOL_NAMES, protocol_splits, split_units
    from gateway.evaluation.verification import protocol_inputs

    groups = [e.group for e in examples]
    splits = protocol_splits(
        args.protocol, labels, groups, n_splits=args.folds, seed=args.seed, **protocol_inputs(examples)
    )
    oof = out_of_fold_probabilities(
        rows, labels, groups, args.estimator, args.folds, args.seed, splits=[(s.train, s.test) for s in splits]
    )
    units = np.asarray(split_units(splits, len(rows)))
    y = np.asarray(labels)
    return {
        "protocol": PROTOCOL_NAMES[args.protocol],
        "units": {u: classification_metrics(y[units == u], oof[units == u]) for u in sorted(set(units.tolist()))},
    }


def run_verifier(args: argparse.Namespace) -> int:
    import numpy as np

    from classifier.answer_features import SUPPORT_FEATURES
    from classifier.training import (
        data_hash,
        document_hash,
        label_from_scores,
        library_versions,
        out_of_fold_probabilities,
    )
    from classifier.verifier import (
        FEATURE_SETS,
        LABEL_RULE,
        PROTOCOL_NAMES,
        choice_weights,
        label_good,
        protocol_scores,
        protocol_splits,
        split_units,
        train_verifier,
    )
    from gateway.commands._common import print_relative
    from gateway.evaluation.cards import curve_card, verifier_limitations
    from gateway.evaluation.examples import CorpusInputs, ExampleFileError
    from gateway.evaluation.prices import resolve_prices
    from gateway.evaluation.replay import without_pre_route
    from gateway.evaluation.report import build_items
    from gateway.evaluation.tradeoff import choose, choose_across_units, relative_choice_card
    from gateway.evaluation.transfer import unit_reports
    from gateway.evaluation.verification import CachedEmbed, answer_rows, cheap_answers, protocol_inputs
    from gateway.routing.model_files import save_verifier
    from gateway.settings import resolve_data_dir
    from pipelines.unanswerable import UnanswerableDetector
    from policies.loader import PolicyError, load_policy

    protocol = args.threshold_protocol or args.protocol or "loto"
    try:
        policy, policy_file = load_policy(args.policy)
        examples, windows = _load(args)
        for e in examples:
            if not all(k in e.record for k in ("rag_pred", "rag_score", "lc_score")):
                raise ExampleFileError(f"{e.corpus}: --verifier needs rag_pred, rag_score and lc_score on every line")
        prices = resolve_prices(policy, args.prices)
        groups = [e.group for e in examples]
        splits = protocol_splits(
            protocol,
            [label_from_scores(e.record["rag_score"], e.record["lc_score"]) for e in examples],
            groups,
            n_splits=args.folds,
            seed=args.seed,
            **protocol_inputs(examples),
        )
    except (PolicyError, ExampleFileError, OSError, ValueError, RuntimeError) as exc:
        print(f"selfroute train: {exc}", file=sys.stderr)
        return 2
    tasks = [e.task for e in examples]
    data_dir = resolve_data_dir(args.data_dir)
    builder = CorpusInputs(policy, data_dir / "lancedb", windows, cache_dir=data_dir / "cache")
    inputs = builder.all_inputs(examples)
    names = list(FEATURE_SETS[args.features])
    embed = CachedEmbed(builder.embedder, data_dir / "cache") if set(names) & set(SUPPORT_FEATURES) else None
    rows = answer_rows(cheap_answers(builder, examples, progress=True, embed=embed))
    rag = [float(e.record["rag_score"]) for e in examples]
    lc = [float(e.record["lc_score"]) for e in examples]
    labels = np.array([label_good(r, c, args.score_margin) for r, c in zip(rag, lc)])
    weights = choice_weights(rag, lc)
    try:
        result = train_verifier(
            rows,
            labels,
            groups,
            estimator=args.estimator,
            feature_names=names,
            sample_weight=weights,
            n_splits=args.folds,
            seed=args.seed,
        )
        oof = (
            result.oof_scores
            if protocol == "grouped"
            else protocol_scores(
                rows,
                labels,
                splits,
                estimator=args.estimator,
                seed=args.seed,
                feature_names=names,
                sample_weight=weights,
            )
        )
    except ValueError as exc:
        print(f"selfroute train: {exc}", file=sys.stderr)
        return 2
    detector = UnanswerableDetector(policy.rag.unanswerable_patterns)
    items = build_items(examples, inputs, [1.0] * len(examples), detector, oof)
    units = split_units(splits, len(items))
    verifier_policy = without_pre_route(policy)
    described = PROTOCOL_NAMES[protocol]
    refusal = policy.routing.verifier.refusal_threshold if policy.routing.verifier is not None else None
    router: dict[str, dict[str, float]] | None = None
    policy_thresholds: dict[str, Any] | None = None
    if args.max_token_share is not None:
        if policy.routing.classifier is not None:
            # the three thresholds together, as `eval replay --max-token-share` chooses them: the pre-route's
            # P(cheap) out of fold under the same protocol, so the card's thresholds are the ones a policy ships;
            # fitted with the policy's classifier's estimator (its card's), not the verifier's --estimator
            p_cheap = out_of_fold_probabilities(
                [i.features for i in inputs],
                [label_from_scores(e.record["rag_score"], e.record["lc_score"]) for e in examples],
                groups,
                _pre_route_estimator(policy, policy_file, args.estimator),
                args.folds,
                args.seed,
                splits=[(s.train, s.test) for s in splits],
            )
            routed = build_items(examples, inputs, [float(p) for p in p_cheap], detector, oof)
            across = choose_across_units(routed, units, policy, prices, max_share=args.max_token_share)
            router = across.per_unit
        else:
            across = choose_across_units(
                items, units, verifier_policy, prices, max_share=args.max_token_share, tune_pre_route=False
            )
        threshold, met = across.verifier_threshold, across.met
        refusal = across.refusal_threshold
        policy_thresholds = {
            "classifier_threshold": across.pre_threshold,
            "threshold": threshold,
            "refusal_threshold": refusal,
            "chosen_by": (
                f"selfroute train --verifier --max-token-share {args.max_token_share:g}: every held-out unit "
                f"({described}) within {args.max_token_share:g} of its always-long's tokens, the most per-unit "
                "targets met, then the best worst-unit margin"
                + (" (the classifier's threshold chosen with them)" if router is not None else "")
                + ("" if met else "; no setting met the cap on every unit, the closest kept")
            ),
            "per_unit": router or across.per_unit,
        }
        if verifier_policy.routing.verifier is not None:  # the held-out figures below at the chosen refusal rule
            verifier_policy = verifier_policy.model_copy(deep=True)
            verifier_policy.routing.verifier.refusal_threshold = refusal  # type: ignore[union-attr]
            # the relative rule's parameters, the thresholds just chosen deciding each key's warm-up; P(cheap) out
            # of fold when there is a pre-route (a candidate may rank by it), every answer checked
            warm_up = verifier_policy.model_copy(deep=True)
            warm_up.routing.verifier.threshold = threshold  # type: ignore[union-attr]
            policy_thresholds["relative"] = relative_choice_card(
                routed if router is not None else items,
                units,
                warm_up,
                max_token_share=args.max_token_share,
                command=f"train --verifier --max-token-share {args.max_token_share:g} ({described})",
            )
        figures = "; ".join(
            f"{u} {o['vs_better_baseline_points']:+.2f} points vs the better of always-long and "
            f"always-RAG at {o['tokens_vs_long']:.3f} of always-long's tokens, {o['long_share']:.1%} "
            f"long or escalated"
            for u, o in sorted(across.per_unit.items())
        )
        with_pre = (
            f"with the pre-route classifier's threshold {across.pre_threshold:.4f} (out-of-fold P(cheap))"
            if router is not None
            else "every answer checked, no pre-route"
        )
        source = (
            f"train: the thresholds keeping every held-out unit's tokens <= {args.max_token_share:g} of its "
            f"always-long, the most per-unit targets met, then the best worst-unit margin, on {described} "
            f"out-of-fold P(good) of {len(examples)} answers ({with_pre}): {figures}"
            + (f"; refusal threshold {refusal:.4f}" if refusal is not None else "; refusals left to the threshold")
            + ("" if met else "; no threshold met the cap on every unit, the one closest kept")
        )
        summary = f"worst unit {across.worst_margin_points:+.2f} points vs the better baseline"
    else:
        pick = choose(items, verifier_policy, prices, max_cost_share=args.max_cost_share, tune_pre_route=False)
        threshold, met, refusal = pick.verifier_threshold, pick.met, pick.refusal_threshold
        source = (
            f"train: best replay quality with cost <= {args.max_cost_share:g} of always-long on {described} "
            f"out-of-fold P(good) of {len(examples)} answers (every answer checked, no pre-route): quality "
            f"{pick.quality_vs_long_points:+.2f} points vs always-long at {pick.cost_vs_long:.3f} of its cost, "
            f"{pick.long_share:.1%} escalated" + ("" if met else "; no threshold met the cap, the cheapest kept")
        )
        summary = (
            f"{pick.quality_vs_long_points:+.2f} points vs always-long at {pick.cost_vs_long:.3f} of its cost, "
            f"{pick.long_share:.1%} escalated"
        )
    held_out: dict[str, dict[str, Any]] = {}
    for r in unit_reports(items, units, verifier_policy, prices, threshold):
        at = r.strategy_named("verifier only (rag, then verifier)")
        held_out[r.unit] = {
            "n": r.n,
            "documents": r.documents,
            "gain_auc": r.gain_auc,
            "verifier_vs_random_points_at_25": r.transfer_points,
            "verifier_vs_random_points": {f"{t['share']:g}": t["points"] for t in r.transfer},
            "at_threshold": {
                "quality": at.quality,
                "vs_long_points": at.quality_vs_long_points,
                "tokens_vs_long": at.tokens_vs_long,
                "cost_vs_long": at.cost_vs_long,
                "escalated": at.route_shares.get("rag>long", 0.0),
            },
            "always_long": r.strategy_named("always-long").quality,
            "always_rag": r.strategy_named("always-rag").quality,
            "self_route": r.strategy_named("self-route").quality,
            "oracle": r.strategy_named("oracle").quality,
            "threshold_curve": curve_card(r.curve),
            **({"router_at_policy_thresholds": router[r.unit]} if router and r.unit in router else {}),
        }
    corpora = _corpora_card(examples, args)
    model = result.model
    model.card.update(
        {
            "threshold": threshold,
            "refusal_threshold": refusal,
            "threshold_source": source,
            "threshold_protocol": described,
            "held_out_validation": {"protocol": described, "units": held_out},
            "label_rule": LABEL_RULE.replace("margin", f"{args.score_margin:g}"),
            "sample_weight": "|rag_score - lc_score|, ties 0.05",
            "training_data_hash": data_hash(
                [
                    {
                        "query": e.query,
                        "documents": [[d.id, document_hash(d.text)] for d in e.documents],
                        "rag_pred": e.record["rag_pred"],
                        "label": int(y),
                    }
                    for e, y in zip(examples, labels)
                ]
            ),
            "training_examples": len(examples),
            "training_documents": len(set(groups)),
            "training_tasks": sorted(set(tasks) - {""}),
            **corpora,
            **({"policy_thresholds": policy_thresholds} if policy_thresholds else {}),
            "limitations": verifier_limitations(
                described, held_out, threshold, refusal, router, corpora["training_corpora"]
            ),
            "prices": prices.__dict__,
            "long_window_tokens": builder.window,
            "library_versions": library_versions(),
            "rag_settings": policy.rag.model_dump(mode="json"),
            "training_command": _command(args),
        }
    )
    save_verifier(model, args.out)
    metrics = result.cv_metrics
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    print(
        f"cross-validated by document ({metrics['n_splits']} folds, {metrics['n_groups']} documents, "
        f"{metrics['n']} answers): ROC AUC {_f(metrics['roc_auc'])}, accuracy {_f(metrics['accuracy'])}"
    )
    print(
        f"threshold {threshold:.4f}: {summary} ({described} out-of-fold scores"
        + ("" if met else "; nothing met the cap")
        + ")"
    )
    if router is not None:
        print(
            f"policy thresholds (chosen together): classifier {across.pre_threshold:.4f}, verifier {threshold:.4f}, "
            "refusal " + ("none" if refusal is None else f"{refusal:.4f}")
        )
        for unit, o in sorted(router.items()):
            print(
                f"  router on {unit}: {o['vs_better_baseline_points']:+.2f} points vs the better of always-long and "
                f"always-RAG at {o['tokens_vs_long']:.3f} of always-long's tokens; Self-Route "
                + ("beaten" if o["beats_self_route"] else "not beaten at no more tokens")
            )
    if policy_thresholds and "relative" in policy_thresholds:
        print_relative(policy_thresholds["relative"])
    for unit, h in held_out.items():
        print(
            f"  held out {unit} ({h['n']} answers): verifier vs random escalation at 25% "
            f"{_pts(h['verifier_vs_random_points_at_25'])}, gain AUC {_f(h['gain_auc'])}; at the threshold "
            f"{h['at_threshold']['vs_long_points']:+.2f} points vs always-long, tokens "
            f"{h['at_threshold']['tokens_vs_long']:.3f}, {h['at_threshold']['escalated']:.1%} escalated"
        )
    return 0


def _pre_route_estimator(policy, policy_file, default: str):
    """The estimator of the policy's pre-route classifier (its card's), for refitting it out of fold."""
    from classifier.model import ModelFileError
    from gateway.routing.model_files import load_model, resolve_model_path

    try:
        card = load_model(resolve_model_path(policy.routing.classifier.model_path, policy_file)).card
    except (ModelFileError, ValueError, OSError):
        return default
    return card.get("estimator", default) if card.get("estimator") in ("logistic", "boosting") else default


def _pts(value) -> str:
    return "n/a" if value is None else f"{value:+.2f} points"


def _command(args: argparse.Namespace) -> str:
    """The training command as it could be typed again (rebuilt from the parsed options)."""
    parts = ["selfroute", "train"]
    for data, docs in zip(args.data, args.docs or [None] * len(args.data)):
        parts += ["--data", str(data)] + (["--docs", str(docs)] if docs is not None else [])
    parts += ["--out", str(args.out)]
    if args.policy is not None:
        parts += ["--policy", str(args.policy)]
    if args.label_field != "label":
        parts += ["--label-field", args.label_field]
    if args.score_margin:
        parts += ["--score-margin", f"{args.score_margin:g}"]
    parts += ["--estimator", args.estimator, "--folds", str(args.folds), "--seed", str(args.seed)]
    if args.protocol and not args.verifier:
        parts += ["--protocol", args.protocol]
    if args.verifier:
        parts += ["--verifier"]
        parts += (
            ["--max-token-share", f"{args.max_token_share:g}"]
            if args.max_token_share is not None
            else ["--max-cost-share", f"{args.max_cost_share:g}"]
        )
        parts += [
            "--threshold-protocol",
            args.threshold_protocol or args.protocol or "loto",
            "--prices",
            args.prices,
            "--features",
            args.features,
        ]
        for window in args.window_tokens or []:
            parts += ["--window-tokens", str(window)]
    return " ".join(shlex.quote(p) for p in parts)


def _f(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"
