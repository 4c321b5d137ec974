"""`selfroute learn --policy P [--since 30d] [--blend-shipped PAIRED.jsonl --blend-docs DIR] [--dry-run]`: refit
the answer verifier and, with enough labels, the pre-route classifier on the ledger's labels (optionally blended with
the shipped training data), compare each out of fold with the model in force on those labels, and only when a refit
is better write its new model file beside the policy and point the policy at it (the old file is kept; a running
gateway loads it at its policy reload, `POST /v1/admin/reload`, or a restart). When no refit is better, the
verifier's two thresholds (P(good) and the refusal threshold) are re-chosen for the model in force and written when
they beat what the policy in force did on the labelled answers (with --thresholds scores: its threshold set from every
recorded checked answer's P(good) for the share, the refusal threshold kept). With a relative threshold
(routing.verifier.relative), its pool and refusal_spend are re-chosen on the labels too (--relative labels, the
default): every recorded checked answer is replayed in recorded order through the live rule for each candidate, and
the choice is written only when the same choice made without each fold's documents holds on that fold.

The comparison (gateway.evaluation.refit, which the learning simulation runs too): folds grouped by document (the
features' `group`), each labelled request scored by a model fitted without its document (and, with --blend-shipped,
on all of the shipped data, which is never scored); the model in force scores the same requests as it is. The
verifier: both at their best verifier and refusal thresholds for the share of labelled cheap answers the policy in
force escalated (or --escalation-share), decided by the live escalation rule; the classifier: both sending long up
front the share the policy in force sent long after their cheap answer, least trusted first. The replay quality is
the share of labelled requests whose answer is as good as the long route's (an escalated answer is; an accepted one is
when its label says so). Shadow labels stand for all accepted answers (weight 1 / the chance it was shadowed:
shadow_rate, less for a context over shadow_reference_tokens). A new classifier's threshold keeps the share of
recorded requests the classifier in force sent long.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gateway.commands._common import add_ledger_argument, ledger_location
from gateway.evaluation.refit import MIN_LABELS, MIN_MODEL_LABELS, MIN_ROUTE_LABELS, Blend
from gateway.files import write_atomic

# the blended shipped lines weigh as this many labels by default: in simulation (BENCHMARKS.md section 12, round nine)
# it beat the refit without a blend on LaRA on both protocols (+0.29 vs +0.21, +0.09 vs -0.22 points over frozen)
BLEND_PRIOR = 500.0


def register(subparsers, parents) -> None:
    parser = subparsers.add_parser(
        "learn",
        parents=parents,
        help="refit the verifier (and classifier) from labels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--policy", required=True, type=Path, help="the policy in force (updated in place)")
    parser.add_argument("--since", default="30d", help="labels of requests since this age (default 30d)")
    parser.add_argument(
        "--min-labels",
        type=int,
        default=MIN_LABELS,
        help=f"fewer labelled requests: nothing is refitted ({MIN_LABELS})",
    )
    parser.add_argument(
        "--min-model-labels",
        type=int,
        default=MIN_MODEL_LABELS,
        help="with fewer labelled requests a refit never replaces the verifier in force, only its thresholds "
        f"(default {MIN_MODEL_LABELS}: on fewer an out-of-fold win is often noise; 0: the 0.5-point win alone decides)",
    )
    parser.add_argument(
        "--min-route-labels",
        type=int,
        default=MIN_ROUTE_LABELS,
        help="labelled requests with pre-route features the classifier needs before it is refitted "
        f"(default {MIN_ROUTE_LABELS})",
    )
    parser.add_argument(
        "--escalation-share",
        type=float,
        default=None,
        help="the share of labelled cheap answers the verifier's new thresholds escalate (weighted; default: the share "
        "the policy in force escalated); given, the thresholds are re-chosen even when no refit is better",
    )
    parser.add_argument(
        "--thresholds",
        choices=["labels", "scores"],
        default="labels",
        help="when no refit replaces the verifier, its thresholds: chosen on the labelled answers (default) or set "
        "from the P(good) of every recorded checked answer (labelled or not) to escalate the share, the refusal "
        "threshold in force kept (on a few labels, thresholds chosen on them fit their noise; BENCHMARKS.md section 12)",
    )
    parser.add_argument(
        "--relative",
        choices=["labels", "fixed"],
        default="labels",
        help="with routing.verifier.relative: re-choose its pool and refusal_spend on the labels, written only when "
        "the choice holds out of fold (labels, default; gateway.evaluation.relative_refit), or leave them (fixed)",
    )
    parser.add_argument(
        "--max-token-share",
        type=float,
        default=None,
        help="the relative rule's escalations may send at most this share of the long tokens of every recorded "
        "checked answer (default: the share the policy in force spent, as recorded)",
    )
    parser.add_argument("--estimator", choices=["logistic", "boosting"], default="logistic")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    blend = parser.add_argument_group(
        "blending the shipped training data (--blend-shipped)",
        "Paired lines (query, documents, rag_pred, rag_score, lc_score) such as /work/shared/data/leval/paired.jsonl,"
        " their features computed as `selfroute train` computes them (cached under --data-dir), added to every"
        " refit's training data (never scored in the comparison), weighted to --blend-weight of the ledger labels.",
    )
    blend.add_argument("--blend-shipped", type=Path, default=None, help="paired training lines (JSON lines)")
    blend.add_argument("--blend-docs", type=Path, default=None, help="their documents' folder (<doc_id>.txt)")
    blend.add_argument("--blend-window-tokens", type=int, default=None, help="their long window (default: policy's)")
    blend.add_argument(
        "--blend-weight",
        type=float,
        default=None,
        help="instead of --blend-prior: total weight of the shipped lines as a multiple of the ledger labels'",
    )
    blend.add_argument(
        "--blend-prior",
        type=float,
        default=BLEND_PRIOR,
        metavar="N",
        help="the shipped lines together weigh as N labelled answers (shadow labels count as the answers they stand "
        f"for), a prior towards the shipped data whose pull shrinks as labels come in (default {BLEND_PRIOR:g}: "
        "BENCHMARKS.md section 12, round nine)",
    )
    parser.add_argument(
        "--escalation-label-weight",
        type=float,
        default=1.0,
        help="escalation labels' weight in the refit's fit, not in its replay (default 1; they exist only for answers "
        "the check distrusted, shadow labels are a random sample)",
    )
    parser.add_argument("--dry-run", action="store_true", help="report only; write nothing")
    parser.add_argument("--json", action="store_true")
    add_ledger_argument(parser)
    parser.set_defaults(func=run)


def _weights(requests, settings) -> list[float]:
    """A shadow label stands for 1 / the chance its request was shadowed: as recorded with the checked answer (the
    shadow_backoff scale then in force), else the live rule in force now from its recorded context tokens
    (gateway.routing.learning.loop.shadow_probability); any other label for itself."""
    from gateway.routing.learning.loop import shadow_probability

    out = []
    for r in requests:
        judged = [lab for lab in r.labels if lab["source"] != "feedback"]
        shadow = bool(judged) and judged[-1]["source"] == "shadow"
        tokens = (r.features.get("features") or {}).get("context_tokens")
        recorded = r.features.get("shadow_chance")
        if not shadow:
            p = 0.0
        elif isinstance(recorded, int | float) and recorded > 0:
            p = float(recorded)
        else:
            p = shadow_probability(settings, tokens if isinstance(tokens, int | float) else None)
        out.append(1.0 / p if p > 0 else 1.0)
    return out


def _labelled_answers(labelled, labels: list[int], weights: list[float]):
    """The ledger's labelled requests as the refit reads them (gateway.evaluation.refit.LabelledAnswers)."""
    from gateway.evaluation.recorded import _numbers
    from gateway.evaluation.refit import LabelledAnswers

    return LabelledAnswers(
        answer_rows=[_numbers(r.features["verifier_features"]) for r in labelled],
        labels=labels,
        weights=weights,
        groups=[r.features.get("group") or r.id for r in labelled],
        refused=[bool(r.features.get("refused")) for r in labelled],
        escalated=[bool(r.features.get("escalated")) for r in labelled],
        # the requests the classifier decided (no rule did)
        route_rows=[
            _numbers(r.features["features"]) if r.features.get("features") and r.features.get("rule") is None else None
            for r in labelled
        ],
        p_cheap=[r.features.get("p_cheap") for r in labelled],
    )


