"""The check use case: one call to a provider on behalf of its due signals.

Short locks: transaction 1 takes the due signals of one provider
with `FOR UPDATE SKIP LOCKED`, stamps a check lease and a new fence, and
commits. The provider is called with no lock held. Transaction 2 records the
observed messages once each, decides every signal with the pure matcher, and
writes each result only if the signal's fence is still the one taken: a
worker that died or stalled past its lease can never write over a newer check.

- `runner`: the `CheckRunner`, the one object that runs a check, whoever
  asks (the Celery task, the sink's push, the sweep, the API's first look);
- `ports`: its dependencies as Protocols, its request and its report;
- `call`: the guarded provider call (breaker, bulkhead; failures are outcomes);
- `heartbeat`: the check lease renewed while the provider is asked;
- `observed`: the process's parse cache and recording the observed messages;
- `criteria`: the search, criteria and candidates the matcher takes;
- `decide`: transaction 2;
- `first`: a new sink signal's first look in one statement, when the sink
  holds no mail for it, and one first look per provider at a time.
"""

from app.usecases.checks.call import ProviderAnswer, ask_provider, provider_or_error
from app.usecases.checks.criteria import (
    candidates_for,
    criteria_for,
    search_query,
)
from app.usecases.checks.observed import Observed, Parser, record_messages
from app.usecases.checks.ports import BATCH_LIMIT, CheckReport, CheckRequest, Why
from app.usecases.checks.runner import CheckRunner, process_runner

__all__ = [
    "BATCH_LIMIT",
    "CheckReport",
    "CheckRequest",
    "CheckRunner",
    "Observed",
    "Parser",
    "ProviderAnswer",
    "Why",
    "ask_provider",
    "candidates_for",
    "criteria_for",
    "process_runner",
    "provider_or_error",
    "record_messages",
    "search_query",
]
