"""The OpenAPI document tells the truth: schemathesis against the live API.

Every operation gets a bounded number of generated requests, valid and
invalid, with a valid token; none may answer 5xx, a status the document does
not declare, or a body that does not match the declared schema.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.stack import Stack

pytestmark = pytest.mark.integration

EXAMPLES_PER_OPERATION = 12
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
# Server-sent events never end: each call would wait out its timeout
# (tests/security/test_inbox_events.py tests the stream).
STREAMS = {"/v1/messages/events"}


def test_every_operation_answers_only_documented_statuses_and_schemas(stack: Stack) -> None:
    schema = schemathesis.openapi.from_url(f"{stack.api_url}/openapi.json")
    headers = {"Authorization": f"Bearer {stack.token}"}
    failures: dict[str, str] = {}
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        if operation.path in STREAMS:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            failure = _exercise(operation, mode, headers)
            if failure:
                failures[f"{operation.label} ({mode.value})"] = failure
    assert operations >= 15
    assert not failures, "\n\n".join(f"{k}\n{v}" for k, v in failures.items())


def _exercise(
    operation: schemathesis.APIOperation, mode: GenerationMode, headers: dict[str, str]
) -> str | None:
    """Run the operation's generated cases; the failure found, or None."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def exercise(case: schemathesis.Case) -> None:
        case.call_and_validate(headers=headers, checks=CHECKS, timeout=30)

    try:
        exercise()
    except Unsatisfiable:
        return None  # nothing to make invalid (an operation without parameters)
    except (Exception, BaseExceptionGroup) as exc:  # a FailureGroup is a BaseExceptionGroup
        return f"{type(exc).__name__}: {exc}"[:3000]
    return None