def _load_blend(args, policy, route_model) -> Blend:
    """The shipped lines' pre-route and answer features, computed with the gateway's code (as `selfroute train`)."""
    from gateway.evaluation.examples import CorpusInputs, ExampleFileError, corpus_windows, load_corpora
    from gateway.evaluation.verification import answer_rows, cheap_answers
    from gateway.settings import resolve_data_dir

    examples = load_corpora([(args.blend_shipped, args.blend_docs)])
    for e in examples:
        if not all(k in e.record for k in ("rag_pred", "rag_score", "lc_score")):
            raise ExampleFileError(f"{args.blend_shipped}: blending needs rag_pred, rag_score and lc_score")
    data_dir = resolve_data_dir(args.data_dir)
    windows = corpus_windows(examples, [args.blend_window_tokens] if args.blend_window_tokens else None)
    builder = CorpusInputs(policy, data_dir / "lancedb", windows, cache_dir=data_dir / "cache")
    route_rows = [i.features for i in builder.all_inputs(examples, progress=False, with_long=False)]
    p_cheap = route_model.cheap_probabilities(route_rows) if route_model is not None else None
    return Blend.from_scores(
        route_rows,
        answer_rows(cheap_answers(builder, examples), p_cheap),
        [e.record["rag_score"] for e in examples],
        [e.record["lc_score"] for e in examples],
        [e.group for e in examples],
    )


