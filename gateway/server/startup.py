"""Start-up of what routed requests and collections need, owned by the gateway holder (gateway.server.state), not by
routing: the embedding model (one onnxruntime session, or torch's two copies), the document store, the route model and
the verifier, and what the policy's chat models need in-process (the local model, litellm), nothing more. They load in a worker thread after the server listens (liveness answers at once); readiness, and the 503
of a request that needs them, say whether they are in, still loading, or failed to load.

Ready means: the store is open, the route model and verifier are loaded, litellm is imported for a model it
translates, and the in-process models' files are checked (the embedding model's files and its ONNX export, made here
once per model version; the local model's GGUF file) but not loaded: the embedding session (~130 MB fp32) and the local
model's weights and context (~140 MB) load at the first request that uses them, once, the requests that arrive
meanwhile waiting for that one load (BENCHMARKS.md §2, round seven: idle memory saved, the first request's added
latency). Settings.preload (`serve --preload`) loads them before readiness instead."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from classifier.model import ModelFileError
from gateway.errors import GatewayError
from gateway.routing.decision import Router
from gateway.routing.escalation import CheapAnswerCheck
from gateway.routing.model_files import load_route_model, load_verifier_model
from gateway.routing.service import RoutingService
from gateway.settings import Settings
from gateway.upstreams.base import Upstream
from policies.loader import PolicyError, parse_policy
from policies.schema import Policy

if TYPE_CHECKING:  # both load pyarrow/lancedb/torch: imported by build(), not with the app
    from gateway.routing.score_window import History
    from pipelines.embedding import Embedder
    from pipelines.store import DocumentStore

logger = logging.getLogger(__name__)

# why the gateway cannot route yet: the readiness probe's reason and the 503 answers' error code
NOT_READY = "not_ready"  # still loading the embedding model, store and classifier
BUILD_FAILED = "build_failed"  # loading them failed; the process stays up to say so


class ReloadError(Exception):
    """The policy reload failed; the models in force stay."""


class Startup:
    def __init__(
        self,
        settings: Settings,
        policy: Policy,
        policy_path: Path | None,
        upstream: Upstream,
        routing: RoutingService,
        *,
        embedder: Embedder | None = None,
    ):
        self.settings, self.policy, self.policy_path = settings, policy, policy_path
        self.upstream, self.routing = upstream, routing
        self._embedder = embedder
        self.store: DocumentStore | None = None
        self.ready = False
        self.error: str | None = None  # why build() failed: for the log and the admin's readiness view only
        self.missing_credentials: list[dict] = []  # hosted models whose key variable is unset (readiness says so)
        self.policy_sha256: str | None = None  # of the policy file's text the models in force came from
        self._reload_lock = threading.Lock()  # the admin call and the reload watcher never load at once

    def build(self) -> None:
        """Load the embedding model, open the store, load the route model and verifier, and hand routing its
        planner (slow: run in a worker thread)."""
        from gateway.routing.planner import RoutePlanner
        from gateway.upstreams.credentials import missing_credentials
        from pipelines.embedding import Embedder
        from pipelines.store import DocumentStore

        policy = self.policy
        rag = policy.rag
        if self.policy_path is not None:
            try:
                self.policy_sha256 = _sha256(self.policy_path.read_bytes())
            except OSError:  # the file went away after the app read it: the models still come from what it read
                self.policy_sha256 = None
        embedder = self._embedder or Embedder(
            rag.embedding_model,
            batch_size=rag.embedding_batch_size,
            backend=rag.embedding_backend,  # ONNX exports: one shared cache (pipelines.embedding)
        )
        # one Embedder serves retrieval, long-context scoring and /v1/embeddings: its files (and export) checked now,
        # the session loaded by the first request that embeds (or now, preloading); stand-ins some tests pass have
        # neither
        preload = self.settings.preload
        getattr(embedder, "load" if preload else "prepare", lambda: None)()
        store = DocumentStore(self.settings.store_uri, embedder, rag)
        router = Router(policy, load_route_model(policy, self.policy_path, lean=True))
        check = CheapAnswerCheck(
            policy, load_verifier_model(policy, self.policy_path, lean=True), self.answer_history(policy)
        )
        self.missing_credentials = missing_credentials(policy)  # logged as warnings
        # what the policy's models need in-process, and only that: the local model's file checked (its weights load at
        # its first request, or now, preloading), litellm imported for a provider it translates; nothing for an
        # OpenAI-compatible upstream
        load = getattr(self.upstream, "load" if preload else "prepare", None) or getattr(self.upstream, "load", None)
        judge = [policy.routing.learning.judge_model] if policy.routing.learning.judge else []
        for config in (policy.cheap, policy.long, *policy.long_alternates, *judge):
            if load is not None and config is not None:
                load(config)
        self.store = store
        self.routing.attach(RoutePlanner(policy, store, router), check)
        self.ready = True

    def answer_history(self, policy: Policy) -> History:
        """A key's recorded answers under this policy from the ledger, for a relative verifier threshold's window
        (gateway.routing.score_window): a restart, a reload or a second worker continues the key's window. A ledger
        that cannot be read starts the window empty (the fixed thresholds decide until it warms up)."""
        from gateway.ledger.labels import recent_answers
        from gateway.routing.score_window import Seen

        location = self.settings.ledger_location

        def history(key: str | None, limit: int) -> list[Seen]:
            try:
                return [Seen(*row) for row in recent_answers(location, key, policy.name, limit)]
            except Exception:  # the window is an optimisation of the threshold, never a reason to fail a request
                logger.warning(
                    "reading the ledger's recent answers of a key failed; its window starts empty", exc_info=True
                )
                return []

        return history

    def build_in_background(self) -> None:
        """build(), for the start-up thread: a failure keeps the process up to say so (503 build_failed)."""
        started = time.perf_counter()
        try:
            self.build()
        except Exception as exc:  # the text for the log and the admin
            self.error = f"{type(exc).__name__}: {exc}"
            logger.exception("loading the embedding model, store or routing classifier failed")
            return
        logger.info(
            "ready: embedding model, document store and routing classifier loaded in %.1fs",
            time.perf_counter() - started,
        )

    def reload_models(self) -> Policy:
        """Put the policy file's routing.classifier and routing.verifier (model files and thresholds, as `selfroute
        learn` and `calibrate` write them) and routing.learning.shadow_backoff (the shadow scale learn writes) in force
        without a restart; everything else in the file waits for one.
        Blocking (reads and checks the model files): from a worker thread. Raises ReloadError, keeping the models in
        force, when the file or a model does not load or a model was turned on or off."""
        with self._reload_lock:
            return self._reload_models()

    def _reload_models(self) -> Policy:
        if self.policy_path is None:
            raise ReloadError("the gateway was started without a policy file: nothing to reload")
        if not self.ready:
            raise ReloadError("the gateway is still loading its models")
        try:
            data = self.policy_path.read_bytes()  # learn and calibrate replace it whole (gateway.files.write_atomic)
            found = parse_policy(data.decode("utf-8"), str(self.policy_path))
        except (OSError, UnicodeDecodeError) as exc:
            raise ReloadError(f"{type(exc).__name__}: {exc}") from exc
        except PolicyError as exc:
            raise ReloadError(str(exc)) from exc
        current = self.policy
        for name in ("classifier", "verifier"):
            if (getattr(current.routing, name) is None) != (getattr(found.routing, name) is None):
                raise ReloadError(f"routing.{name} was turned on or off: that needs a restart")
        # the models, their thresholds, and the shadow scale `selfroute learn` writes (routing.learning.shadow_backoff)
        learning = current.routing.learning.model_copy(update={"shadow_backoff": found.routing.learning.shadow_backoff})
        routing = current.routing.model_copy(
            update={"classifier": found.routing.classifier, "verifier": found.routing.verifier, "learning": learning}
        )
        policy = current.model_copy(update={"routing": routing})
        try:
            router = Router(policy, load_route_model(policy, self.policy_path, lean=True))
            check = CheapAnswerCheck(
                policy,
                load_verifier_model(policy, self.policy_path, lean=True),
                self.answer_history(policy),
                self.routing.check.windows,  # the keys' windows go on
            )
        except (ModelFileError, OSError, ValueError) as exc:
            raise ReloadError(f"{type(exc).__name__}: {exc}") from exc
        self.routing.use_models(policy, router, check)
        self.policy = policy
        self.policy_sha256 = _sha256(data)
        return policy

    def models_in_force(self) -> dict[str, Any]:
        """What this process routes with now: the policy file's sha256 and, for the classifier and the verifier, the
        model path, its file's sha256 and the thresholds (None for a model the policy does not use)."""
        planner, check = self.routing.planner, self.routing.check
        routing = self.policy.routing
        classifier: dict[str, Any] | None = None
        verifier: dict[str, Any] | None = None
        if routing.classifier is not None:
            model = planner.router.model if planner is not None else None
            classifier = {
                "model_path": routing.classifier.model_path,
                "sha256": model.sha256 if model is not None else None,
                "threshold": routing.classifier.threshold,
            }
        if routing.verifier is not None:
            loaded = check.verifier
            verifier = {
                "model_path": routing.verifier.model_path,
                "sha256": loaded.sha256 if loaded is not None else None,
                "threshold": check.threshold,
                "refusal_threshold": check.refusal_threshold,
            }
        return {"policy_sha256": self.policy_sha256, "classifier": classifier, "verifier": verifier}

    @property
    def not_ready_reason(self) -> str | None:
        """NOT_READY, BUILD_FAILED, or None once everything is loaded."""
        if self.error is not None:
            return BUILD_FAILED
        return None if self.ready else NOT_READY

    def not_ready(self) -> GatewayError:
        """The 503 for a request that needs what build() loads. A failure's text names files on the server: it
        stays in the log (and the admin's readiness view), never in an answer."""
        if self.not_ready_reason == BUILD_FAILED:
            return GatewayError(503, "the gateway could not load its models; its log says why", code=BUILD_FAILED)
        return GatewayError(503, "the gateway is still starting", code=NOT_READY)

    def check_ready(self) -> None:
        if not self.ready:
            raise self.not_ready()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
