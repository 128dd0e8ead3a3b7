"""The CHECK constraints of the models and of the migrations list exactly the
values of the code's enums, so the code table and the database cannot drift.

Migration 0009 froze every enumerated column; a later migration that writes
a column's CHECK again freezes that column's values in its own `ENUMERATED`.
Composed in revision order they must give the models' values."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from app.db.models import ENUMERATED, OTHER_CHECKS, Base
from app.domain.chaos import ChaosStage
from app.domain.expectations import Expect
from app.domain.matching import Why
from app.domain.refusals import RefusalReason
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


def _migration(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _frozen() -> dict[tuple[str, str], tuple[str, ...]]:
    """Every migration's `ENUMERATED`, from 0009 on, applied in revision order."""
    paths = sorted(
        (ROOT / "migrations" / "versions").glob("*_00*_*.py"),
        key=lambda p: int(p.stem.split("_")[1]),
    )
    frozen: dict[tuple[str, str], tuple[str, ...]] = {}
    for path in paths:
        frozen.update(getattr(_migration(path), "ENUMERATED", {}))
    return frozen


def test_the_models_list_the_enums_values() -> None:
    assert ENUMERATED[("signals", "status")] == tuple(Status)
    assert ENUMERATED[("signals", "expiry_reason")] == tuple(ExpiryReason)
    assert ENUMERATED[("signals", "next_check_reason")] == tuple(CheckReason)
    assert ENUMERATED[("signals", "last_outcome")] == tuple(CheckOutcome)
    assert ENUMERATED[("signals", "expect")] == tuple(Expect)
    assert ENUMERATED[("checks", "reason")] == tuple(CheckReason)
    assert ENUMERATED[("checks", "outcome")] == tuple(CheckOutcome)
    assert ENUMERATED[("near_misses", "why")] == tuple(Why)
    assert ENUMERATED[("dead_letters", "reason")] == tuple(ExpiryReason)
    assert ENUMERATED[("dead_letters", "state")] == tuple(DeadLetterState)
    assert ENUMERATED[("claims", "state")] == tuple(ClaimState)
    assert ENUMERATED[("webhook_deliveries", "state")] == tuple(DeliveryState)
    assert ENUMERATED[("chaos_rules", "stage")] == tuple(ChaosStage)
    assert ENUMERATED[("smtp_refusals", "reason")] == tuple(RefusalReason)


def test_the_migrations_froze_the_models_values() -> None:
    frozen = _frozen()
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
