"""Isolation without configuration: two tenants on one stack, mail over SMTP.

Each test is one attack a shared deployment exposed, and fails on the code
before address holds: namespace B ("other") must never see namespace A's
("default") mail, whatever it watches, however far back it looks.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email import policy
from email.message import EmailMessage
from typing import Any

import httpx
import pytest

from tests.integration.helpers import db_rows, mail
from tests.security.conftest import A_ONLY_PROVIDER, TOKEN_A, TOKEN_B
from tests.stack import SHARED_DOMAIN, TOKENS, Stack, wait_until

pytestmark = pytest.mark.integration

SECRET_CODE = "583920"
SECRET_LINK = "https://app.example.test/reset?token=s3cr3t-team-a"


def client(stack: Stack, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


def secret_mail(to: str, cc: str | None = None, subject: str = "Reset your password") -> bytes:
    msg = EmailMessage()
    msg["From"] = "app@example.test"
    msg["To"] = to
    if cc is not None:
        msg["Cc"] = cc
    msg["Subject"] = subject
    msg.set_content(f"Your code is {SECRET_CODE}. Reset: {SECRET_LINK}")
    return bytes(msg)


def create(api: httpx.Client, **fields: Any) -> dict[str, Any]:
    body = {"run_id": run_id(), "test_case": f"case-{uuid.uuid4().hex[:6]}", **fields}
    r = api.post("/v1/signals", json=body)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def ended(api: httpx.Client, signal_id: str, timeout: float = 60) -> dict[str, Any]:
    def view() -> dict[str, Any] | None:
        v: dict[str, Any] = api.get(f"/v1/signals/{signal_id}", params={"wait": 5}).json()
        return v if v["status"] != "waiting" else None

    result: dict[str, Any] = wait_until(view, timeout, what=f"signal {signal_id} to end")
    return result


def messages_seen(stack: Stack, signal_id: str) -> int:
    rows = db_rows(
        stack,
        "SELECT coalesce(sum(messages_seen), 0) FROM checks WHERE signal_id = %s",
        signal_id,
    )
    return int(rows[0][0])


# ---------------------------------------------------------------- attack 1: To/Cc


def test_a_cc_to_an_address_b_watches_never_shows_b_a_mail_to_an_owned_address(
    tenancy_stack: Stack,
) -> None:
    """RCPT TO secret@team-a.test (owned by A), `Cc: audit@…` that B watches:
    the message was delivered to A's address only, so it is A's alone. B's
    signals neither find it, nor list it as a near miss, nor count it."""
    stack = tenancy_stack
    secret = f"secret-{uuid.uuid4().hex[:6]}@team-a.test"
    audit = f"audit-{uuid.uuid4().hex[:6]}@example.test"
    with client(stack, TOKEN_A) as a, client(stack, TOKEN_B) as b:
        b_any = create(b, recipient=audit, expires_in_seconds=8)
        b_near = create(
            b, recipient=audit, subject_contains="nothing-like-it", expires_in_seconds=8
        )
        a_sig = create(a, recipient=secret)
        stack.send(secret_mail(secret, cc=audit), [secret])

        assert ended(a, a_sig["signal_id"])["status"] == "found"
        for sig in (b_any, b_near):
            view = ended(b, sig["signal_id"])
            assert view["status"] == "expired", view
            assert view["message"] is None
            dead = b.get(f"/v1/dead-letters/{view['dead_letter']['dead_letter_id']}").json()
            assert dead["near_misses"] == [], dead
            text = str(view) + str(dead)
            assert SECRET_CODE not in text and "Reset your password" not in text
            assert messages_seen(stack, sig["signal_id"]) == 0


def test_a_message_delivered_to_an_address_b_holds_is_b_s_even_if_it_names_a_in_to(
    tenancy_stack: Stack,
) -> None:
    """The envelope decides, not a header the sender wrote: mail delivered
    (RCPT TO) to B's held address is B's, whatever its To says."""
    stack = tenancy_stack
    mine = f"inbox-{uuid.uuid4().hex[:6]}@example.test"
    with client(stack, TOKEN_B) as b:
        sig = create(b, recipient=mine)
        msg = secret_mail(f"ceo-{uuid.uuid4().hex[:4]}@team-a.test", cc=mine)
        stack.send(msg, [mine])
        assert ended(b, sig["signal_id"])["status"] == "found"


# ------------------------------------------------------- attack 2: look-back theft


def test_an_address_a_holds_is_refused_to_b_even_after_a_consumed_its_mail(
    tenancy_stack: Stack,
) -> None:
    stack = tenancy_stack
    address = f"new-user-{uuid.uuid4().hex[:8]}@example.test"
    with client(stack, TOKEN_A) as a, client(stack, TOKEN_B) as b:
        sig = create(a, recipient=address)
        stack.send(secret_mail(address), [address])
        assert ended(a, sig["signal_id"])["status"] == "found"
        # While A waits or holds the mail, and after it consumed it: B is refused.
        claim = a.post(
            f"/v1/signals/{sig['signal_id']}/claim", json={"run_id": sig["run_id"]}
        ).json()
        assert a.post(f"/v1/claims/{claim['claim_id']}/consume").status_code == 200
        back = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
        r = b.post(
            "/v1/signals",
            json={
                "run_id": run_id(),
                "test_case": "steal",
                "recipient": address,
                "received_after": back,
            },
        )
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "recipient_not_owned"
        # It does not say who holds it.
        assert "default" not in r.text
        # A itself goes on using it.
        create(a, recipient=address)


def test_concurrent_first_watches_of_a_fresh_address_by_two_namespaces_give_it_to_one(
    tenancy_stack: Stack,
) -> None:
    """Sixteen creates at once, half per namespace, on one fresh address:
    exactly one namespace gets it; every create of the other is refused."""
    import concurrent.futures

    stack = tenancy_stack
    address = f"race-{uuid.uuid4().hex[:8]}@example.test"

    def attempt(token: str) -> tuple[str, int]:
        with client(stack, token) as api:
            r = api.post(
                "/v1/signals",
                json={"run_id": run_id(), "test_case": "race", "recipient": address},
            )
        return token, r.status_code

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(attempt, [TOKEN_A, TOKEN_B] * 8))
    won = {token for token, code in results if code == 201}
    assert len(won) == 1, results
    loser = ({TOKEN_A, TOKEN_B} - won).pop()
    assert all(code == 403 for token, code in results if token == loser), results
    holds = db_rows(stack, "SELECT namespace FROM address_holds WHERE address = %s", address)
    assert len(holds) == 1


def test_shared_addresses_are_watched_by_both_namespaces_at_once(tenancy_stack: Stack) -> None:
    stack = tenancy_stack
    address = f"qa-{uuid.uuid4().hex[:6]}@{SHARED_DOMAIN}"
    with client(stack, TOKEN_A) as a, client(stack, TOKEN_B) as b:
        sig_a = create(a, recipient=address)
        sig_b = create(b, recipient=address)
        stack.send(mail(address, "Verify"), [address])
        assert ended(a, sig_a["signal_id"])["status"] == "found"
        assert ended(b, sig_b["signal_id"])["status"] == "found"


@pytest.fixture
def short_holds(stack_factory: Callable[..., Stack]) -> Stack:
    """Namespaces default (A) and other (B); holds last 1.8 s after a signal ends."""
    return stack_factory({"SIGNALBOX_ADDRESS_HOLD_HOURS": "0.0005"}).start()


def test_a_lapsed_hold_passes_to_b_without_handing_over_a_s_old_mail(short_holds: Stack) -> None:
    """A consumed its code at a guessable address; its hold lapsed; B watches
    the address with a look-back of an hour. B gets the mail that came after
    A's hold lapsed, never A's, and A is now refused."""
    stack = short_holds
    address = f"new-user-{uuid.uuid4().hex[:8]}@example.test"
    with client(stack, TOKENS["default"]) as a, client(stack, TOKENS["other"]) as b:
        sig = create(a, recipient=address)
        stack.send(secret_mail(address, subject="A's reset"), [address])
        assert ended(a, sig["signal_id"])["status"] == "found"
        claim = a.post(
            f"/v1/signals/{sig['signal_id']}/claim", json={"run_id": sig["run_id"]}
        ).json()
        assert a.post(f"/v1/claims/{claim['claim_id']}/consume").status_code == 200
        # Still held just after it ended.
        r = b.post("/v1/signals", json={"run_id": run_id(), "test_case": "t", "recipient": address})
        assert r.status_code == 403, r.text

        def lapsed() -> bool:
            back = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
            r = b.post(
                "/v1/signals",
                json={
                    "run_id": "run-b-late",
                    "test_case": "late",
                    "recipient": address,
                    "received_after": back,
                    "expires_in_seconds": 20,
                },
            )
            assert r.status_code in (201, 403), r.text
            return r.status_code == 201

        # Mail that arrives after A's hold lapsed and before B takes the address
        # is nobody's: it goes to the next holder.
        wait_until(lambda: _lapsed_for(stack, address), 30, what="A's hold to lapse")
        stack.send(mail(address, "B's welcome"), [address])
        wait_until(lapsed, 30, what="B to take the address")
        view = b.get("/v1/signals", params={"run_id": "run-b-late"}).json()["items"][0]
        view = ended(b, view["signal_id"])
        assert view["status"] == "found", view
        assert view["message"]["subject"] == "B's welcome"
        r = a.post("/v1/signals", json={"run_id": run_id(), "test_case": "t", "recipient": address})
        assert r.status_code == 403, r.text


def _lapsed_for(stack: Stack, address: str) -> bool:
    """Whether A's only signal on `address` ended over 1.8 s ago (its hold lapsed)."""
    rows = db_rows(
        stack,
        "SELECT bool_and(status IN ('consumed', 'expired')"
        " AND updated_at < now() - interval '2 seconds') FROM signals WHERE recipient = %s",
        address,
    )
    return bool(rows[0][0])


