"""The CHECK constraints of the models and of migration 0009 list exactly the
values of the code's enums, so the code table and the database cannot drift."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from app.db.models import ENUMERATED, OTHER_CHECKS, Base
from app.domain.chaos import ChaosStage
from app.domain.matching import Why
from app.domain.states import (
    CheckOutcome,
    CheckReason,
    ClaimState,
    DeadLetterState,
    DeliveryState,
    ExpiryReason,
    Status,
)

ROOT = Path(__file__).resolve().parents[2]


def _migration(number: str) -> ModuleType:
    (path,) = (ROOT / "migrations" / "versions").glob(f"*_{number}_*.py")
    spec = importlib.util.spec_from_file_location(f"migration_{number}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Migrations after 0009 that change or add enumerated columns, in order; each
# freezes the lists it changes in its own ENUMERATED.
LATER = ("0014",)


def test_the_models_list_the_enums_values() -> None:
    assert ENUMERATED[("signals", "status")] == tuple(Status)
    assert ENUMERATED[("signals", "expiry_reason")] == tuple(ExpiryReason)
    assert ENUMERATED[("signals", "next_check_reason")] == tuple(CheckReason)
    assert ENUMERATED[("signals", "last_outcome")] == tuple(CheckOutcome)
    assert ENUMERATED[("checks", "reason")] == tuple(CheckReason)
    assert ENUMERATED[("checks", "outcome")] == tuple(CheckOutcome)
    assert ENUMERATED[("near_misses", "why")] == tuple(Why)
    assert ENUMERATED[("dead_letters", "reason")] == tuple(ExpiryReason)
    assert ENUMERATED[("dead_letters", "state")] == tuple(DeadLetterState)
    assert ENUMERATED[("claims", "state")] == tuple(ClaimState)
    assert ENUMERATED[("webhook_deliveries", "state")] == tuple(DeliveryState)
    assert ENUMERATED[("chaos_rules", "stage")] == tuple(ChaosStage)


def test_the_migrations_froze_the_models_values() -> None:
    frozen = dict(_migration("0009").ENUMERATED)
    for number in LATER:
        frozen.update(_migration(number).ENUMERATED)
    assert {k: [str(v) for v in vs] for k, vs in ENUMERATED.items()} == {
        k: list(vs) for k, vs in frozen.items()
    }


def test_every_enumerated_column_has_its_check_constraint_on_the_model() -> None:
    declared = {
        c.name
        for table in Base.metadata.sorted_tables
        for c in table.constraints
        if c.__class__.__name__ == "CheckConstraint"
    }
    # Besides: a chaos rule has `times` or `probability`, never both.
    assert declared == {f"ck_{table}_{column}" for table, column in ENUMERATED} | set(OTHER_CHECKS)