def run(args: argparse.Namespace) -> int:
    from classifier.model import ModelFileError
    from gateway.evaluation.examples import ExampleFileError
    from gateway.evaluation.recorded import RecordedReadError, read_recorded
    from policies.edit import set_values
    from policies.loader import PolicyError, parse_policy

    try:
        found = read_recorded(args.policy, ledger_location(args), args.since)
    except RecordedReadError as exc:
        print(f"selfroute learn: {exc}", file=sys.stderr)
        return 2
    policy, policy_file, verifier, requests = found.policy, found.policy_file, found.verifier, found.requests
    if verifier is None:
        print("selfroute learn: the policy needs routing.verifier", file=sys.stderr)
        return 2
    if (args.blend_shipped is None) != (args.blend_docs is None):
        print("selfroute learn: --blend-shipped and --blend-docs go together", file=sys.stderr)
        return 2
    labelled = [r for r in requests if r.label() is not None and r.features.get("verifier_features")]
    report: dict = {"requests": len(requests), "labelled": len(labelled), "written": None, "blended": 0}
    labels = [int(label) for r in labelled if (label := r.label()) is not None]  # every one of `labelled`
    if len(labelled) < args.min_labels or len(set(labels)) < 2:
        report["decision"] = (
            f"not refitted: {len(labelled)} labelled cheap answers (need {args.min_labels}, both good and not)"
        )
        return _print(args, report)
    blend = None
    if args.blend_shipped is not None:
        try:
            blend = _load_blend(args, policy, found.route_model)
        except (ExampleFileError, ModelFileError, OSError, ValueError) as exc:
            print(f"selfroute learn: {exc}", file=sys.stderr)
            return 2
        report["blended"] = len(blend.labels)
        report["blend_weighting"] = (
            f"{args.blend_weight:g} x the ledger labels"
            if args.blend_weight is not None
            else f"as {args.blend_prior:g} labels"
        )
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    edits: dict[str, dict] = {}  # routing section -> values to write
    models: list = []  # (save function, model, path) to write when the policy edit is good
    data = _labelled_answers(labelled, labels, _weights(labelled, policy.routing.learning))
    share, checked = args.escalation_share, None
    if args.thresholds == "scores":
        share, checked = _every_checked(requests, verifier, args.escalation_share)
    verifier_part = _refit_verifier(args, policy, verifier, data, blend, stamp, share, checked)
    report.update({k: v for k, v in verifier_part.items() if not k.startswith("_")})
    if "_write" in verifier_part:
        edits["verifier"], saved = verifier_part["_write"]
        if saved is not None:
            models.append(saved)
    report["classifier"] = _refit_classifier(args, policy, found, data, blend, stamp)
    if "_write" in report["classifier"]:
        edits["classifier"], saved = report["classifier"].pop("_write")
        models.append(saved)
    report["relative"] = _refit_relative(args, policy, verifier, requests, labelled, data, verifier_part, stamp)
    if "_write" in report["relative"]:
        edits["verifier.relative"] = report["relative"].pop("_write")
    backoff = _shadow_backoff(policy, verifier_part["_refit"], report["classifier"].pop("_refit", None))
    if backoff is not None:
        report["shadow_backoff"] = backoff
        if backoff["scale"] != backoff["scale_in_force"]:
            edits["learning.shadow_backoff"] = {"scale": backoff["scale"]}
    if not edits:
        return _print(args, report)
    if args.dry_run:
        report["decision"] += " (dry run: nothing written)"
        return _print(args, report)
    text = policy_file.read_text(encoding="utf-8")
    for section, values in edits.items():
        text, _ = set_values(text, values, section)
    try:
        parse_policy(text, str(policy_file))  # never write a policy that would not load
    except PolicyError as exc:
        print(f"selfroute learn: the edited policy would not load: {exc}", file=sys.stderr)
        return 1
    for save, model, target in models:  # the new files first: the old ones stay where they are
        save(model, target)
    write_atomic(policy_file, text)  # a reload reads the old policy or the new one, never half
    if "verifier" in edits and "model_path" in edits["verifier"]:
        report["written"] = str(policy_file.parent / edits["verifier"]["model_path"])
    elif "verifier" in edits:
        report["thresholds_written"] = str(policy_file)
    if "classifier" in edits:
        report["classifier"]["written"] = str(policy_file.parent / edits["classifier"]["model_path"])
    if "verifier.relative" in edits:
        report["relative"]["written"] = str(policy_file)
    if "learning.shadow_backoff" in edits:
        report["shadow_backoff"]["written"] = str(policy_file)
    return _print(args, report)


