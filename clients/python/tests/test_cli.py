"""CLI parsing, output and exit codes (scripted API, no network)."""

from __future__ import annotations

import io
import json

import httpx
import pytest
from signalbox import Signal, cli
from signalbox.client import Signalbox
from signalbox_fakes import CLAIM, DEAD_LETTER, MAILBOX, RECEIPT, FakeApi, reply, signal_view

SIG = "/v1/signals/sig_1"


#: The url and token the CLI built its last client with.
SEEN: dict[str, object] = {}


def run(api: FakeApi, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()

    def factory(url: str | None, token: str | None) -> Signalbox:
        SEEN.clear()
        SEEN.update(url=url, token=token)
        return api.client()

    code = cli.main(list(argv), stdout=out, stderr=err, client_factory=factory)
    return code, out.getvalue(), err.getvalue()


def test_help_names_the_environment_fallbacks(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "$SIGNALBOX_URL" in text and "$SIGNALBOX_TOKEN" in text
    assert "3  service unreachable" in text


def test_subcommand_help_also_names_the_fallbacks(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["wait", "--help"]) == 0
    assert "$SIGNALBOX_TOKEN" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["watch", "--run-id", "r"],
        ["wait"],
        ["wait", "sig_1", "--timeout", "soon"],
        ["claim", "sig_1"],
        ["dlq"],
        ["dlq", "discard", "dlq_1"],
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run(FakeApi(), *argv)
    assert code == 2
    capsys.readouterr()


def test_global_options_work_before_or_after_the_command() -> None:
    api = FakeApi().on("GET", "/v1/runs/r1/evidence", reply(200, {"run_id": "r1", "signals": []}))
    run(api, "--url", "http://a.test", "evidence", "r1", "--token", "t2")
    assert SEEN == {"url": "http://a.test", "token": "t2"}
    run(api, "evidence", "r1")
    assert SEEN == {"url": None, "token": None}


def test_watch_maps_flags_to_the_api_body_and_prints_json() -> None:
    api = FakeApi().on("POST", "/v1/signals", reply(201, signal_view()))
    code, out, _ = run(
        api,
        "watch",
        "--run-id",
        "r1",
        "--test-case",
        "t1",
        "--recipient",
        "a@sink.test",
        "--subject-contains",
        "Verify",
        "--body-contains",
        "code",
        "--expires-in",
        "2",
        "--max-checks",
        "5",
        "--provider",
        "sink",
        "--require-run-marker",
        "--json",
    )
    assert code == 0
    assert json.loads(out)["signal_id"] == "sig_1"
    assert api.body(api.requests[0]) == {
        "run_id": "r1",
        "test_case": "t1",
        "recipient": "a@sink.test",
        "subject_contains": "Verify",
        "body_contains": "code",
        "expires_in_seconds": 2,
        "max_checks": 5,
        "provider": "sink",
        "require_run_marker": True,
    }


def test_mailbox_prints_a_table_by_default() -> None:
    api = FakeApi().on("POST", "/v1/mailboxes", reply(201, {**MAILBOX, "expires_at": None}))
    code, out, _ = run(api, "mailbox", "--run-id", "r1")
    assert code == 0
    assert "address     x@sink.test" in out


def test_wait_found_exits_0_and_prints_the_signal() -> None:
    api = FakeApi().on("GET", SIG, reply(200, signal_view("found")))
    code, out, err = run(api, "wait", "sig_1", "--timeout", "5")
    assert code == 0
    assert "found" in out
    assert err == ""  # StringIO is not a TTY: no spinner


def test_wait_expired_exits_1_with_the_diagnosis() -> None:
    api = FakeApi().on("GET", SIG, reply(200, signal_view("expired", dead_letter=DEAD_LETTER)))
    code, out, err = run(api, "wait", "sig_1", "--json")
    assert code == 1
    assert json.loads(out)["result"] == "expired"
    assert "deadline" in err and "before the window" in err


def test_wait_timeout_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(0, 10_000, 10))
    monkeypatch.setattr("signalbox._core.time.monotonic", lambda: float(next(ticks)))
    api = FakeApi().on("GET", SIG, reply(200, signal_view("waiting")))
    code, _, err = run(api, "wait", "sig_1", "--timeout", "5")
    assert code == 1
    assert "still waiting" in err


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (409, {"status": "already_claimed", "claim_id": "clm_1"}),
        (409, {"status": "already_consumed", "receipt": RECEIPT}),
        (409, {"error": {"code": "run_mismatch", "message": "not your run"}}),
        (410, {"status": "expired", "dead_letter": DEAD_LETTER}),
    ],
)
def test_refused_claims_exit_1_and_print_the_api_body(status: int, body: dict[str, object]) -> None:
    api = FakeApi().on("POST", f"{SIG}/claim", reply(status, body))
    code, out, _ = run(api, "claim", "sig_1", "--run-id", "r1", "--json")
    assert code == 1
    assert json.loads(out) == body


def test_claim_table_marks_untrusted_content() -> None:
    api = FakeApi().on("POST", f"{SIG}/claim", reply(200, CLAIM))
    code, out, _ = run(api, "claim", "sig_1", "--run-id", "r1", "--lease", "30")
    assert code == 0
    assert "untrusted email content" in out
    assert api.body(api.requests[0]) == {"run_id": "r1", "lease_seconds": 30}


def test_consume_after_lease_lapsed_exits_1() -> None:
    api = FakeApi().on(
        "POST",
        "/v1/claims/clm_1/consume",
        reply(409, {"error": {"code": "lease_expired", "message": "lease lapsed"}}),
    )
    code, _, err = run(api, "consume", "clm_1")
    assert code == 1 and "lease lapsed" in err


