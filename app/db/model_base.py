"""The declarative base of the schema and the helpers its tables share: the
naming convention, the timestamp type, the kinds of column they repeat, and
the CHECK constraints that keep an enumerated column to the values the code
knows (`ENUMERATED`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Any, ClassVar

from sqlalchemy import CheckConstraint, DateTime, Index, MetaData, String, text
from sqlalchemy.orm import DeclarativeBase, mapped_column

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

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

NOW = text("now()")
TS = DateTime(timezone=True)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    # Every moment is stored with its time zone: `Mapped[datetime]` is a TS.
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: TS}


# The kinds of column the tables share, each declared once: a column
# annotated `Mapped[Name]` is a String(128), and so on (SQLAlchemy maps the
# `Annotated` declaration; more arguments to `mapped_column` add to it).

# One of our ids (`sig_…`, `clm_…`) as its row's primary key.
Key = Annotated[str, mapped_column(String(40), primary_key=True)]
# A namespace, a run id, a provider's name.
Name = Annotated[str, mapped_column(String(128))]
# A moment the database stamps when the row is inserted.
Stamped = Annotated[datetime, mapped_column(server_default=NOW)]


# States of rows that have no enum in app.domain.

# (table, column) -> the values the code writes there; NULL passes a CHECK.
ENUMERATED: dict[tuple[str, str], tuple[str, ...]] = {
    ("signals", "status"): tuple(Status),
    ("signals", "expiry_reason"): tuple(ExpiryReason),
    ("signals", "next_check_reason"): tuple(CheckReason),
    ("signals", "last_outcome"): tuple(CheckOutcome),
    ("signals", "expect"): tuple(Expect),
    ("checks", "reason"): tuple(CheckReason),
    ("checks", "outcome"): tuple(CheckOutcome),
    ("near_misses", "why"): tuple(Why),
    ("claims", "state"): tuple(ClaimState),
    ("dead_letters", "reason"): tuple(ExpiryReason),
    ("dead_letters", "state"): tuple(DeadLetterState),
    ("webhook_deliveries", "state"): tuple(DeliveryState),
    ("chaos_rules", "stage"): tuple(ChaosStage),
    ("smtp_refusals", "reason"): tuple(RefusalReason),
}


# CHECK constraints besides ENUMERATED's (`ck_<table>_<name>`).
OTHER_CHECKS = ("ck_chaos_rules_times_or_probability",)


def partial(name: str, *columns: str, where: str, unique: bool = False) -> Index:
    """An index of the rows `where` holds (an SQL condition) only."""
    return Index(name, *columns, unique=unique, postgresql_where=text(where))


def one_of(table: str, *columns: str) -> Iterable[CheckConstraint]:
    """The CHECK constraints that keep `table`'s `columns` to ENUMERATED's values."""
    for column in columns:
        listed = ", ".join(f"'{value}'" for value in ENUMERATED[(table, column)])
        yield CheckConstraint(f"{column} IN ({listed})", name=column)
