"""Guessable secrets in subjects and guessable recipients, against the places
they leave a signal's own view.

A recipient hash that is a plain SHA-256 of the address is undone by hashing
guesses (`qa+run1@example.com`, …): the hash is keyed per deployment. A
subject carrying a letters-only code or a link without a scheme must reach
evidence, dead letters, recommendations and operators masked.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import random
import smtplib
import string
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.domain.diagnosis import Diagnosis, NearMiss, recommend
from app.errors import ConfigurationError
from app.infra import keys
from app.settings import Settings, load_settings
from tests.integration.helpers import mail
from tests.security.conftest import OPS_TOKEN, TOKEN_A
from tests.stack import ROOT, Stack, wait_until

ADDRESS = "qa+run1@example.com"


def plain_hash(address: str) -> str:
    """The hash anyone can compute from a guess (what the keyed hash replaced)."""
    return hashlib.sha256(address.strip().lower().encode()).hexdigest()[:12]


def deployment(data_dir: Path, key: str = "") -> Settings:
    return load_settings(data_dir=data_dir, recipient_hash_key=key)


# -- the key, without a stack -------------------------------------------------


def test_two_deployments_hash_one_address_differently(tmp_path: Path) -> None:
    one = keys.recipient_hash(ADDRESS, deployment(tmp_path / "one"))
    two = keys.recipient_hash(ADDRESS, deployment(tmp_path / "two"))
    set_one = keys.recipient_hash(ADDRESS, deployment(tmp_path, "k" * 32))
    set_two = keys.recipient_hash(ADDRESS, deployment(tmp_path, "j" * 32))
    assert len({one, two, set_one, set_two, plain_hash(ADDRESS)}) == 5
    assert all(len(h) == 12 and int(h, 16) >= 0 for h in (one, two, set_one, set_two))
    # Within one deployment an address hashes alike, whatever its case.
    assert keys.recipient_hash(" QA+Run1@Example.COM ", deployment(tmp_path / "one")) == one
    expected = hmac.new(b"k" * 32, ADDRESS.encode(), hashlib.sha256).hexdigest()[:12]
    assert set_one == expected


def test_the_kept_key_is_private_from_creation_and_shared_by_processes_starting_together(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    script = (
        "import sys; from app.infra import keys; from app.settings import load_settings;"
        f"print(keys.recipient_hash({ADDRESS!r}, load_settings(data_dir=sys.argv[1])))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNALBOX_")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(data_dir)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(6)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    hashes = {out.decode().strip() for out, _ in outputs}
    assert len(hashes) == 1, hashes
    key_file = data_dir / keys.KEY_FILE
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert data_dir.stat().st_mode & 0o077 == 0
    # Only the key is left: no temporary file of a process that lost the race.
    assert [p.name for p in data_dir.iterdir()] == [keys.KEY_FILE]
    assert hashes == {keys.recipient_hash(ADDRESS, deployment(data_dir))}


def test_a_process_that_loses_the_creation_race_keeps_the_winners_key(tmp_path: Path) -> None:
    # The loser saw no file, then the winner linked its key into place first.
    path = tmp_path / keys.KEY_FILE
    path.write_text("w" * 64)
    keys._create(path)
    assert path.read_text() == "w" * 64
    assert [p.name for p in tmp_path.iterdir()] == [keys.KEY_FILE]


def test_a_short_recipient_hash_key_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SIGNALBOX_RECIPIENT_HASH_KEY", "short")
    with pytest.raises(ConfigurationError) as err:
        load_settings()
    assert "SIGNALBOX_RECIPIENT_HASH_KEY" in err.value.message


def test_a_truncated_kept_key_is_refused_not_used(tmp_path: Path) -> None:
    (tmp_path / keys.KEY_FILE).write_text("abc")
    with pytest.raises(ConfigurationError):
        keys.recipient_hash_key(deployment(tmp_path))


def test_the_console_secret_is_kept_like_the_hash_key_private_and_whole(
    tmp_path: Path,
) -> None:
    from app.console import session

    settings = load_settings(data_dir=tmp_path / "a", console_secret="")
    key = session.secret_key(settings)
    kept = tmp_path / "a" / session.SECRET_FILE
    assert kept.read_bytes() == key and len(key) >= keys.MIN_KEY_CHARS
    assert kept.stat().st_mode & 0o777 == 0o600
    assert session.secret_key(settings) == key
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / session.SECRET_FILE).write_text("abc")  # a half-written key
    with pytest.raises(ConfigurationError) as err:
        session.secret_key(load_settings(data_dir=tmp_path / "b", console_secret=""))
    assert "SIGNALBOX_CONSOLE_SECRET" in err.value.message


def test_a_capitals_code_cut_at_the_edge_of_a_quoted_subject_is_not_shown() -> None:
    # The recommendation quotes the first characters of a near miss's subject:
    # a code cut there must not survive as a shorter, unmasked word.
    # A long link masks to a short "<link>", so the cut word reaches the quote.
    subject = "Hi https://x.test/" + "a" * 296 + " KXQWJPAB"
    assert subject.index("KXQWJPAB") == 315  # the first 320 characters end in "KXQWJ"
    miss = NearMiss("msg_1", datetime.now(UTC), subject, "subject_mismatch")
    sentence = recommend(
        Diagnosis("deadline", "sink", datetime.now(UTC), {"no_match": 3}, None, [miss], "Verify")
    )
    assert "subject 'Hi <link>'" in sentence
    assert "KXQ" not in sentence


# -- on the stack ---------------------------------------------------------------


def random_capitals() -> str:
    return "".join(random.choices(string.ascii_uppercase, k=8))


@dataclass
class Run:
    run_id: str
    recipient: str
    doomed_recipient: str
    found_id: str
    doomed_id: str
    dead_letter_id: str
    secrets: tuple[str, ...]
    evidence: dict[str, Any]


def client(stack: Stack, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )


def stack_hash(stack: Stack, address: str) -> str:
    """The recipient hash of ``address`` in the stack's deployment (its kept key)."""
    return keys.recipient_hash(address, deployment(stack.data_dir))