def _shadow_backoff(policy, verifier_refit, classifier_refit) -> dict | None:
    """With routing.learning.shadow_backoff: the shadow scale after this refit (gateway.routing.learning.loop.
    shadow_scale_after, which the simulation calls too): lower when the refit lost to the model in force, higher
    when it won (gateway.evaluation.refit.refit_won)."""
    from gateway.evaluation.refit import refit_won
    from gateway.routing.learning.loop import shadow_scale_after

    settings = policy.routing.learning.shadow_backoff
    if settings is None:
        return None
    won = refit_won(verifier_refit, classifier_refit)
    scale = shadow_scale_after(settings, won)
    return {
        "won": won,
        "scale_in_force": settings.scale,
        "scale": scale,
        "shadow_rate_now": policy.routing.learning.shadow_rate * scale,
        "decision": f"the refit {'won' if won else 'lost'}: shadows at {scale:g} x shadow_rate "
        f"(was {settings.scale:g})",
    }


def _every_checked(requests, verifier, share: float | None):
    """(share, refit.Checked) for --thresholds scores: every recorded checked cheap answer (its verifier features
    recorded), scored by the verifier in force; the share: the one asked, else the share of them escalated."""
    from gateway.evaluation.recorded import _numbers
    from gateway.evaluation.refit import Checked

    checked = [r for r in requests if r.features.get("verifier_features")]
    scores = verifier.scores([_numbers(r.features["verifier_features"]) for r in checked]) if checked else []
    decisions = [_checked_decision(r) for r in checked]
    if share is None:
        share = sum(bool(r.features.get("escalated")) for r in checked) / max(len(checked), 1)
    return share, Checked([float(x) for x in scores], [bool(r.features.get("refused")) for r in checked], decisions)


