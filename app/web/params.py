"""Path and query parameters with their shape: nothing the database cannot
store (a NUL, a surrogate) reaches a query; a malformed one is a 422 naming it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from app.usecases.inputs import NAME_PATTERN, RUN_ID_PATTERN

ID_PATTERN = r"^[A-Za-z0-9_]{1,64}$"

SignalId = Annotated[str, Path(pattern=ID_PATTERN, max_length=64)]
ClaimId = Annotated[str, Path(pattern=ID_PATTERN, max_length=64)]
MailboxId = Annotated[str, Path(pattern=ID_PATTERN, max_length=64)]
DeadLetterId = Annotated[str, Path(pattern=ID_PATTERN, max_length=64)]
RunIdPath = Annotated[str, Path(pattern=RUN_ID_PATTERN, min_length=1, max_length=128)]
RunIdQuery = Annotated[str, Query(pattern=RUN_ID_PATTERN, min_length=1, max_length=128)]
ProviderPath = Annotated[str, Path(pattern=NAME_PATTERN, max_length=128)]
ProviderQuery = Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=128)]
# An operator's `?namespace=` filter (a tenant's own namespace always wins).
NamespaceQuery = Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=128)]
Cursor = Annotated[str | None, Query(max_length=256)]
Limit = Annotated[int, Query(ge=1, le=500)]
