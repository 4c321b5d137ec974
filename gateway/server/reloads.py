"""The policy reload across every worker and replica on one ledger database.

POST /v1/admin/reload loads the policy file's models in the process that took the call (gateway.server.startup) and,
when they load, adds a reload generation to the ledger (gateway.ledger.reloads). Every serving process runs one
watcher thread that reads the newest generation every CHECK_INTERVAL_S seconds, never on the request path, and,
when it is newer than the one it acted on, loads the models from its own policy file: a model that does not load
there keeps that process's models in force and is recorded as its last reload error. Each process writes what it has
in force (model files' sha256, thresholds, the generation, the last error) to the ledger when it changes and every
HEARTBEAT_S seconds, so any process answers for all of them (GET /v1/admin/reload), and its own in readiness and
/metrics.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from gateway.ledger.errors import LedgerError
from gateway.ledger.reloads import ReloadLog
from gateway.server.metrics import GatewayMetrics
from gateway.server.startup import ReloadError, Startup
from policies.schema import Policy

logger = logging.getLogger(__name__)

CHECK_INTERVAL_S = 2.0  # how soon a reload reaches every process (as soon as a revoked key does)
HEARTBEAT_S = 30.0  # a process rewrites its row at least this often; one silent for 3 heartbeats is `stale`
STALE_AFTER_S = 3 * HEARTBEAT_S


class PolicyReloads:
    """This process's side of the fleet's reload: the watcher thread, and the state it publishes."""

    def __init__(
        self,
        startup: Startup,
        log: ReloadLog,
        metrics: GatewayMetrics,
        on_policy: Callable[[Policy], None],
        *,
        interval: float = CHECK_INTERVAL_S,
        heartbeat: float = HEARTBEAT_S,
    ):
        self.startup, self.log, self.metrics, self.on_policy = startup, log, metrics, on_policy
        self.interval, self.heartbeat = interval, heartbeat
        self.host, self.pid, self.started_at = socket.gethostname(), os.getpid(), time.time()
        self.id = f"{self.host}:{self.pid}:{int(self.started_at * 1000)}"
        self.generation: int | None = None  # the newest generation this process acted on (None: not read yet)
        self.loaded_generation: int | None = None  # the generation the models in force came with
        self.last_reload_at: float | None = None
        self.last_error: dict[str, Any] | None = None  # {generation, at, error} of the last reload that failed
        self._lock = threading.Lock()  # one reload at a time: the admin call's or the watcher's
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Before start-up loads the models: the generation now is the one the policy file being loaded answers
        (a reload added after this read is seen by the first check)."""
        try:
            self.generation = self.loaded_generation = self.log.latest()
        except (LedgerError, OSError):  # unreachable now: the first check that reaches it reloads to be sure
            logger.warning("the ledger is unreachable: the policy reload generation will be read later")
        self._thread = threading.Thread(target=self._watch, name="selfroute-policy-reloads", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.log.forget(self.id)
        except (LedgerError, OSError):
            pass  # the row goes stale and is forgotten later
        self.log.close()

    # -- the watcher ------------------------------------------------------------------------------
    def _watch(self) -> None:
        next_heartbeat = 0.0  # the first check once start-up is done writes this process's row
        while not self._stop.wait(self.interval):
            if not self.startup.ready:
                continue
            try:
                latest = self.log.latest()
                if self.generation is None or latest > self.generation:
                    self.follow(latest)
                    next_heartbeat = time.monotonic() + self.heartbeat
                elif time.monotonic() >= next_heartbeat:
                    next_heartbeat = time.monotonic() + self.heartbeat
                    with self._lock:
                        self._publish()
            except (LedgerError, OSError) as exc:
                logger.debug("policy reload check: the ledger is unreachable: %s", exc)
            except Exception:  # never let the watcher die: the process would silently stop following reloads
                logger.exception("policy reload check failed")

    def follow(self, generation: int) -> None:
        """Load the models of `generation` (another process's reload) from this process's policy file."""
        with self._lock:
            if self.generation is not None and generation <= self.generation:
                return
            self.generation = generation  # acted on, whether its models load here or not (no retry every check)
            if generation == 0:  # no reload ever (the ledger was unreachable at start): the file loaded is current
                self.loaded_generation = 0
            else:
                try:
                    self._reload(generation)
                except ReloadError:
                    pass  # logged, and published as this process's last error
            self._publish()

    def reload_here(self) -> tuple[Policy, int | None]:
        """The admin call: load the policy file's models in this process (ReloadError: the models in force stay);
        then a new generation for every other process. Returns the policy in force and the generation (None when
        the ledger could not record it: the other processes are not told)."""
        with self._lock:
            policy = self._reload(None)  # an error of generation None: this process's own admin call
            generation: int | None = None
            try:
                generation = self.log.add(self.id, self.startup.policy_sha256)
            except (LedgerError, OSError) as exc:
                logger.warning("the policy reload could not be recorded, other processes keep their models: %s", exc)
            if generation is not None:
                self.generation = self.loaded_generation = generation
            self._publish()
            return policy, generation

    def _reload(self, generation: int | None) -> Policy:
        self.last_reload_at = time.time()
        try:
            policy = self.startup.reload_models()
        except ReloadError as exc:
            self.last_error = {"generation": generation, "at": self.last_reload_at, "error": str(exc)}
            logger.warning("policy reload (generation %s) failed, the models in force are kept: %s", generation, exc)
            self._publish()
            raise
        self.last_error = None
        self.loaded_generation = generation
        self.on_policy(policy)
        logger.info("policy reloaded (generation %s): %s", generation, self.startup.models_in_force())
        return policy

    # -- what is in force, here and everywhere ----------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """This process: who it is, the generation it acted on and the one its models came with, the models and
        thresholds in force, the last reload error."""
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "started_at": self.started_at,
            "ready": self.startup.ready,
            "generation": self.generation if self.generation is not None else -1,
            "loaded_generation": self.loaded_generation,
            "last_reload_at": self.last_reload_at,
            "last_error": self.last_error,
            **self.startup.models_in_force(),
        }

    def fleet(self) -> list[dict[str, Any]]:
        """Every process on this ledger as it last wrote itself, each marked `stale` when it has not for
        STALE_AFTER_S (stopped without saying so, or cut off from the database)."""
        now = time.time()
        return [{**row, "stale": now - row["updated_at"] > STALE_AFTER_S} for row in self.log.processes()]

    def _publish(self) -> None:
        state = self.state()
        self._metrics(state)
        try:
            self.log.publish(state)
        except (LedgerError, OSError) as exc:
            logger.debug("could not write this process's reload state: %s", exc)
            return

    def _metrics(self, state: dict[str, Any]) -> None:
        self.metrics.models_in_force(state)