@pytest.fixture(scope="module")
def run(tenancy_stack: Stack) -> Iterator[Run]:
    """A run with a consumed signal and a dead letter whose near miss's subject
    carries a capitals code and a scheme-less link with a token in its query."""
    stack = tenancy_stack
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    code, near_code = random_capitals(), random_capitals()
    token, near_token = f"tk{uuid.uuid4().hex}", f"tk{uuid.uuid4().hex}"
    recipient = f"QA.{uuid.uuid4().hex[:6]}@team-a.test"
    doomed_recipient = f"nobody-{uuid.uuid4().hex[:6]}@team-a.test"
    with client(stack, TOKEN_A) as a:
        found = a.post(
            "/v1/signals",
            json={
                "run_id": run_id,
                "test_case": "found",
                "recipient": recipient,
                "subject_contains": "Your code",
            },
        ).json()
        doomed = a.post(
            "/v1/signals",
            json={
                "run_id": run_id,
                "test_case": "doomed",
                "recipient": doomed_recipient,
                "subject_contains": "never sent",
                "expires_in_seconds": 8,
            },
        ).json()
        with smtplib.SMTP(stack.smtp_host, stack.smtp_port, timeout=90) as smtp:
            subject = f"Your code {code}: app.example.test/reset?token={token}"
            smtp.sendmail("app@example.test", [recipient], mail(recipient, subject))
            near = f"Welcome {near_code} www.x.io/v?c={near_token}"
            smtp.sendmail("app@example.test", [doomed_recipient], mail(doomed_recipient, near))
        view = a.get(f"/v1/signals/{found['signal_id']}", params={"wait": 30}).json()
        assert view["status"] == "found", view
        claim = a.post(f"/v1/signals/{found['signal_id']}/claim", json={"run_id": run_id}).json()
        assert a.post(f"/v1/claims/{claim['claim_id']}/consume").status_code == 200

        def dead_letter() -> str | None:
            v = a.get(f"/v1/signals/{doomed['signal_id']}", params={"wait": 5}).json()
            return v["dead_letter"]["dead_letter_id"] if v.get("dead_letter") else None

        dead_letter_id = wait_until(dead_letter, 60, what="the dead letter")
        evidence = a.get(f"/v1/runs/{run_id}/evidence")
        assert evidence.status_code == 200, evidence.text
    yield Run(
        run_id=run_id,
        recipient=recipient,
        doomed_recipient=doomed_recipient,
        found_id=found["signal_id"],
        doomed_id=doomed["signal_id"],
        dead_letter_id=dead_letter_id,
        secrets=(code, near_code, token, near_token),
        evidence=evidence.json(),
    )


