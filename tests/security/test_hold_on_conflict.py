"""A create that answers 409 takes no hold (issue 45): the one-statement
create's `held` step must not keep an address for a namespace that got no
signal on it, or another namespace is refused the address for a day."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.integration.helpers import db_scalar
from tests.security.conftest import TOKEN_A, TOKEN_B
from tests.stack import Stack

pytestmark = pytest.mark.integration


def client(stack: Stack, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def test_an_idempotency_conflict_keeps_no_hold_on_the_new_address(tenancy_stack: Stack) -> None:
    stack = tenancy_stack
    first = f"first-{uuid.uuid4().hex[:8]}@example.test"
    second = f"second-{uuid.uuid4().hex[:8]}@example.test"
    key = {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    body = {"run_id": f"run-{uuid.uuid4().hex[:8]}", "test_case": "hold"}
    with client(stack, TOKEN_A) as a, client(stack, TOKEN_B) as b:
        assert (
            a.post("/v1/signals", json={**body, "recipient": first}, headers=key).status_code == 201
        )
        again = a.post("/v1/signals", json={**body, "recipient": second}, headers=key)
        assert again.status_code == 409, again.text
        assert again.json()["error"]["code"] == "idempotency_conflict"
        assert (
            db_scalar(stack, "SELECT count(*) FROM address_holds WHERE address = %s", second) == 0
        )
        # The address is still free: B may watch it.
        r = b.post("/v1/signals", json={**body, "recipient": second})
        assert r.status_code == 201, r.text
        # The control: A's first address is A's.
        r = b.post("/v1/signals", json={**body, "recipient": first})
        assert r.status_code == 403, r.text
