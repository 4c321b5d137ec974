"""`selfroute eval replay --simulate-learning` (a helper of gateway.commands.eval, not a subcommand): the learning
starting from the policy's shipped classifier and verifier. The flags live on `eval replay` (gateway.commands.eval)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from gateway.commands._common import whole_number
from gateway.evaluation.refit import MIN_MODEL_LABELS

if TYPE_CHECKING:
    from classifier.verifier import VerifierModel

SHIPPED, HELD_OUT = "shipped", "held-out"  # --start-from
HELD_OUT_PROTOCOLS = ("corpus", "model")


def add_arguments(replay: argparse.ArgumentParser) -> None:
    replay.add_argument(
        "--simulate-learning",
        action="store_true",
        help="simulate the learning loop (labels from escalations and shadows, refits) instead of "
        "the strategy table; starts from the policy's shipped classifier and verifier",
    )
    replay.add_argument("--shadow-rate", type=float, default=0.05, help="share of accepted cheap answers shadowed")
    replay.add_argument("--judge-noise", type=float, default=0.0, help="probability a judge verdict is flipped")
    replay.add_argument("--refit-every", type=int, default=100, help="refit the verifier every N questions")
    replay.add_argument(
        "--sim-seeds",
        type=whole_number("--sim-seeds"),
        default=1,
        help="run each stream with this many order seeds (--seed, --seed + 1, ...; features computed once) and report "
        "the mean and spread of the trailing figures",
    )
    replay.add_argument("--sim-window", type=int, default=250, help="questions per window of the learning curve")
    replay.add_argument(
        "--sim-after", type=int, default=1000, help="the trailing figures count the questions after this many"
    )
    replay.add_argument(
        "--sim-max-token-share",
        type=float,
        default=None,
        help="the learning router escalates as much as keeps its tokens (learning legs included) at this share of "
        "always-long's, instead of holding the frozen router's spend",
    )
    replay.add_argument(
        "--sim-share",
        choices=["frozen-spend", "in-force"],
        default="frozen-spend",
        help="the escalation share each refit's thresholds hold: the frozen router's spend (learning legs included; "
        "default) or learn's default, the share the policy in force escalated",
    )
    replay.add_argument(
        "--sim-control",
        action="store_true",
        help="report beside the learning router a budget control: the shipped models under the same share rule "
        "(--sim-max-token-share or the frozen spend) with no labels, its threshold set from the scores alone",
    )
    replay.add_argument(
        "--sim-thresholds",
        choices=["labels", "scores"],
        default="labels",
        help="when a refit keeps the verifier in force, its thresholds for the share: chosen on the labels (learn's "
        "way, default) or set from the scores of every checked answer seen, the refusal rule in force kept",
    )
    replay.add_argument(
        "--sim-relative",
        choices=["fixed", "labels", "out-of-fold"],
        default="fixed",
        help="with a relative verifier threshold (routing.verifier.relative): each refit leaves its pool and "
        "refusal_spend as they are (fixed, default) or re-chooses them on the labels within the share's long tokens "
        "(labels: gateway.evaluation.relative_refit; the budget control then re-chooses them for its budget alone; "
        "out-of-fold: the choice put in force only when it holds out of fold, as `selfroute learn` does)",
    )
    replay.add_argument(
        "--sim-min-model-labels",
        type=int,
        default=MIN_MODEL_LABELS,
        help="as `learn --min-model-labels`: with fewer labels a refit never replaces the verifier in force "
        f"(default {MIN_MODEL_LABELS}; 0: the out-of-fold win alone decides)",
    )
    replay.add_argument(
        "--shadow-reference-tokens",
        type=whole_number("--shadow-reference-tokens"),
        default=None,
        help="as routing.learning.shadow_reference_tokens: a context longer than this is shadowed with probability "
        "shadow-rate x this / its tokens (default: the policy's, else every context at --shadow-rate)",
    )
    replay.add_argument(
        "--sim-shadow-backoff",
        type=float,
        default=None,
        metavar="FACTOR",
        help="as routing.learning.shadow_backoff.factor: each refit that loses to the model in force multiplies the "
        "shadow rate by FACTOR, one that wins divides it (up to --shadow-rate), as `selfroute learn` writes it "
        "(default: the policy's shadow_backoff, else the rate never moves)",
    )
    replay.add_argument(
        "--sim-shadow-min-scale",
        type=float,
        default=None,
        help="as routing.learning.shadow_backoff.min_scale: the least share of --shadow-rate it falls to (default: the "
        "policy's, else 0.1)",
    )
    replay.add_argument(
        "--start-from",
        choices=[SHIPPED, HELD_OUT],
        default=SHIPPED,
        help="the models the loop (and the frozen router and the budget control) start from: the policy's shipped "
        "classifier and verifier (default; trained on the shipped paired data, so on these answers in-sample), or "
        "held-out: out-of-fold under --protocol corpus|model, each answer's P(cheap) and P(good) from models fitted "
        "without its corpus (corpus) or its model family and its documents' fold (model), the case the loop exists "
        "for; the verifier over the shipped verifier's features with --verifier-estimator (default: its card's)",
    )
    replay.add_argument(
        "--sim-split",
        default=None,
        metavar="FIELD",
        help="simulate each value of this line field separately (LaRA: model), features computed once",
    )
    replay.add_argument(
        "--sim-blend-prior",
        type=float,
        default=None,
        metavar="N",
        help="as `learn --blend-shipped ... --blend-prior N`: every refit also trains on the lines of the other corpora "
        "(none shares a document with the stream), together weighing as N labelled answers",
    )
    replay.add_argument(
        "--sim-escalation-weight",
        type=float,
        default=1.0,
        help="as `learn --escalation-label-weight`: escalation labels' weight in the refits' fit (default 1)",
    )
    replay.add_argument(
        "--learn-estimator",
        choices=["logistic", "boosting"],
        default="logistic",
        help="the refitted models' estimator, as `selfroute learn --estimator` (logistic: steadier on a few hundred "
        "labels)",
    )


def run(args: argparse.Namespace, policy, policy_file, examples, prices, splits=None) -> int:
    from gateway.evaluation.examples import CorpusInputs, corpus_windows
    from gateway.evaluation.learning_sim import SimQuestion, format_simulation, seed_summary, simulate, targets
    from gateway.evaluation.report import build_items
    from gateway.evaluation.verification import answer_rows, cheap_answers, replay_scores
    from gateway.routing.model_files import load_route_model, load_verifier_model
    from gateway.settings import resolve_data_dir
    from pipelines.unanswerable import UnanswerableDetector

    if not (0 < args.shadow_rate <= 1 and 0 <= args.judge_noise <= 1 and args.refit_every > 0):
        print(
            "selfroute eval replay: --shadow-rate in (0, 1], --judge-noise in [0, 1], --refit-every > 0",
            file=sys.stderr,
        )
        return 2
    if args.start_from == HELD_OUT and (args.protocol not in HELD_OUT_PROTOCOLS or splits is None):
        print(
            "selfroute eval replay: --start-from held-out needs --protocol corpus or --protocol model",
            file=sys.stderr,
        )
        return 2
    try:
        backoff = _shadow_backoff(args, policy)
    except ValueError as exc:
        print(f"selfroute eval replay: {exc}", file=sys.stderr)
        return 2
    model, verifier = load_route_model(policy, policy_file), load_verifier_model(policy, policy_file)
    if verifier is None:
        print("selfroute eval replay: --simulate-learning needs a policy with routing.verifier", file=sys.stderr)
        return 2
    if policy.routing.verifier.threshold is None:
        verifier_settings = policy.routing.verifier.model_copy(update={"threshold": verifier.threshold})
        policy = policy.model_copy(
            update={"routing": policy.routing.model_copy(update={"verifier": verifier_settings})}
        )
    data_dir = resolve_data_dir(args.data_dir)
    # --data/--docs/--window-tokens may repeat (one corpus each): one builder per corpus
    builder = CorpusInputs(
        policy, data_dir / "lancedb", corpus_windows(examples, args.window_tokens), cache_dir=data_dir / "cache"
    )
    inputs = builder.all_inputs(examples, progress=not args.json)
    rows = [i.features for i in inputs]
    start_verifier: VerifierModel | None = verifier  # None: the recorded (held-out) scores stand
    if args.start_from == HELD_OUT:
        # the protocol's out-of-fold models, as `eval replay --protocol` scores them: no answer is scored by a model
        # that saw its corpus (or its family and document); the simulation re-scores only once a refit replaces it
        answers: list[dict] = []
        probabilities, held_out_scores, _ = replay_scores(
            policy,
            policy_file,
            examples,
            inputs,
            builder,
            protocol=args.protocol,
            estimator=args.estimator,
            folds=args.folds,
            seed=args.seed,
            splits=splits,
            rows_out=answers,
            feature_names=verifier.feature_names,
            verifier_estimator=args.verifier_estimator or verifier.card.get("estimator") or "logistic",
            progress=not args.json,
        )
        assert held_out_scores is not None  # the policy has routing.verifier (checked above)
        scores = held_out_scores
        start_verifier = None
    else:
        probabilities = model.cheap_probabilities(rows) if model is not None else [0.5] * len(rows)
        answers = answer_rows(cheap_answers(builder, examples, progress=not args.json), probabilities)
        scores = verifier.scores(answers)
    items = build_items(examples, inputs, probabilities, UnanswerableDetector(policy.rag.unanswerable_patterns), scores)
    parts: dict[str, list[SimQuestion]] = {}
    corpora: dict[str, set[str]] = {}  # each part's corpora, for the blend (the other corpora's lines)
    for example, item, row in zip(examples, items, answers):
        key = str(example.record.get(args.sim_split)) if args.sim_split else ", ".join(str(d) for d in args.data)
        parts.setdefault(key, []).append(SimQuestion(item, row))
        corpora.setdefault(key, set()).add(example.corpus)
    out = []
    seeds = range(args.seed, args.seed + args.sim_seeds)
    for name, questions in sorted(parts.items()):
        blend = None
        if args.sim_blend_prior is not None:
            blend = _other_corpora(examples, items, answers, corpora[name])
            if not blend.labels:
                print(f"selfroute eval replay: --sim-blend-prior: {name} has no other corpus to blend", file=sys.stderr)
                return 2
        for seed in seeds:
            result = simulate(
                questions,
                policy,
                prices,
                shadow_rate=args.shadow_rate,
                judge_noise=args.judge_noise,
                refit_every=args.refit_every,
                seed=seed,
                window=args.sim_window,
                after=args.sim_after,
                max_token_share=args.sim_max_token_share,
                estimator=args.learn_estimator,
                feature_names=verifier.feature_names,
                share_rule=args.sim_share,
                shadow_reference_tokens=(
                    args.shadow_reference_tokens
                    if args.shadow_reference_tokens is not None
                    else policy.routing.learning.shadow_reference_tokens
                ),
                control=args.sim_control,
                thresholds_from=args.sim_thresholds,
                min_model_labels=args.sim_min_model_labels,
                relative_from=args.sim_relative,
                verifier=start_verifier,
                route_model=model,
                blend=blend,
                blend_prior=args.sim_blend_prior,
                escalation_weight=args.sim_escalation_weight,
                shadow_backoff=backoff,
            )
            met = targets(result)
            out.append({"part": name, **result.to_dict(), "targets": met, "questions": len(questions)})
            if not args.json:
                print(format_simulation(result, f"{name} ({len(questions)} questions)"))
                print(
                    "targets: "
                    + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in met.items())
                    + "\n"
                )
    summary = seed_summary(out)
    if not args.json and args.sim_seeds > 1:
        print(f"over order seeds {seeds.start}..{seeds.stop - 1}: mean [min, max]")
        for name, figures in summary.items():
            print(
                f"  {name}: "
                + ", ".join(f"{k} {v['mean']:.3f} [{v['min']:.3f}, {v['max']:.3f}]" for k, v in figures.items())
            )
    if args.json:
        print(
            json.dumps(
                {
                    "data": ", ".join(str(d) for d in args.data),
                    "start_from": args.start_from,
                    "protocol": args.protocol if args.start_from == HELD_OUT else None,
                    "split": args.sim_split,
                    "runs": out,
                    "seeds": list(seeds),
                    "summary": summary,
                },
                indent=2,
                default=float,
            )
        )
    return 0


def _shadow_backoff(args: argparse.Namespace, policy):
    """The simulation's shadow_backoff: the policy's, with --sim-shadow-backoff / --sim-shadow-min-scale over it
    (either given without one in the policy: a new one, starting at scale 1); None: the rate never moves."""
    from pydantic import ValidationError

    from policies.schema import ShadowBackoff

    found = policy.routing.learning.shadow_backoff
    updates = {
        k: v
        for k, v in (("factor", args.sim_shadow_backoff), ("min_scale", args.sim_shadow_min_scale))
        if v is not None
    }
    if found is None and not updates:
        return None
    try:
        return ShadowBackoff.model_validate({**(found.model_dump() if found else {}), **updates})
    except ValidationError as exc:
        raise ValueError(
            "--sim-shadow-backoff in (0, 1), --sim-shadow-min-scale in [0, 1]: "
            + "; ".join(e["msg"] for e in exc.errors())
        ) from exc


def _other_corpora(examples, items, answers, own: set[str]):
    """The shipped lines a part's refits blend: every line of the other corpora, labelled and weighted as `learn`
    labels and weights its --blend-shipped lines."""
    from gateway.evaluation.refit import Blend

    keep = [k for k, e in enumerate(examples) if e.corpus not in own]
    return Blend.from_scores(
        [dict(items[k].features) for k in keep],
        [answers[k] for k in keep],
        [items[k].rag_score for k in keep],
        [items[k].lc_score for k in keep],
        [items[k].group for k in keep],
    )