# --------------------------------------------------- attack 3: anyone's provider


def test_a_provider_limited_to_a_namespace_refuses_the_others(tenancy_stack: Stack) -> None:
    stack = tenancy_stack
    with client(stack, TOKEN_A) as a, client(stack, TOKEN_B) as b:
        body = {
            "run_id": run_id(),
            "test_case": "p",
            "provider": A_ONLY_PROVIDER,
            "recipient": f"x-{uuid.uuid4().hex[:6]}@example.test",
        }
        for r in (
            b.post("/v1/signals", json=body),
            b.post("/v1/mailboxes", json={"run_id": body["run_id"], "provider": A_ONLY_PROVIDER}),
            b.post(f"/v1/inbound/{A_ONLY_PROVIDER}"),
        ):
            assert r.status_code == 403, r.text
            assert r.json()["error"]["code"] == "provider_not_allowed"
        assert a.post("/v1/signals", json=body).status_code == 201
        mbx = a.post("/v1/mailboxes", json={"run_id": body["run_id"], "provider": A_ONLY_PROVIDER})
        assert mbx.status_code == 201, mbx.text
        assert a.post(f"/v1/inbound/{A_ONLY_PROVIDER}").status_code == 202
        # B's own use of the default sink is untouched.
        assert (
            b.post(
                "/v1/signals",
                json={
                    **body,
                    "provider": "sink",
                    "recipient": f"y-{uuid.uuid4().hex[:6]}@example.test",
                },
            ).status_code
            == 201
        )


