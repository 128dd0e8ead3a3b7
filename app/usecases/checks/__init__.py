"""The check use case: one call to a provider on behalf of its due signals.

Short locks: transaction 1 takes the due signals of one provider
with `FOR UPDATE SKIP LOCKED`, stamps a check lease and a new fence, and
commits. The provider is called with no lock held. Transaction 2 records the
observed messages once each, decides every signal with the pure matcher, and
writes each result only if the signal's fence is still the one taken: a
worker that died or stalled past its lease can never write over a newer check.

- `run`: `run_check` and the check made in this process (`check_in_process`);
- `call`: the guarded provider call (breaker, bulkhead; failures are outcomes);
- `heartbeat`: the check lease renewed while the provider is asked;
- `observed`: the process's parse cache and recording the observed messages;
- `criteria`: the search, criteria and candidates the matcher takes;
- `decide`: transaction 2;
- `first`: a new sink signal's first look in one statement, when the sink
  holds no mail for it.
"""

from app.usecases.checks.call import ProviderAnswer, ask_provider, provider_or_error
from app.usecases.checks.criteria import (
    candidates_for,
    criteria_for,
    search_query,
)
from app.usecases.checks.first import QuickFirstLook, first_look_if_empty, quick_first_look_for
from app.usecases.checks.observed import Observed, parse_with, record_messages
from app.usecases.checks.run import (
    BATCH_LIMIT,
    CheckReport,
    InProcessCheck,
    check_in_process,
    in_process_check_for,
    run_check,
    try_check_in_process,
)

__all__ = [
    "BATCH_LIMIT",
    "CheckReport",
    "InProcessCheck",
    "Observed",
    "ProviderAnswer",
    "QuickFirstLook",
    "ask_provider",
    "candidates_for",
    "check_in_process",
    "criteria_for",
    "first_look_if_empty",
    "in_process_check_for",
    "parse_with",
    "provider_or_error",
    "quick_first_look_for",
    "record_messages",
    "run_check",
    "search_query",
    "try_check_in_process",
]
