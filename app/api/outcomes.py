"""The HTTP codes of the use cases' outcomes: a use case says what happened,
the front door says it in HTTP (docs/api.md)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from app.domain.admission import CreateOutcome
from app.domain.claiming import ClaimOutcome
from app.usecases.claim_answers import Answer

CLAIM_CODES: dict[ClaimOutcome, int] = {
    ClaimOutcome.CLAIMED: 200,
    ClaimOutcome.WAITING: 202,
    ClaimOutcome.EXPIRED: 410,
    ClaimOutcome.ALREADY_CONSUMED: 409,
    ClaimOutcome.ALREADY_CLAIMED: 409,
    ClaimOutcome.ENDED: 410,
}

CREATE_CODES: dict[CreateOutcome, int] = {
    CreateOutcome.CREATED: 201,
    # The key names a signal already: 202 while it waits, else 200.
    CreateOutcome.EXISTING_WAITING: 202,
    CreateOutcome.EXISTING: 200,
}


def claim_response(answer: Answer) -> JSONResponse:
    """A claim's answer (or a claim read's, or its content's) as its code and body."""
    return JSONResponse(answer.body, status_code=CLAIM_CODES[answer.outcome])
