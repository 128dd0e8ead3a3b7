"""The whole message in the client (scripted API, no network): claim.message()
and its async twin, attachments read and checked, saved under safe names,
ids checked before any request, 410 as ClaimEnded, the CLI commands and the
MCP tool (wrapped as untrusted content, never bytes)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from signalbox import InvalidId, cli, message_cli
from signalbox.message import AsyncAttachment, Attachment, ClaimEnded, safe_filename
from signalbox_fakes import CLAIM, RECEIPT, FakeApi, reply, signal_view
from test_mcp import call as mcp_call

PDF = b"%PDF-1.4 fake"
PNG = b"\x89PNG fake"
ATT_PDF = "att_" + "a" * 24
ATT_PNG = "att_" + "b" * 24
CLAIM_ID = CLAIM["claim_id"]
BASE = f"/v1/claims/{CLAIM_ID}"


def message_body(pdf_name: str = "invoice.pdf") -> dict[str, Any]:
    return {
        "message_id": "msg_1",
        "from": {"name": "Brand", "address": "noreply@brand.test"},
        "to": [{"name": "", "address": "a@sink.test"}],
        "cc": [],
        "reply_to": [],
        "subject": "Your invoice",
        "date": "2030-01-01T00:00:00.000Z",
        "received_at": "2030-01-01T00:00:07.000Z",
        "headers": [["From", "Brand <noreply@brand.test>"], ["List-Unsubscribe", "<https://u>"]],
        "text": "Your code is 493817",
        "html": "<p>Hi</p>",
        "links": [{"url": "https://brand.test/pay", "text": "Pay"}],
        "codes": ["493817"],
        "attachments": [
            {"attachment_id": ATT_PNG, "filename": None, "content_type": "image/png",
             "size": len(PNG), "sha256": hashlib.sha256(PNG).hexdigest(), "inline": True,
             "content_id": "logo"},
            {"attachment_id": ATT_PDF, "filename": pdf_name, "content_type": "application/pdf",
             "size": len(PDF), "sha256": hashlib.sha256(PDF).hexdigest(), "inline": False,
             "content_id": None},
        ],
        "size": 1234,
        "sha256": "f" * 64,
    }  # fmt: skip


def bytes_reply(data: bytes) -> Any:
    import httpx

    return httpx.Response(200, content=data, headers={"Content-Type": "application/pdf"})


def scripted(pdf: bytes = PDF, pdf_name: str = "invoice.pdf") -> FakeApi:
    return (
        FakeApi()
        .on("GET", "/v1/signals/sig_1", reply(200, signal_view("found")))
        .on("POST", "/v1/signals/sig_1/claim", reply(200, CLAIM))
        .on("POST", f"{BASE}/consume", reply(200, RECEIPT))
        .on("GET", f"{BASE}/message", reply(200, message_body(pdf_name)))
        .on("GET", f"{BASE}/attachments/{ATT_PDF}", bytes_reply(pdf))
        .on("GET", f"{BASE}/attachments/{ATT_PNG}", bytes_reply(PNG))
        .on("GET", f"{BASE}/raw", bytes_reply(b"From: x\r\n\r\nraw"))
    )


def test_claim_message_gives_text_html_headers_and_attachments(tmp_path: Path) -> None:
    api = scripted()
    with api.client().signal("sig_1").claim() as claim:
        m = claim.message()
        assert m.text == "Your code is 493817" and m.html == "<p>Hi</p>"
        assert m.header("list-unsubscribe") == "<https://u>"
        assert m.from_ is not None and m.from_.address == "noreply@brand.test"
        assert m.links[0].text == "Pay" and m.codes == ("493817",)
        pdf = m.attachment("invoice.pdf")
        assert isinstance(pdf, Attachment)
        assert pdf.sha256 == hashlib.sha256(PDF).hexdigest()
        assert pdf.read() == PDF
        saved = pdf.save(tmp_path)
        assert saved == tmp_path / "invoice.pdf" and saved.read_bytes() == PDF
        assert pdf.save(tmp_path / "other.bin").read_bytes() == PDF
    assert api.calls("POST", f"{BASE}/consume")


def test_an_attachment_that_arrives_altered_is_refused() -> None:
    api = scripted(pdf=b"%PDF tampered")
    m = api.client().message(CLAIM_ID)
    pdf = m.attachment("invoice.pdf")
    assert pdf is not None
    with pytest.raises(Exception, match="altered") as info:
        pdf.read()
    assert getattr(info.value, "code", None) == "checksum_mismatch"


def test_a_hostile_file_name_is_saved_inside_the_directory(tmp_path: Path) -> None:
    api = scripted(pdf_name="../../etc/passwd")
    m = api.client().message(CLAIM_ID)
    target = tmp_path / "out"
    target.mkdir()
    pdf = m.attachments[1]
    assert isinstance(pdf, Attachment)
    saved = pdf.save(target)
    assert saved.parent == target and saved.name == "passwd"
    assert safe_filename("..", "fallback") == "fallback"
    assert safe_filename("a\x00b:c", "x") == "a_b_c"
    assert safe_filename("C:\\Users\\me\\.bashrc", "x") == "bashrc"


@pytest.mark.parametrize(
    "claim_id, attachment_id",
    [("../v1/x", ATT_PDF), ("clm_1/../..", ATT_PDF), (CLAIM_ID, "../raw"), (CLAIM_ID, "att_XYZ")],
)
def test_ids_are_checked_before_any_request(claim_id: str, attachment_id: str) -> None:
    api = FakeApi()
    with pytest.raises(InvalidId):
        api.client().attachment(claim_id, attachment_id)
    assert api.requests == []


def test_an_ended_claim_raises_claim_ended_with_its_receipt() -> None:
    ended = {"status": "consumed", "claim_id": CLAIM_ID, "receipt": RECEIPT}
    api = FakeApi().on("GET", f"{BASE}/message", reply(410, ended))
    with pytest.raises(ClaimEnded) as info:
        api.client().message(CLAIM_ID)
    assert info.value.state == "consumed"
    assert info.value.receipt is not None and info.value.receipt.receipt_id == "rcp_1"


def test_the_async_twin_reads_the_same_message() -> None:
    api = scripted()

    async def go() -> tuple[str, bytes, bytes]:
        sb = api.aclient()
        try:
            handle = await sb.signal("sig_1")
            async with handle.claim() as claim:
                m = await claim.message()
                pdf = m.attachment("invoice.pdf")
                assert isinstance(pdf, AsyncAttachment)
                return m.text, await pdf.read(), await sb.raw_message(CLAIM_ID)
        finally:
            await sb.aclose()

    text, pdf, raw = asyncio.run(go())
    assert text == "Your code is 493817" and pdf == PDF and raw.endswith(b"raw")


def run_cli(api: FakeApi, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), stdout=out, stderr=err, client_factory=lambda u, t: api.client())
    return code, out.getvalue(), err.getvalue()


def test_cli_message_prints_headers_text_and_attachments(tmp_path: Path) -> None:
    code, out, _ = run_cli(scripted(), "message", CLAIM_ID, "--save-attachments", str(tmp_path))
    assert code == 0
    assert "untrusted email content" in out and "List-Unsubscribe" in out
    assert "Your code is 493817" in out and "invoice.pdf" in out
    assert (tmp_path / "invoice.pdf").read_bytes() == PDF
    assert (tmp_path / ATT_PNG).read_bytes() == PNG  # no name: saved under its id


def test_cli_claim_save_attachments_writes_every_attachment(tmp_path: Path) -> None:
    where = tmp_path / "new-dir"
    code, out, _ = run_cli(
        scripted(),
        "claim",
        "sig_1",
        "--run-id",
        "run-1",
        "--save-attachments",
        str(where),
        "--json",
    )
    assert code == 0
    body = json.loads(out)
    assert body["claim_id"] == CLAIM_ID
    assert sorted(Path(p).name for p in body["saved_attachments"]) == sorted(
        ["invoice.pdf", ATT_PNG]
    )
    assert (where / "invoice.pdf").read_bytes() == PDF


def test_cli_message_of_a_malformed_claim_id_is_a_usage_error() -> None:
    code, _, err = run_cli(FakeApi(), "message", "../etc")
    assert code == 2 and "claim id" in err


def test_save_attachments_names_repeats_apart(tmp_path: Path) -> None:
    body = message_body()
    body["attachments"][0]["filename"] = "invoice.pdf"
    api = scripted().on("GET", f"{BASE}/message", reply(200, body))
    api.routes[("GET", f"{BASE}/message")] = [reply(200, body)]
    saved = message_cli.save_attachments(api.client().message(CLAIM_ID), tmp_path)
    assert [p.name for p in saved] == ["invoice.pdf", "2-invoice.pdf"]


def test_mcp_get_message_wraps_every_email_text_and_never_carries_bytes() -> None:
    out = mcp_call(scripted(), "get_message", {"claim_id": CLAIM_ID})
    content = out["untrusted_email_content"]
    begin, end = content["begin"], content["end"]
    assert content["text"] == f"{begin}Your code is 493817{end}"
    assert content["headers"][0] == [f"{begin}From{end}", f"{begin}Brand <noreply@brand.test>{end}"]
    assert content["attachments"][1] == {
        "filename": f"{begin}invoice.pdf{end}",
        "content_type": f"{begin}application/pdf{end}",
        "size": len(PDF),
    }
    assert "PDF-1.4" not in json.dumps(out)  # names and sizes, never content


def test_the_plugin_keeps_the_attachment_hashes_a_receipt_pins() -> None:
    from signalbox.models import Receipt
    from signalbox.pytest_plugin import _State, attachment_hashes

    pinned = {**RECEIPT, "evidence": {**RECEIPT["evidence"], "message_sha256": "e" * 64,
              "attachments": [{"filename": "invoice.pdf", "content_type": "application/pdf",
                               "size": 3, "sha256": "a" * 64}]}}  # fmt: skip
    assert attachment_hashes(pinned) == ["a" * 64]
    assert attachment_hashes(RECEIPT) == []
    state = _State()
    state.listen("receipt", Receipt.from_api(pinned))
    assert state.attachments == {"sig_1": ["a" * 64]}