def test_consume_prints_the_receipt() -> None:
    api = FakeApi().on("POST", "/v1/claims/clm_1/consume", reply(200, RECEIPT))
    code, out, _ = run(api, "consume", "clm_1", "--json")
    assert code == 0 and json.loads(out)["receipt_id"] == "rcp_1"


def test_invalid_input_from_the_server_exits_2_naming_the_field() -> None:
    api = FakeApi().on(
        "POST",
        "/v1/signals",
        reply(
            422, {"error": {"code": "invalid", "message": "invalid email", "field": "recipient"}}
        ),
    )
    code, _, err = run(api, "watch", "--run-id", "r1", "--test-case", "t", "--recipient", "x")
    assert code == 2 and "recipient" in err


@pytest.mark.parametrize(
    "failure", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), reply(503)]
)
def test_unreachable_service_exits_3(failure: object) -> None:
    api = FakeApi().on("GET", "/v1/runs/r1/evidence", failure)  # type: ignore[arg-type]
    code, _, err = run(api, "evidence", "r1")
    assert code == 3
    assert err.startswith("signalbox: ")


def test_unauthorized_exits_1() -> None:
    api = FakeApi().on(
        "GET",
        "/v1/runs/r1/evidence",
        reply(401, {"error": {"code": "unauthorized", "message": "bad token"}}),
    )
    assert run(api, "evidence", "r1")[0] == 1


def test_dlq_commands_call_their_routes() -> None:
    api = (
        FakeApi()
        .on("GET", "/v1/dead-letters", reply(200, {"items": [DEAD_LETTER], "next_cursor": None}))
        .on("GET", "/v1/dead-letters/dlq_1", reply(200, DEAD_LETTER))
        .on("POST", "/v1/dead-letters/dlq_1/redrive", reply(200, signal_view()))
        .on(
            "POST",
            "/v1/dead-letters/dlq_1/discard",
            reply(200, {**DEAD_LETTER, "state": "discarded"}),
        )
    )
    code, out, _ = run(api, "dlq", "list", "--state", "open", "--reason", "deadline")
    assert code == 0 and "dlq_1" in out and "DEAD_LETTER_ID" in out
    assert dict(api.requests[-1].url.params) == {"state": "open", "reason": "deadline"}
    code, out, _ = run(api, "dlq", "show", "dlq_1")
    assert code == 0 and "recommendation" in out
    code, out, _ = run(
        api, "dlq", "redrive", "dlq_1", "--expires-in", "60", "--max-checks", "3", "--json"
    )
    assert code == 0 and json.loads(out)["result"] == "waiting"
    assert api.body(api.requests[-1]) == {"expires_in_seconds": 60, "max_checks": 3}
    code, out, _ = run(api, "dlq", "discard", "dlq_1", "--note", "known flake")
    assert code == 0 and api.body(api.requests[-1]) == {"note": "known flake"}


def test_spinner_draws_only_on_a_tty() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    quiet, loud = io.StringIO(), Tty()
    with cli.Spinner("waiting", quiet):
        pass
    with cli.Spinner("waiting", loud) as spinner:
        spinner.update(Signal.from_api(signal_view()))
    assert quiet.getvalue() == ""
    assert "waiting" in loud.getvalue()


def test_exit_code_mapping_covers_the_error_tree() -> None:
    from signalbox import errors

    assert cli.exit_code_for(errors.ServiceUnavailable()) == 3
    assert cli.exit_code_for(errors.InvalidRequest()) == 2
    for exc in (
        errors.SignalExpired(),
        errors.AlreadyClaimed(),
        errors.LeaseExpired(),
        errors.WaitTimeout(),
        errors.NotFound(),
        errors.SignalNotReady(),
    ):
        assert cli.exit_code_for(exc) == 1


def test_watch_expect_and_settle_and_claim_owner_reach_the_api() -> None:
    api = (
        FakeApi()
        .on("POST", "/v1/signals", reply(201, signal_view()))
        .on("POST", f"{SIG}/claim", reply(200, {**CLAIM, "owner": "pod-7"}))
    )
    args = ["--run-id", "r1", "--test-case", "t1", "--recipient", "a@sink.test"]
    code, _, _ = run(api, "watch", *args, "--expect", "exactly_one", "--settle", "9")
    assert code == 0
    body = api.body(api.requests[0])
    assert (body["expect"], body["settle_seconds"]) == ("exactly_one", 9)
    code, out, _ = run(api, "claim", "sig_1", "--run-id", "r1", "--owner", "pod-7")
    assert code == 0 and "pod-7" in out
    assert api.body(api.requests[1])["owner"] == "pod-7"


def test_watch_without_expect_sends_none_of_the_new_fields() -> None:
    api = FakeApi().on("POST", "/v1/signals", reply(201, signal_view()))
    run(api, "watch", "--run-id", "r1", "--test-case", "t1", "--recipient", "a@sink.test")
    assert not {"expect", "settle_seconds"} & set(api.body(api.requests[0]))


def test_an_unknown_expect_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--run-id", "r", "--test-case", "t", "--recipient", "a@x.test", "--expect", "two"]
    code, _, _ = run(FakeApi(), "watch", *args)
    assert code == 2


def test_wait_for_an_arrived_signal_exits_1_with_the_recommendation() -> None:
    view = {**signal_view("arrived"), "expect": "none", "recommendation": "A matching message …"}
    api = FakeApi().on("GET", SIG, reply(200, view))
    code, _, err = run(api, "wait", "sig_1", "--timeout", "5")
    assert code == 1 and "A matching message" in err
