"""The pytest plugin, driven through pytester.

The recording test points the inner session at a small fake of the HTTP API
served from a thread: the plugin's real client makes real HTTP calls to it.
"""

from __future__ import annotations

import json
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from signalbox.pytest_plugin import TEST_CASE_MAX, make_test_case
from signalbox_fakes import CLAIM, DEAD_LETTER, MAILBOX, RECEIPT, signal_view


class FakeApiServer:
    def __init__(self) -> None:  # noqa: C901 - the fake API's routes, one branch each
        self.created: list[tuple[dict[str, Any], str | None]] = []
        self.expiring: set[str] = set()  # signals created for an "expire…" recipient
        self.deleted: list[str] = []
        self.cancelled: list[tuple[str, str]] = []  # (signal_id, reason)
        self.evidence_doc = {
            "run_id": "run-7",
            "signals": [{"signal_id": "sig_1", "receipt": RECEIPT}],
        }
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                if self.path == "/v1/signals":
                    outer.created.append((body, self.headers.get("Idempotency-Key")))
                    n = len(outer.created)
                    if body["recipient"].startswith("expire"):
                        outer.expiring.add(f"sig_{n}")
                    self._send(201, signal_view(signal_id=f"sig_{n}", run_id=body["run_id"]))
                elif self.path == "/v1/mailboxes":
                    self._send(201, {**MAILBOX, "address": f"box+{body['run_id']}@sink.test"})
                elif self.path.endswith("/claim"):
                    self._send(200, CLAIM)
                elif self.path.endswith("/consume"):
                    self._send(200, RECEIPT)
                elif self.path.endswith("/cancel"):
                    signal_id = self.path.split("/")[-2]
                    if signal_id in outer.expiring:
                        error = {"code": "not_cancellable", "message": "expired"}
                        self._send(409, {"error": error})
                        return
                    outer.cancelled.append((signal_id, body["reason"]))
                    cancellation = {
                        "reason": body["reason"],
                        "cancelled_at": "2030-01-01T00:01:00Z",
                    }
                    view = signal_view("cancelled", signal_id=signal_id, cancellation=cancellation)
                    self._send(200, view)
                else:
                    self._send(404, {"error": {"code": "not_found", "message": self.path}})

            def do_DELETE(self) -> None:
                outer.deleted.append(self.path)
                self.send_response(204)
                self.end_headers()

            def do_GET(self) -> None:
                if self.path.startswith("/v1/signals/"):
                    signal_id = self.path.split("?")[0].rsplit("/", 1)[-1]
                    if signal_id in outer.expiring:
                        dead = {**DEAD_LETTER, "signal_id": signal_id}
                        self._send(
                            200, signal_view("expired", signal_id=signal_id, dead_letter=dead)
                        )
                    else:
                        self._send(200, signal_view(signal_id=signal_id))
                elif self.path == "/v1/runs/run-7/evidence":
                    self._send(200, outer.evidence_doc)
                else:
                    self._send(404, {"error": {"code": "not_found", "message": self.path}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def test_plugin_is_inert_when_its_fixtures_are_unused(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import socket

        def _no_network(*args, **kwargs):
            raise AssertionError("the signalbox plugin touched the network")

        socket.socket.connect = _no_network
        socket.create_connection = _no_network
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.signalbox(provider="sink")
        def test_plain():
            assert True
        """
    )
    result = pytester.runpytest_subprocess(
        "--strict-markers",
        "-W",
        "error",
        "--signalbox-evidence",
        "evidence",
        "--signalbox-url",
        "http://127.0.0.1:9",
    )
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "evidence").exists()
    result.stdout.no_fnmatch_line("*signalbox:*")


def test_fixtures_record_signals_in_junit_and_write_the_evidence_artifact(
    pytester: pytest.Pytester, fake_api: FakeApiServer
) -> None:
    pytester.makepyfile(
        test_signup="""
        import pytest

        @pytest.mark.signalbox(provider="sink", expires_in_seconds=30)
        def test_two_emails(signalbox_watch, signalbox_run_id, signalbox_test_case):
            assert signalbox_run_id == "run-7"
            assert signalbox_test_case == "test_signup.py::test_two_emails"
            first = signalbox_watch("a@sink.test", subject_contains="Verify")
            signalbox_watch("b@sink.test", expires_in_seconds=5)
            with first.claim() as claim:
                assert claim.links

        def test_without_signalbox():
            pass
        """
    )
    result = pytester.runpytest(
        "--signalbox-url",
        fake_api.url,
        "--signalbox-token",
        "tok",
        "--signalbox-run-id",
        "run-7",
        "--signalbox-evidence",
        "ev",
        "--junitxml",
        "out.xml",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=2)

    (first, key1), (second, key2) = fake_api.created
    assert first == {
        "run_id": "run-7",
        "test_case": "test_signup.py::test_two_emails",
        "recipient": "a@sink.test",
        "subject_contains": "Verify",
        "expires_in_seconds": 30,
        "provider": "sink",
    }
    assert key1 is None
    assert second["expires_in_seconds"] == 5
    assert key2 == "run-7:test_signup.py::test_two_emails#2"

    cases = {c.get("name"): c for c in ET.parse(pytester.path / "out.xml").iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["test_two_emails"].iter("property")}
    assert props["signalbox_run_id"] == "run-7"
    assert props["signalbox_signal_ids"] == "sig_1,sig_2"
    assert props["signalbox_receipt_ids"] == "rcp_1"
    # The consumed one is left alone; the one the passed test never waited for is cancelled.
    assert fake_api.cancelled == [("sig_2", "test_ended")]
    assert props["signalbox_cancelled_ids"] == "sig_2"
    assert "signalbox_evidence_error" not in props
    assert not list(cases["test_without_signalbox"].iter("property"))

    artifact = pytester.path / "ev" / "run-7.json"
    assert json.loads(artifact.read_text()) == fake_api.evidence_doc
    result.stdout.fnmatch_lines(["*signalbox: evidence written to*run-7.json*"])


def test_run_id_comes_from_the_environment_or_a_fresh_uuid(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        """
        import os

        def test_run_id(signalbox_run_id):
            expected = os.environ.get("EXPECTED_RUN_ID")
            if expected:
                assert signalbox_run_id == expected
            else:
                assert signalbox_run_id.startswith("pytest-") and len(signalbox_run_id) == 43
        """
    )
    monkeypatch.delenv("SIGNALBOX_RUN_ID", raising=False)
    pytester.runpytest().assert_outcomes(passed=1)
    monkeypatch.setenv("SIGNALBOX_RUN_ID", "ci-99")
    monkeypatch.setenv("EXPECTED_RUN_ID", "ci-99")
    pytester.runpytest().assert_outcomes(passed=1)


def test_unknown_marker_keywords_are_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.signalbox(provder="sink")
        def test_typo(signalbox_watch):
            pass
        """
    )
    result = pytester.runpytest("--signalbox-url", "http://127.0.0.1:9")
    result.stdout.fnmatch_lines(["*provder*"])
    assert result.ret != 0


def test_long_node_ids_are_cut_to_the_api_limit_and_stay_distinct() -> None:
    a = make_test_case("t.py::test_x[" + "a" * 300 + "]")
    b = make_test_case("t.py::test_x[" + "a" * 299 + "b]")
    assert len(a) == len(b) == TEST_CASE_MAX and a != b
    assert make_test_case("t.py::test_short") == "t.py::test_short"


def test_none_and_exactly_one_helpers_send_their_expectation(
    pytester: pytest.Pytester, fake_api: FakeApiServer
) -> None:
    pytester.makepyfile(
        test_quiet="""
        def test_quiet(signalbox_watch, signalbox_expect_none, signalbox_expect_exactly_one):
            signalbox_expect_none("a@sink.test", subject_contains="Newsletter")
            signalbox_expect_exactly_one("b@sink.test", settle_seconds=3)
            signalbox_watch.none("c@sink.test")
            signalbox_watch.exactly_one("d@sink.test")
        """
    )
    result = pytester.runpytest(
        "--signalbox-url", fake_api.url, "--signalbox-token", "tok", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=1)
    sent = [(b["recipient"], b.get("expect"), b.get("settle_seconds")) for b, _ in fake_api.created]
    assert sent == [
        ("a@sink.test", "none", None),
        ("b@sink.test", "exactly_one", 3),
        ("c@sink.test", "none", None),
        ("d@sink.test", "exactly_one", None),
    ]


def test_an_expiry_fails_with_the_exception_not_the_clients_source_and_junit_names_the_dead_letter(
    pytester: pytest.Pytester, fake_api: FakeApiServer
) -> None:
    pytester.makepyfile(
        test_signup="""
        def test_expired(signalbox_watch):
            signalbox_watch("expire@sink.test", subject_contains="Verify").wait()
        """
    )
    result = pytester.runpytest(
        "--signalbox-url", fake_api.url, "--junitxml", "out.xml", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    # The test's line and the exception, not the client's frames.
    assert "_core.py" not in out and "client.py" not in out and "def _wait" not in out
    failures = out.split("= FAILURES =")[1].split("short test summary")[0]
    assert len(failures.strip().splitlines()) < 15, failures
    result.stdout.fnmatch_lines(["FAILED test_signup.py::test_expired - signalbox.SignalExpired*"])
    assert fake_api.cancelled == []  # it ended (expired): nothing to cancel
    case = next(ET.parse(pytester.path / "out.xml").iter("testcase"))
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["signalbox_dead_letter_ids"] == "dlq_1"
    assert props["signalbox_signal_ids"] == "sig_1"


def test_the_mailbox_fixture_gives_each_test_a_fresh_address_and_deletes_it(
    pytester: pytest.Pytester, fake_api: FakeApiServer
) -> None:
    pytester.makepyfile(
        """
        def test_one(mailbox, signalbox_run_id):
            assert mailbox.address == f"box+{signalbox_run_id}@sink.test"
            assert mailbox.mailbox_id == "mbx_1"
        """
    )
    result = pytester.runpytest("--signalbox-url", fake_api.url, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert fake_api.deleted == ["/v1/mailboxes/mbx_1"]


XDIST_TESTS = """
    import pytest

    @pytest.mark.parametrize("n", range(6))
    def test_record(signalbox_run_id, n):
        import os, pathlib
        out = pathlib.Path(os.environ["RUN_IDS_DIR"])
        out.mkdir(exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (out / f"{worker}-{n}").write_text(signalbox_run_id)
"""


def _run_ids(pytester: pytest.Pytester, *args: str) -> tuple[set[str], set[str]]:
    out = pytester.path / f"ids-{len(args)}"
    pytester.makepyfile(test_xdist=XDIST_TESTS)
    import os

    os.environ["RUN_IDS_DIR"] = str(out)
    try:
        result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", *args)
    finally:
        del os.environ["RUN_IDS_DIR"]
    result.assert_outcomes(passed=6)
    files = list(out.iterdir())
    return {f.read_text() for f in files}, {f.name.split("-")[0] for f in files}


def test_xdist_workers_share_one_run_id(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("xdist")
    monkeypatch.delenv("SIGNALBOX_RUN_ID", raising=False)
    ids, workers = _run_ids(pytester)
    assert len(workers) == 2, workers  # the tests did run on two workers
    assert len(ids) == 1 and next(iter(ids)).startswith("pytest-")
    given, _ = _run_ids(pytester, "--signalbox-run-id", "ci-4711")
    assert given == {"ci-4711"}


def test_a_failed_test_keeps_its_mailbox_and_cancels_its_signals_a_passed_one_deletes_it(
    pytester: pytest.Pytester, fake_api: FakeApiServer
) -> None:
    pytester.makepyfile(
        test_signup="""
        import pytest

        def test_broken(mailbox, signalbox_watch):
            signalbox_watch(mailbox.address, subject_contains="Verify")
            assert False, "the page never showed the form"

        def test_fine(mailbox, signalbox_watch):
            signalbox_watch(mailbox.address, subject_contains="Welcome")

        @pytest.mark.xfail(reason="known", strict=True)
        def test_known(mailbox, signalbox_watch):
            signalbox_watch(mailbox.address)
            assert False
        """
    )
    result = pytester.runpytest(
        "--signalbox-url", fake_api.url, "--junitxml", "out.xml", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(failed=1, passed=1, xfailed=1)
    assert fake_api.cancelled == [
        ("sig_1", "test_failed"),
        ("sig_2", "test_ended"),
        ("sig_3", "test_ended"),
    ]
    # Only the passed and the expected-to-fail tests' mailboxes are deleted.
    assert len(fake_api.deleted) == 2
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "out.xml").iter("testcase")}
    broken = {p.get("name"): p.get("value") for p in cases["test_broken"].iter("property")}
    assert broken["signalbox_mailbox_kept"].endswith("@sink.test")
    assert broken["signalbox_cancelled_ids"] == "sig_1"


def test_an_unreachable_service_fails_with_one_clear_line_and_no_httpx_frames(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_signup="""
        def test_watch(signalbox_watch):
            signalbox_watch("a@sink.test", subject_contains="Verify").wait()

        def test_mailbox(mailbox):
            pass
        """
    )
    result = pytester.runpytest_subprocess(
        "--signalbox-url", "http://127.0.0.1:9", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(failed=1, errors=1)
    out = result.stdout.str()
    reports = out.split("= ERRORS =")[1].split("short test summary")[0]
    assert "httpx" not in reports and "pytest_plugin.py" not in reports, reports
    assert "The above exception was the direct cause" not in reports
    assert len(reports.strip().splitlines()) < 30, reports
    result.stdout.fnmatch_lines(
        ["E   *signalbox.ServiceUnavailable: cannot reach Signalbox at http://127.0.0.1:9*"]
    )


def test_a_rerun_of_a_failed_test_watches_under_keys_of_its_own() -> None:
    from signalbox.pytest_plugin import Watch

    sent: list[dict[str, Any]] = []

    class Client:
        def watch(self, run_id: str, test_case: str, recipient: str, **options: Any) -> None:
            sent.append(options)

    first = Watch(Client(), "run-7", "t.py::test_a", {})  # type: ignore[arg-type]
    first("a@sink.test")
    first("b@sink.test")
    rerun = Watch(Client(), "run-7", "t.py::test_a", {}, attempt=2)  # type: ignore[arg-type]
    rerun("a@sink.test")
    rerun("b@sink.test")
    assert [o.get("idempotency_key") for o in sent] == [
        None,
        "run-7:t.py::test_a#2",
        "run-7:t.py::test_a@rerun2",
        "run-7:t.py::test_a#2@rerun2",
    ]