def _checked_decision(request):
    """A recorded checked answer's pre-route decision as the escalation rule reads it (its P(cheap) and features)."""
    from gateway.evaluation.recorded import _numbers
    from gateway.routing.decision import RouteDecision
    from policies.routes import Route

    features = request.features
    row = _numbers(features["features"]) if features.get("features") and features.get("rule") is None else {}
    return RouteDecision(Route.RAG, "", None, features.get("p_cheap"), row)


def _refit_relative(args, policy, verifier, requests, labelled, data, verifier_part, stamp) -> dict:
    """The relative rule's (pool, refusal_spend) re-chosen on the labels (gateway.evaluation.relative_refit.
    relative_out_of_fold) for the verifier and thresholds this run leaves in force, replayed over every recorded
    checked answer (with the long tokens its rule charged) in recorded order, one window per key; `_write` holds the
    policy values when the choice holds out of fold."""
    from gateway.evaluation.recorded import _numbers
    from gateway.evaluation.refit import with_verifier_thresholds
    from gateway.evaluation.relative_refit import CheckedStream, relative_out_of_fold

    settings = policy.routing.verifier
    if settings is None or settings.relative is None:
        return {"decision": "the policy has no routing.verifier.relative: nothing to re-choose"}
    if args.relative == "fixed":
        return {"decision": "--relative fixed: left as it is"}
    checked = [r for r in requests if r.features.get("verifier_features") and r.features.get("long_tokens") is not None]
    if not checked:
        return {"decision": "no recorded checked answer has the long tokens a relative rule charged: not re-chosen"}
    model, values = verifier, {}
    if "_write" in verifier_part:  # re-chosen for what this run writes: its thresholds, and its model if new
        values, saved = verifier_part["_write"]
        model = saved[1] if saved is not None else verifier
        policy = with_verifier_thresholds(
            policy, values["threshold"], values.get("refusal_threshold", settings.refusal_threshold)
        )
    scores = model.scores([_numbers(r.features["verifier_features"]) for r in checked])
    tokens = [float(r.features["long_tokens"]) for r in checked]
    stream = CheckedStream(
        [float(x) for x in scores],
        [bool(r.features.get("refused")) for r in checked],
        tokens,
        [_checked_decision(r) for r in checked],
        [r.key_id for r in checked],
    )
    at = {r.id: i for i, r in enumerate(checked)}
    kept = [j for j, r in enumerate(labelled) if r.id in at]
    budget = args.max_token_share
    if budget is None:
        budget = sum(t for t, r in zip(tokens, checked) if r.features.get("escalated")) / (sum(tokens) or 1.0)
    found = relative_out_of_fold(
        policy,
        stream,
        [at[labelled[j].id] for j in kept],
        [data.labels[j] for j in kept],
        [data.weights[j] for j in kept],
        [str(data.groups[j]) for j in kept],
        budget,
        folds=args.folds,
        seed=args.seed,
    )
    chosen, in_force = found.refit.chosen, found.refit.in_force
    out: dict = {
        "checked": len(checked),
        "labelled": len(kept),
        "max_token_share": budget,
        "pool_in_force": in_force.pool,
        "refusal_spend_in_force": in_force.refusal_spend,
        "token_share_in_force": in_force.token_share,
        "quality_in_force": found.quality_in_force,
        "pool": chosen.pool,
        "refusal_spend": chosen.refusal_spend,
        "token_share": chosen.token_share,
        "quality_on_labels": chosen.quality,
        "quality_out_of_fold": found.quality_out_of_fold,
        "folds": found.folds,
        "decision": found.decision,
    }
    if found.write:
        out["_write"] = {
            "pool": chosen.pool,
            "refusal_spend": chosen.refusal_spend,
            "source": f"learn {stamp}: {len(kept)} ledger labels, out of fold {found.quality_out_of_fold:.1f} vs "
            f"{found.quality_in_force:.1f} in force, {chosen.token_share:.1%} of the long tokens",
        }
    return out


