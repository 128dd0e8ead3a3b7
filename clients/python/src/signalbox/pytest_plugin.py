"""pytest plugin: wait for expected emails from tests, with evidence in CI.

Fixtures:

- ``signalbox`` — a :class:`signalbox.Signalbox` client; the signals a test
  creates are recorded and, at the end of the test, attached to the JUnit XML
  as properties (``signalbox_run_id``, ``signalbox_signal_ids``,
  ``signalbox_receipt_ids``, ``signalbox_dead_letter_ids`` for those that
  expired, and ``signalbox_attachment_sha256``: the SHA-256 of each attachment
  of the messages it consumed, as their receipts pin them);
- ``signalbox_run_id`` — one run id per session (``--signalbox-run-id``, else
  ``$SIGNALBOX_RUN_ID``, else ``pytest-<uuid>``); with pytest-xdist (``-n 8``)
  the controller chooses it and every worker uses the same one: one run is one run;
- ``mailbox`` — a fresh :class:`signalbox.models.Mailbox` (an address no earlier
  message can match) for this test, deleted after it when it passed; a failed
  test's mailbox is kept, its mail readable in the inbox and the console;
- ``signalbox_test_case`` — the test's node id (cut to the API's 200 characters);
- ``signalbox_watch`` — ``watch(recipient, ...)`` with run id and test case bound,
  taking defaults from ``@pytest.mark.signalbox(provider=..., expires_in_seconds=...)``;
  ``signalbox_watch.none(recipient, ...)`` and
  ``signalbox_watch.exactly_one(recipient, settle_seconds=..., ...)`` assert
  that no email, or exactly one, arrives;
- ``signalbox_expect_none`` / ``signalbox_expect_exactly_one`` — the same two
  as fixtures of their own: ``signalbox_expect_none(address, subject_contains=...).wait()``
  returns once the deadline passed with no such email and fails the test
  (``EmailArrived``, an ``AssertionError``) as soon as one arrives.

Configuration, first found wins: ``--signalbox-url``/``--signalbox-token``, the
ini keys ``signalbox_url``/``signalbox_token``, ``$SIGNALBOX_URL``/``$SIGNALBOX_TOKEN``.
``--signalbox-evidence DIR`` writes the run's evidence to ``DIR/<run_id>.json``
at the end of the session.

At the end of each test, every signal it watched that has not ended is
cancelled (reason ``test_failed`` when the test failed, else ``test_ended``):
a failed test leaves no dead letter behind it.

A test that fails with a Signalbox error shows the exception and the test's
own line, not the client's frames.

The plugin is inert in sessions that use none of its fixtures: no network, no files.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from signalbox._core import TOKEN_ENV, URL_ENV
from signalbox.client import Signalbox, SignalHandle
from signalbox.errors import (
    NotCancellable,
    ServiceUnavailable,
    SignalboxError,
    SignalExpired,
    hide_client_frames,
)
from signalbox.models import Mailbox, Receipt, Signal
from signalbox.watch import Watch

# pytest: a Signalbox error's traceback leaves the plugin's frames out too.
__tracebackhide__ = hide_client_frames

RUN_ID_ENV = "SIGNALBOX_RUN_ID"
#: pytest-xdist's id of one test run, the same in the controller and every worker.
XDIST_RUN_ENV = "PYTEST_XDIST_TESTRUNUID"
#: The key of the run id in xdist's ``workerinput`` (the controller sets it).
WORKER_RUN_ID = "signalbox_run_id"
TEST_CASE_MAX = 200
#: Keyword arguments of ``@pytest.mark.signalbox`` passed on to ``watch``.
MARKER_KEYS = frozenset(
    {
        "provider",
        "expires_in_seconds",
        "max_checks",
        "require_run_marker",
        "metadata",
        "subject_contains",
        "body_contains",
        "expect",
        "settle_seconds",
    }
)


@dataclass
class _State:
    """What the plugin learned during the session (nothing until a fixture is used)."""

    run_id: str | None = None
    current: str | None = None
    signals: dict[str, list[str]] = field(default_factory=dict)
    receipts: dict[str, str] = field(default_factory=dict)  # signal_id -> receipt_id
    # signal_id -> the SHA-256 of each attachment its receipt's evidence pins
    attachments: dict[str, list[str]] = field(default_factory=dict)
    dead_letters: dict[str, str] = field(default_factory=dict)  # signal_id -> dead_letter_id
    evidence_path: Path | None = None
    evidence_error: str | None = None

    def listen(self, event: str, obj: object) -> None:
        if event == "signal" and isinstance(obj, Signal):
            ids = self.signals.setdefault(self.current or "<session>", [])
            if obj.signal_id not in ids:
                ids.append(obj.signal_id)
        elif event == "receipt" and isinstance(obj, Receipt):
            self.receipts[obj.signal_id] = obj.receipt_id
            self.attachments[obj.signal_id] = attachment_hashes(obj.raw)


_STATE = pytest.StashKey[_State]()
#: Set on a test item whose setup or call failed (read by the fixtures' teardown).
_FAILED = pytest.StashKey[bool]()
REASON_FAILED = "test_failed"
REASON_ENDED = "test_ended"


def _test_failed(request: pytest.FixtureRequest) -> bool:
    return request.node.stash.get(_FAILED, False)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("signalbox", "Signalbox (wait for expected emails)")
    group.addoption(
        "--signalbox-url",
        dest="signalbox_url",
        metavar="URL",
        help=f"Signalbox API URL (else ini signalbox_url, else ${URL_ENV})",
    )
    group.addoption(
        "--signalbox-token",
        dest="signalbox_token",
        metavar="TOKEN",
        help=f"Signalbox API token (else ini signalbox_token, else ${TOKEN_ENV})",
    )
    group.addoption(
        "--signalbox-run-id",
        dest="signalbox_run_id",
        metavar="RUN_ID",
        help=f"run id for this session (else ${RUN_ID_ENV}, else pytest-<uuid>)",
    )
    group.addoption(
        "--signalbox-evidence",
        dest="signalbox_evidence",
        metavar="DIR",
        help="write the run's evidence artifact to DIR/<run_id>.json at session end",
    )
    parser.addini("signalbox_url", f"Signalbox API URL (else ${URL_ENV})", default=None)
    parser.addini("signalbox_token", f"Signalbox API token (else ${TOKEN_ENV})", default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "signalbox(**defaults): defaults for the signalbox_watch fixture "
        "(provider=, expires_in_seconds=, max_checks=, require_run_marker=, ...)",
    )
    state = _State()
    # An xdist worker: the controller chose the session's run id.
    workerinput = getattr(config, "workerinput", None)
    if isinstance(workerinput, dict) and workerinput.get(WORKER_RUN_ID):
        state.run_id = str(workerinput[WORKER_RUN_ID])
    config.stash[_STATE] = state


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, in the controller: every worker gets the session's run id."""
    node.workerinput[WORKER_RUN_ID] = session_run_id(node.config)