# ------------------------------------------------------ attack 5: CPU amplification


def test_body_contains_searches_the_first_mebibyte_of_a_large_mail_only(
    tenancy_stack: Stack,
) -> None:
    """The searched text is capped (SIGNALBOX_MATCH_TEXT_MAX_BYTES, 1 MiB): a
    needle past it is a body_mismatch near miss, one before it matches."""
    stack = tenancy_stack
    address = f"bulk-{uuid.uuid4().hex[:6]}@example.test"
    with client(stack, TOKEN_A) as a:
        early = create(a, recipient=address, body_contains="needle-at-start")
        late = create(
            a, recipient=address, body_contains="needle-past-the-cap", expires_in_seconds=10
        )
        msg = EmailMessage()
        msg["From"] = "app@example.test"
        msg["To"] = address
        msg["Subject"] = "Bulk"
        msg.set_content(
            "needle-at-start\n" + "filler line of text\n" * 60_000 + "needle-past-the-cap\n"
        )
        # Twice: the first is taken by the early signal, the second is free.
        stack.send(msg.as_bytes(policy=policy.SMTP), [address])
        stack.send(msg.as_bytes(policy=policy.SMTP), [address])
        assert ended(a, early["signal_id"])["status"] == "found"
        view = ended(a, late["signal_id"])
        assert view["status"] == "expired", view
        dead = a.get(f"/v1/dead-letters/{view['dead_letter']['dead_letter_id']}").json()
        assert "body_mismatch" in [n["why"] for n in dead["near_misses"]], dead