@pytest.mark.integration
def test_the_evidence_of_a_run_carries_the_keyed_hash_and_never_the_address(
    tenancy_stack: Stack, run: Run
) -> None:
    text = json.dumps(run.evidence)
    by_id = {s["signal_id"]: s for s in run.evidence["signals"]}
    pairs = ((run.found_id, run.recipient), (run.doomed_id, run.doomed_recipient))
    for signal_id, address in pairs:
        assert by_id[signal_id]["recipient_hash"] == stack_hash(tenancy_stack, address)
        assert plain_hash(address) not in text
        assert address.lower() not in text.lower()
    # The receipt's own evidence carries the same keyed hash.
    receipt = by_id[run.found_id]["receipt"]
    assert receipt["evidence"]["recipient_hash"] == stack_hash(tenancy_stack, run.recipient)


@pytest.mark.integration
def test_log_lines_of_every_process_carry_the_keyed_hash(tenancy_stack: Stack, run: Run) -> None:
    keyed = stack_hash(tenancy_stack, run.recipient)

    def logged() -> list[dict[str, Any]]:
        entries = []
        for line in tenancy_stack.log_text().splitlines():
            if keyed in line:
                entries.append(json.loads(line))
        return entries

    # The sink (smtp), the API and the worker each log it: one key in every process.
    entries = wait_until(
        lambda: (e := logged()) and {"smtp", "api"} <= {x.get("component") for x in e} and e,
        30,
        what="the sink's and the API's lines with the keyed hash",
    )
    events = {e.get("event") for e in entries}
    assert {"sink_received", "signal_created", "signal_consumed"} <= events, events
    text = tenancy_stack.log_text()
    assert plain_hash(run.recipient) not in text
    assert run.recipient.lower() not in text.lower()


@pytest.mark.integration
def test_capitals_codes_and_query_links_are_masked_in_evidence_and_dead_letters(
    tenancy_stack: Stack, run: Run
) -> None:
    message = {s["signal_id"]: s for s in run.evidence["signals"]}[run.found_id]["message"]
    assert message["subject"] == "Your code <code>: <link>"
    with client(tenancy_stack, TOKEN_A) as a:
        dead = a.get(f"/v1/dead-letters/{run.dead_letter_id}").json()
    assert [n["subject"] for n in dead["near_misses"]] == ["Welcome <code> <link>"]
    for text in (json.dumps(run.evidence), json.dumps(dead)):
        for secret in run.secrets:
            assert secret not in text


@pytest.mark.integration
def test_an_operator_sees_capitals_codes_and_query_links_masked(
    tenancy_stack: Stack, run: Run
) -> None:
    with client(tenancy_stack, OPS_TOKEN) as ops:
        answers = [
            ops.get(f"/v1/signals/{run.found_id}"),
            ops.get(f"/v1/signals/{run.doomed_id}"),
            ops.get(f"/v1/dead-letters/{run.dead_letter_id}"),
            ops.get("/v1/dead-letters", params={"run_id": run.run_id}),
        ]
    assert [r.status_code for r in answers] == [200] * 4
    assert answers[0].json()["message"]["subject"] == "Your code <code>: <link>"
    for r in answers:
        for secret in run.secrets:
            assert secret not in r.text


@pytest.mark.integration
def test_one_operator_masking_rule_in_the_api_and_the_console(
    tenancy_stack: Stack, run: Run
) -> None:
    """An operator sees no recipient address anywhere: the API's signal and
    dead-letter views and the console's signal, dead-letter and run pages
    follow the same rule; the tenant (the control) sees its own address."""
    from tests.security.test_console_hardening import sign_in

    pages = (
        f"/console/signals/{run.doomed_id}",
        f"/console/signals/{run.found_id}",
        f"/console/dead-letters/{run.dead_letter_id}",
        f"/console/runs/{run.run_id}",
    )
    with client(tenancy_stack, OPS_TOKEN) as ops:
        api = [
            ops.get(f"/v1/signals/{run.found_id}"),
            ops.get(f"/v1/signals/{run.doomed_id}"),
            ops.get(f"/v1/dead-letters/{run.dead_letter_id}"),
            ops.get("/v1/signals", params={"run_id": run.run_id}),
        ]
    with httpx.Client(base_url=tenancy_stack.api_url, timeout=60) as console:
        sign_in(console, OPS_TOKEN)
        seen = [console.get(p) for p in pages]
    for r in [*api, *seen]:
        assert r.status_code == 200, (r.url, r.status_code)
        for address in (run.recipient, run.doomed_recipient):
            assert address.lower() not in r.text.lower(), r.url
    assert api[0].json()["recipient"] == "<address>"
    with httpx.Client(base_url=tenancy_stack.api_url, timeout=60) as console:
        sign_in(console, TOKEN_A)
        own = console.get(pages[0])
    assert run.doomed_recipient in own.text
