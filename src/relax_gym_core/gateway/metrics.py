"""Prometheus metrics for `GET /metrics`: an observer of trial transitions and model calls, plus admission
gauges read from the trial book when scraped (so nothing is counted twice and no gauge can drift).

Labels are the environment and config of the gateway's own specs, the trial status, cleanup outcome,
failure kind, model-call resource and HTTP status code: all bounded. No request id, rollout id or token is
ever a label.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from relax_gym_core.observe import CallbackOutcome, Transition, TrialEvent
from relax_gym_core.replicas.pool import ReplicaPool
from relax_gym_core.trials import Admission, EnvKey

# Seconds: a model call takes milliseconds to minutes; a trial phase seconds to hours.
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
PHASE_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400)
_NO_TRIAL = ("none", "none")  # model calls that named no live trial
MAX_FAILURE_KINDS = 64

type EnvCounts = Callable[[EnvKey], tuple[int, int, int]]


class _AdmissionCollector(Collector):
    """Queue depth, runs in flight and slots held per environment, read at scrape time."""

    def __init__(self, admissions: Mapping[EnvKey, Admission], counts: EnvCounts) -> None:
        self._admissions = dict(admissions)
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        labels = ["environment", "config"]
        families = {
            "queued": GaugeMetricFamily(
                "relax_gym_trials_queued", "Trials waiting for a slot", labels=labels
            ),
            "running": GaugeMetricFamily(
                "relax_gym_trials_running", "Trials whose run is in flight", labels=labels
            ),
            "slots": GaugeMetricFamily(
                "relax_gym_slots_held", "Slots held: running, or cleaning up after the run", labels=labels
            ),
            "limit": GaugeMetricFamily("relax_gym_max_concurrency", "Slots per environment", labels=labels),
        }
        for key, admission in self._admissions.items():
            queued, running, slots = self._counts(key)
            values = {
                "queued": queued,
                "running": running,
                "slots": slots,
                "limit": admission.max_concurrency,
            }
            for name, value in values.items():
                families[name].add_metric(list(key), value)
        yield from families.values()


class _ReplicaCollector(Collector):
    """Replicas wanted, healthy and starting per environment, and runs placed per replica (scrape time).

    Replica names are bounded: the ones `relax-gym up` started, replacements included."""

    def __init__(self, pools: Sequence[ReplicaPool]) -> None:
        self._pools = tuple(pools)

    def collect(self) -> Iterator[Metric]:
        replicas = GaugeMetricFamily(
            "relax_gym_replicas",
            "Replicas per environment: wanted, healthy, starting",
            labels=["environment", "state"],
        )
        lost = CounterMetricFamily(
            "relax_gym_replicas_lost",
            "Replicas taken out of placement because they died",
            labels=["environment"],
        )
        placed = CounterMetricFamily(
            "relax_gym_replica_runs", "Runs placed on each replica", labels=["environment", "replica"]
        )
        running = GaugeMetricFamily(
            "relax_gym_replica_runs_in_flight",
            "Runs in flight on each healthy replica",
            labels=["environment", "replica"],
        )
        for pool in self._pools:
            status = pool.status()
            for environment in pool.environments:
                for state, value in (
                    ("wanted", status.wanted),
                    ("healthy", status.healthy),
                    ("starting", status.starting),
                ):
                    replicas.add_metric([environment, state], value)
                lost.add_metric([environment], status.lost)
                for name, count in status.placed.items():
                    placed.add_metric([environment, name], count)
                for name, count in status.running.items():
                    running.add_metric([environment, name], count)
        yield from (replicas, lost, placed, running)


class GatewayMetrics:
    """An Observer (relax_gym_core.observe) keeping the gateway's Prometheus metrics in a private registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        env = ["environment", "config"]
        self._created = Counter("relax_gym_trials_created", "Trials admitted", env, registry=self.registry)
        self._finished = Counter(
            "relax_gym_trials_finished",
            "Trials that reached a final status",
            [*env, "status"],
            registry=self.registry,
        )
        self._failures = Counter(
            "relax_gym_trial_failures",
            "Trials that ended unscored (failed or aborted), by what ended them: an infrastructure failure's "
            "kind (judge_failed, masked:<kind>, verifier_error, ...) or the error code",
            [*env, "kind"],
            registry=self.registry,
        )
        self._failure_kinds: set[str] = set()
        self._cleanups = Counter(
            "relax_gym_trial_cleanups",
            "Cleanup verdicts (confirmed, unverified, failed)",
            [*env, "outcome"],
            registry=self.registry,
        )
        self._phases = Histogram(
            "relax_gym_trial_phase_seconds",
            "Time trials spent in a phase: queued, running, cancelling (cleanup before the final status), "
            "terminal (cleanup after it)",
            [*env, "phase"],
            buckets=PHASE_BUCKETS,
            registry=self.registry,
        )
        self._calls = Counter(
            "relax_gym_model_calls",
            "Model calls through the bridge, by final HTTP status",
            [*env, "resource", "code"],
            registry=self.registry,
        )
        self._call_seconds = Histogram(
            "relax_gym_model_call_seconds",
            "Duration of model calls through the bridge (retries and back-off included)",
            [*env, "resource"],
            buckets=CALL_BUCKETS,
            registry=self.registry,
        )
        self._unknown_keys = Counter(
            "relax_gym_unknown_request_keys",
            "Keys of create requests that relax-nemo-gym/v1 does not define (ignored, or refused with "
            "RELAX_GYM_UNKNOWN_KEYS=refuse), by the object they were in",
            ["location"],
            registry=self.registry,
        )
        self._per_call: dict[tuple[str, str, str, int], tuple[Counter, Histogram]] = {}  # as many as labels
        self._retries = Counter(
            "relax_gym_model_call_retries",
            "Upstream attempts beyond the first",
            [*env, "resource"],
            registry=self.registry,
        )

    def unknown_key(self, location: str) -> None:
        """A create request carried a key relax-nemo-gym/v1 does not define (gateway/intake.py)."""
        self._unknown_keys.labels(location).inc()

    def watch_admission(self, admissions: Mapping[EnvKey, Admission], counts: EnvCounts) -> None:
        """Report queue depth, runs in flight and slots held, read from `counts` at each scrape."""
        self.registry.register(_AdmissionCollector(admissions, counts))

    def watch_replicas(self, pools: Sequence[ReplicaPool]) -> None:
        """Report the replica pools' state (nothing when the gateway has none)."""
        if pools:
            self.registry.register(_ReplicaCollector(pools))

    def transition(self, event: Transition) -> None:
        env = (event.environment, event.config)
        if event.previous is not None:
            self._phases.labels(*env, event.previous.value).observe(event.phase_s)
        if event.event is TrialEvent.QUEUED:
            self._created.labels(*env).inc()
        elif event.event is TrialEvent.TERMINAL:
            self._finished.labels(*env, event.status.value).inc()
            if event.failure is not None:
                self._failures.labels(*env, self._failure_label(event.failure)).inc()
        elif event.event is TrialEvent.SETTLED:
            self._cleanups.labels(*env, event.cleanup.value).inc()

    def _failure_label(self, kind: str) -> str:
        """Kinds are bounded names, but an environment names its own (masked:<kind>): past MAX_FAILURE_KINDS
        distinct ones, the rest count as "other" (a label set must stay small)."""
        if kind not in self._failure_kinds:
            if len(self._failure_kinds) >= MAX_FAILURE_KINDS:
                return "other"
            self._failure_kinds.add(kind)
        return kind

    def callback(self, outcome: CallbackOutcome) -> None:
        env = (outcome.environment, outcome.config) if outcome.environment else _NO_TRIAL
        key = (*env, outcome.resource, outcome.status)
        children = self._per_call.get(key)
        if children is None:  # labels() validates and locks on every call: once per label set instead
            children = self._per_call[key] = (
                self._calls.labels(*env, outcome.resource, str(outcome.status)),
                self._call_seconds.labels(*env, outcome.resource),
            )
        children[0].inc()
        children[1].observe(outcome.seconds)
        if outcome.attempts > 1:
            self._retries.labels(*env, outcome.resource).inc(outcome.attempts - 1)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
