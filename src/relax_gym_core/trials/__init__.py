"""Trials: the state machine (TrialBook), its records and store, and the async TrialService.

book.py holds the transitions; its collaborators hold the rest: admission (per-environment queues, slots,
400/429 checks), timers (deadline/lease heap), capabilities (rollout id index), idempotency (replay
fingerprints), retention (eviction of settled records) and events (observer transitions).
"""

from relax_gym_core.trials.book import Cancel, TrialBook
from relax_gym_core.trials.records import Admission, Cause, EnvKey, Phase, Trial
from relax_gym_core.trials.service import CallbackTarget, TrialService
from relax_gym_core.trials.store import MemoryStore, TrialStore

__all__ = [
    "Admission",
    "CallbackTarget",
    "Cancel",
    "Cause",
    "EnvKey",
    "MemoryStore",
    "Phase",
    "Trial",
    "TrialBook",
    "TrialService",
    "TrialStore",
]