def _refit_verifier(args, policy, verifier, data, blend, stamp, share=None, checked=None) -> dict:
    """The verifier's comparison (gateway.evaluation.refit.refit_verifier); `_write` holds the policy values (and the
    model file) when it changes anything."""
    from classifier.answer_features import ANSWER_FEATURE_NAMES
    from gateway.evaluation.refit import refit_verifier
    from gateway.routing.model_files import save_verifier

    names = [n for n in verifier.feature_names if n in ANSWER_FEATURE_NAMES] or list(ANSWER_FEATURE_NAMES)
    blended = f", blended with {len(blend.labels)} lines of {args.blend_shipped.name}" if blend else ""
    refit = refit_verifier(
        data,
        verifier.scores(data.answer_rows),
        policy,
        feature_names=names,
        estimator=args.estimator,
        folds=args.folds,
        seed=args.seed,
        share=share,
        checked=checked,
        blend=blend,
        blend_weight=args.blend_weight or 1.0,
        blend_prior=None if args.blend_weight is not None else args.blend_prior,
        escalation_weight=args.escalation_label_weight,
        card={"trained_on": f"{len(data.labels)} ledger labels since {args.since}{blended}"},
        min_model_labels=args.min_model_labels,
    )
    out: dict = {
        "_refit": refit,
        "escalated_share": refit.share,
        "quality_recorded": refit.quality_recorded,
        "quality_in_force": refit.quality_in_force,
        "quality_refit": refit.quality_refit,
        "gain_points": refit.gain_points,
        "decision": refit.decision,
    }
    chosen = refit.thresholds
    if refit.action == "keep" or chosen is None:
        return out
    out.update(new_threshold=chosen.threshold, new_refusal_threshold=chosen.refusal_threshold)
    values: dict = {"threshold": float(chosen.threshold)}
    if chosen.refusal_threshold is not None:  # None: the policy's refusal rule is off, and stays off
        values["refusal_threshold"] = float(chosen.refusal_threshold)
    what = f"{len(data.labels)} ledger labels{blended}, escalating {refit.share:.1%}"
    if refit.action == "model":
        target = Path(args.policy).parent / f"verifier-learned-{stamp}.skops"
        out["model_path"] = values["model_path"] = target.name
        values["threshold_source"] = (
            f"learn {stamp}: {what}, out-of-fold {refit.quality_refit:.1f} vs {refit.quality_in_force:.1f}"
        )
        out["_write"] = (values, (save_verifier, refit.model, target))
    else:
        values["threshold_source"] = (
            f"learn {stamp}: {what}, re-chosen for the model in force: {chosen.quality:.1f} vs "
            f"{refit.quality_recorded:.1f} as recorded"
        )
        out["_write"] = (values, None)
    return out


def _refit_classifier(args, policy, found, data, blend, stamp) -> dict:
    """The pre-route classifier's refit (gateway.evaluation.refit.refit_classifier), when the policy has one."""
    from classifier.features import FEATURE_NAMES
    from classifier.model import RouteModel
    from gateway.evaluation.recorded import _numbers
    from gateway.evaluation.refit import refit_classifier
    from gateway.routing.model_files import save_model

    model, settings = found.route_model, policy.routing.classifier
    if model is None or settings is None:
        return {"decision": "the policy routes without a pre-route classifier: not refitted"}
    rows = [row for row in data.route_rows if row]
    in_force = iter(model.cheap_probabilities(rows) if rows else [])
    p = [next(in_force) if row else None for row in data.route_rows]
    decided = [
        (_numbers(r.features["features"]), float(r.features["p_cheap"]))
        for r in found.requests
        if r.features.get("p_cheap") is not None and r.features.get("features")
    ]
    refit = refit_classifier(
        data,
        p,
        float(settings.threshold),
        decided,
        estimator=args.estimator,
        folds=args.folds,
        seed=args.seed,
        min_labels=args.min_route_labels,
        blend=blend,
        blend_weight=args.blend_weight or 1.0,
        blend_prior=None if args.blend_weight is not None else args.blend_prior,
    )
    out: dict = {"_refit": refit, "labelled": refit.labelled, "decision": refit.decision}
    if refit.quality_in_force is None or refit.quality_refit is None:
        return out
    out.update(
        long_share=refit.long_share,
        quality_in_force=refit.quality_in_force,
        quality_refit=refit.quality_refit,
        gain_points=refit.quality_refit - refit.quality_in_force,
    )
    if refit.action != "model" or refit.threshold is None:
        return out
    blended = f", blended with {len(blend.labels)} lines of {args.blend_shipped.name}" if blend else ""
    target = Path(args.policy).parent / f"classifier-learned-{stamp}.skops"
    card = {
        "feature_names": FEATURE_NAMES,
        "estimator": args.estimator,
        "trained_on": f"{refit.labelled} ledger labels since {args.since}{blended}",
        "learned_from": f"selfroute learn {stamp}: out-of-fold {refit.quality_refit:.2f} vs "
        f"{refit.quality_in_force:.2f} points in force",
        "threshold": refit.threshold,
    }
    out.update(new_threshold=refit.threshold, model_path=target.name)
    values = {
        "model_path": target.name,
        "threshold": refit.threshold,
        "threshold_source": f"learn {stamp}: keeps the recorded long share {refit.long_before:.1%}",
    }
    out["_write"] = (values, (save_model, RouteModel(refit.pipeline, card), target))
    return out