def session_run_id(config: pytest.Config) -> str:
    """The run id of this session: ``--signalbox-run-id``, else ``$SIGNALBOX_RUN_ID``,
    else the one the xdist controller chose (or derived from xdist's run uid),
    else ``pytest-<uuid>``, chosen once."""
    state = config.stash[_STATE]
    if state.run_id is None:
        xdist_run = os.environ.get(XDIST_RUN_ENV)
        state.run_id = (
            config.getoption("signalbox_run_id")
            or os.environ.get(RUN_ID_ENV)
            or (f"pytest-{_as_uuid(xdist_run)}" if xdist_run else None)
            or f"pytest-{uuid.uuid4()}"
        )
    return state.run_id


def _as_uuid(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return value[:80]


def _setting(config: pytest.Config, name: str, env: str) -> str | None:
    value = config.getoption(name) or config.getini(name) or os.environ.get(env)
    return str(value) if value else None


def make_test_case(nodeid: str) -> str:
    """The node id, or for a long one a prefix plus a hash that stays unique."""
    if len(nodeid) <= TEST_CASE_MAX:
        return nodeid
    digest = hashlib.sha256(nodeid.encode()).hexdigest()[:12]
    return f"{nodeid[: TEST_CASE_MAX - 13]}~{digest}"


@pytest.fixture(scope="session")
def signalbox_run_id(pytestconfig: pytest.Config) -> str:
    """The run id shared by every test of this session (every xdist worker's too)."""
    return session_run_id(pytestconfig)


@pytest.fixture(scope="session")
def _signalbox_session(pytestconfig: pytest.Config, signalbox_run_id: str) -> Iterator[Signalbox]:
    """The session's client; writes the evidence artifact when the session ends."""
    state = pytestconfig.stash[_STATE]
    client = Signalbox(
        _setting(pytestconfig, "signalbox_url", URL_ENV),
        _setting(pytestconfig, "signalbox_token", TOKEN_ENV),
    )
    client.listeners.append(state.listen)
    try:
        yield client
        directory = pytestconfig.getoption("signalbox_evidence")
        if directory:
            _write_evidence(client, signalbox_run_id, Path(directory), state)
    finally:
        client.close()


def _write_evidence(client: Signalbox, run_id: str, directory: Path, state: _State) -> None:
    try:
        evidence = client.evidence(run_id)
    except SignalboxError as exc:
        state.evidence_error = f"could not fetch evidence for run {run_id}: {exc.message}"
        return
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{run_id}.json"
    path.write_text(json.dumps(evidence.raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    state.evidence_path = path


@pytest.fixture
def signalbox(
    _signalbox_session: Signalbox,
    request: pytest.FixtureRequest,
    signalbox_run_id: str,
) -> Iterator[Signalbox]:
    """A Signalbox client; the test's signals go to its JUnit XML properties."""
    state = request.config.stash[_STATE]
    nodeid = request.node.nodeid

    def record_property(name: str, value: object) -> None:
        # What pytest's record_property fixture does, without its xunit2 warning: that
        # warning would fail every suite run with -W error under the default junit_family.
        request.node.user_properties.append((name, value))

    state.current = nodeid
    try:
        yield _signalbox_session
    finally:
        state.current = None
        ids = state.signals.get(nodeid, [])
        if ids:
            record_property("signalbox_run_id", signalbox_run_id)
            record_property("signalbox_signal_ids", ",".join(ids))
            reason = REASON_FAILED if _test_failed(request) else REASON_ENDED
            cancelled, cancel_error = _cancel_unended(_signalbox_session, ids, state, reason)
            if cancelled:
                record_property("signalbox_cancelled_ids", ",".join(cancelled))
            receipts, dead, error = _outcome_ids(
                _signalbox_session, [i for i in ids if i not in cancelled], state
            )
            error = error or cancel_error
            record_property("signalbox_receipt_ids", ",".join(receipts))
            hashes = [h for signal_id in ids for h in state.attachments.get(signal_id, [])]
            if hashes:
                record_property("signalbox_attachment_sha256", ",".join(hashes))
            if dead:
                record_property("signalbox_dead_letter_ids", ",".join(dead))
            if error:
                record_property("signalbox_evidence_error", error)


def attachment_hashes(receipt: Mapping[str, object]) -> list[str]:
    """The SHA-256 of each attachment a receipt's evidence pins (no content)."""
    evidence = receipt.get("evidence")
    items = evidence.get("attachments") if isinstance(evidence, Mapping) else None
    if not isinstance(items, list):
        return []
    return [
        str(i["sha256"])
        for i in items
        if isinstance(i, Mapping) and isinstance(i.get("sha256"), str)
    ]


def _cancel_unended(
    client: Signalbox, ids: list[str], state: _State, reason: str
) -> tuple[list[str], str | None]:
    """Cancel each of the test's signals that has not ended (no receipt or dead
    letter seen): the ids cancelled, and the first error (never raised: a
    clean-up must not fail the test; an unended signal then expires as before)."""
    cancelled: list[str] = []
    error: str | None = None
    for signal_id in ids:
        if signal_id in state.receipts or signal_id in state.dead_letters:
            continue
        try:
            signal = client.cancel(signal_id, reason)
        except NotCancellable:
            continue  # it ended otherwise (consumed, expired, absent, arrived)
        except SignalboxError as exc:
            error = error or f"{signal_id}: could not cancel: {exc.message}"
            if isinstance(exc, ServiceUnavailable):
                break  # the service is unreachable: do not wait on it once per signal
            continue
        if signal.result == "cancelled":
            cancelled.append(signal_id)
    return cancelled, error


def _outcome_ids(
    client: Signalbox, ids: list[str], state: _State
) -> tuple[list[str], list[str], str | None]:
    """The receipts and dead letters of the test's signals (looked up when the
    test itself did not see them), and the first lookup error."""
    receipts: list[str] = []
    dead: list[str] = []
    error: str | None = None
    for signal_id in ids:
        receipt_id = state.receipts.get(signal_id)
        dead_letter_id = state.dead_letters.get(signal_id)
        if receipt_id is None and dead_letter_id is None and error is None:
            try:
                signal = client.get_signal(signal_id)
            except SignalboxError as exc:
                # Evidence is a by-product: a lookup failure must not fail the test itself.
                error = f"{signal_id}: {exc.message}"
            else:
                receipt_id = signal.receipt.receipt_id if signal.receipt else None
                if signal.dead_letter is not None and signal.dead_letter.dead_letter_id:
                    dead_letter_id = signal.dead_letter.dead_letter_id
        if receipt_id:
            receipts.append(receipt_id)
        if dead_letter_id:
            dead.append(dead_letter_id)
    return receipts, dead, error


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """An expiry's dead letter is remembered for the JUnit properties, and a
    failed setup or call marks the test failed for the fixtures' teardown. (The
    client's own frames are left out of a Signalbox error's traceback by the
    ``__tracebackhide__`` of its modules, see :func:`signalbox.errors.hide_client_frames`.)"""
    excinfo = call.excinfo
    if excinfo is not None and isinstance(excinfo.value, SignalboxError):
        error = excinfo.value
        # Its message names the cause ("cannot reach Signalbox at URL:
        # ConnectError: …"): the chained httpx exception and its frames
        # would only bury that one line.
        error.__cause__ = None
        error.__suppress_context__ = True
        if isinstance(error, SignalExpired) and error.dead_letter and error.signal:
            state = item.config.stash.get(_STATE, None)
            if state is not None and error.dead_letter.dead_letter_id:
                state.dead_letters[error.signal.signal_id] = error.dead_letter.dead_letter_id
    report: pytest.TestReport = yield
    if report.when in ("setup", "call") and report.failed:
        item.stash[_FAILED] = True  # xfail and skips are not failures
    return report


@pytest.fixture
def signalbox_test_case(request: pytest.FixtureRequest) -> str:
    """The test's node id, as the signal's ``test_case``."""
    return make_test_case(request.node.nodeid)


def _marker_defaults(node: pytest.Item) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    # iter_markers yields the closest first; apply farthest first so the closest wins.
    for mark in reversed(list(node.iter_markers("signalbox"))):
        unknown = set(mark.kwargs) - MARKER_KEYS
        if unknown or mark.args:
            raise pytest.UsageError(
                f"@pytest.mark.signalbox takes keywords {sorted(MARKER_KEYS)}; got "
                f"{sorted(unknown) or list(mark.args)}"
            )
        defaults.update(mark.kwargs)
    return defaults


@pytest.fixture
def signalbox_watch(
    signalbox: Signalbox,
    signalbox_run_id: str,
    signalbox_test_case: str,
    request: pytest.FixtureRequest,
) -> Watch:
    """Create signals for this test: ``signalbox_watch(address, subject_contains=...)``."""
    attempt = int(getattr(request.node, "execution_count", 1) or 1)  # pytest-rerunfailures
    return Watch(
        signalbox, signalbox_run_id, signalbox_test_case, _marker_defaults(request.node), attempt
    )


@pytest.fixture
def signalbox_expect_none(signalbox_watch: Watch) -> Callable[..., SignalHandle]:
    """``signalbox_expect_none(address, ...)``: ``signalbox_watch.none``."""
    return signalbox_watch.none


@pytest.fixture
def signalbox_expect_exactly_one(signalbox_watch: Watch) -> Callable[..., SignalHandle]:
    """``signalbox_expect_exactly_one(address, settle_seconds=..., ...)``:
    ``signalbox_watch.exactly_one``."""
    return signalbox_watch.exactly_one


@pytest.fixture
def mailbox(
    signalbox: Signalbox, signalbox_run_id: str, request: pytest.FixtureRequest
) -> Iterator[Mailbox]:
    """A fresh address for this test alone (``@pytest.mark.signalbox(provider=...)``
    chooses the provider, default the sink), deleted after the test when it
    passed; a failed test's is kept (the evidence of its failure), its mail
    readable in the inbox and the console until it expires."""
    provider = _marker_defaults(request.node).get("provider") or "sink"
    box = signalbox.mailbox(signalbox_run_id, provider)
    try:
        yield box
    finally:
        if _test_failed(request):
            request.node.user_properties.append(("signalbox_mailbox_kept", box.address))
        else:
            try:
                signalbox.delete_mailbox(box.mailbox_id)
            except SignalboxError as exc:
                # The mailbox expires on its own; a failed clean-up must not fail the test.
                request.node.user_properties.append(("signalbox_mailbox_error", exc.message))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    if state.evidence_path is not None:
        terminalreporter.write_line(f"signalbox: evidence written to {state.evidence_path}")
    if state.evidence_error is not None:
        terminalreporter.write_line(f"signalbox: {state.evidence_error}", yellow=True)
