"""Trials: the state machine (TrialBook), its records and store, and the async TrialService.

book.py holds the transitions; its collaborators hold the rest: admission (each environment's Admission
policy, built from its limits, its queue, slots and 400/429 checks), timers (deadline/lease heap), rollouts
(ids, and the live ones), idempotency (replay fingerprints) and events (observer transitions). Stores:
MemoryStore, and the durable LedgerStore (ledger.py: rows in ledger_rows.py, known ids in idfilter.py) in a
state directory (statedir.py); recovery.py proves the cleanup of trials a restart ended; callbacks.py holds
the abort scope of a model call in flight.
"""

from relax_gym_core.plugin.specs import EnvKey
from relax_gym_core.trials.admission import Admission
from relax_gym_core.trials.book import Cancel, TrialBook
from relax_gym_core.trials.callbacks import CallbackScope
from relax_gym_core.trials.ledger import LedgerStore
from relax_gym_core.trials.records import Cause, Phase, Trial
from relax_gym_core.trials.recovery import RecoveryPolicy
from relax_gym_core.trials.service import CallbackTarget, TrialService
from relax_gym_core.trials.statedir import MEMORY, STATE_DIR_VAR, open_store, resolve_state_dir
from relax_gym_core.trials.store import MemoryStore, TrialStore

__all__ = [
    "MEMORY",
    "STATE_DIR_VAR",
    "Admission",
    "CallbackScope",
    "CallbackTarget",
    "Cancel",
    "Cause",
    "EnvKey",
    "LedgerStore",
    "MemoryStore",
    "Phase",
    "RecoveryPolicy",
    "Trial",
    "TrialBook",
    "TrialService",
    "TrialStore",
    "open_store",
    "resolve_state_dir",
]