def _print(args, report: dict) -> int:
    if args.json:
        print(json.dumps(report, indent=2, default=float))
        return 0
    print(f"{report['labelled']} labelled cheap answers in {report['requests']} recorded requests")
    if "quality_in_force" in report:
        print(
            f"out-of-fold replay escalating {report['escalated_share']:.1%} of them: refit "
            f"{report['quality_refit']:.2f} vs in force {report['quality_in_force']:.2f} points (as recorded "
            f"{report['quality_recorded']:.2f}), each at its best thresholds"
        )
    print(report["decision"])
    if report["written"]:
        print(f"wrote {report['written']} and pointed the policy's routing.verifier at it (the old model is kept)")
    if report.get("thresholds_written"):
        print(
            f"wrote the verifier's thresholds {report['new_threshold']:.4f} (refusals: "
            f"{report['new_refusal_threshold']}) to {report['thresholds_written']}"
        )
    classifier = report.get("classifier")
    if classifier:
        if "quality_in_force" in classifier:
            print(
                f"pre-route classifier, {classifier['labelled']} labelled requests, out of fold at long share "
                f"{classifier['long_share']:.1%}: refit {classifier['quality_refit']:.2f} vs in force "
                f"{classifier['quality_in_force']:.2f} points"
            )
        print(f"classifier: {classifier['decision']}")
        if classifier.get("written"):
            print(f"wrote {classifier['written']} and pointed routing.classifier at it (the old model is kept)")
    relative = report.get("relative")
    if relative:
        if "quality_out_of_fold" in relative:
            print(
                f"relative rule, {relative['labelled']} labelled of {relative['checked']} checked answers replayed "
                f"within {relative['max_token_share']:.1%} of their long tokens: pool {relative['pool_in_force']} / "
                f"refusal_spend {relative['refusal_spend_in_force']} in force ({relative['quality_in_force']:.2f} "
                f"points, {relative['token_share_in_force']:.1%} of the tokens) -> {relative['pool']} / "
                f"{relative['refusal_spend']} ({relative['quality_on_labels']:.2f} on the labels, "
                f"{relative['quality_out_of_fold']:.2f} out of fold, {relative['token_share']:.1%} of the tokens)"
            )
        print(f"relative rule: {relative['decision']}")
        if relative.get("written"):
            print(f"wrote routing.verifier.relative's pool and refusal_spend to {relative['written']}")
    shadow = report.get("shadow_backoff")
    if shadow:
        print(f"shadow rate: {shadow['decision']}")
        if shadow.get("written"):
            print(f"wrote routing.learning.shadow_backoff's scale to {shadow['written']}")
    if report["blended"]:
        print(f"blended {report['blended']} shipped lines into every refit, weighing {report['blend_weighting']}")
    return 0
