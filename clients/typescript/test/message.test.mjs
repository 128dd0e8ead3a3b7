// The whole message of a claim (GET /v1/claims/{id}/message, its attachments
// and raw bytes). Skipped, saying so, while the server lacks those routes.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, it } from "node:test";

import { Signalbox } from "../dist/index.js";
import { hasRoute, runId, sendMail } from "./helpers.mjs";

const routes = {
  message: await hasRoute("GET", "/v1/claims/{claim_id}/message"),
  attachment: await hasRoute("GET", "/v1/claims/{claim_id}/attachments/{attachment_id}"),
  raw: await hasRoute("GET", "/v1/claims/{claim_id}/raw"),
};
const skip = routes.message ? false : "GET /v1/claims/{claim_id}/message is not on this server yet";

const BOUNDARY = "sbx-boundary-1";
const PDF = Buffer.from("%PDF-1.4\nhello attachment\n");

function multipart(to, run) {
  return [
    "From: Shop <shop@example.test>",
    `To: ${to}`,
    "Reply-To: help@example.test",
    "Subject: Your invoice",
    `X-Signalbox-Run: ${run}`,
    "MIME-Version: 1.0",
    `Content-Type: multipart/mixed; boundary="${BOUNDARY}"`,
    "",
    `--${BOUNDARY}`,
    "Content-Type: text/plain; charset=utf-8",
    "",
    "Your invoice is attached. Pay at https://shop.example.test/pay?i=7 with code 771133",
    `--${BOUNDARY}`,
    "Content-Type: text/html; charset=utf-8",
    "",
    '<p>Your invoice is attached. <a href="https://shop.example.test/pay?i=7">Pay now</a></p>',
    `--${BOUNDARY}`,
    'Content-Type: application/pdf; name="invoice.pdf"',
    'Content-Disposition: attachment; filename="invoice.pdf"',
    "Content-Transfer-Encoding: base64",
    "",
    PDF.toString("base64"),
    `--${BOUNDARY}--`,
    "",
  ].join("\r\n");
}

/** Send the invoice to a fresh mailbox of a new run, then claim it and read it whole. */
async function claimedInvoice(name, testCase) {
  const run = runId(name);
  const sb = new Signalbox({ runId: run, testCase });
  const box = await sb.mailbox();
  const handle = await sb.watch({ recipient: box.address, subjectContains: "invoice" });
  await sendMail({ to: box.address, raw: multipart(box.address, run) });
  await handle.wait();
  const claim = await handle.claim();
  return { run, box, claim, message: await claim.message() };
}

describe("claim.message()", { skip }, () => {
  it("gives the headers, text, HTML, links, codes and attachments of the claimed message", async () => {
    const { run, box, claim, message } = await claimedInvoice("message", "invoice");
    assert.equal(message.message_id, claim.messageId);
    assert.equal(message.subject, "Your invoice");
    assert.deepEqual(message.to.map((a) => a.address), [box.address]);
    assert.deepEqual(message.from, { name: "Shop", address: "shop@example.test" });
    assert.deepEqual(message.reply_to.map((a) => a.address), ["help@example.test"]);
    assert.match(message.text, /Your invoice is attached/);
    assert.match(message.html, /Pay now/);
    assert.ok(message.headers.some(([name, value]) => name.toLowerCase() === "x-signalbox-run" && value === run));
    assert.ok(message.links.some((l) => l.url === "https://shop.example.test/pay?i=7"), JSON.stringify(message.links));
    assert.ok(message.codes.includes("771133"));
    assert.equal(message.attachments.length, 1);
    const [pdf] = message.attachments;
    assert.equal(pdf.filename, "invoice.pdf");
    assert.equal(pdf.content_type, "application/pdf");
    assert.equal(pdf.size, PDF.length);
    assert.equal(pdf.sha256, createHash("sha256").update(PDF).digest("hex"));
    if (routes.attachment) {
      assert.deepEqual(Buffer.from(await claim.attachment(pdf.attachment_id)), PDF);
    }
    if (routes.raw) {
      const raw = Buffer.from(await claim.rawBytes());
      assert.equal(createHash("sha256").update(raw).digest("hex"), message.sha256);
      assert.match(raw.toString(), /Subject: Your invoice/);
    }
    const receipt = await claim.consume();
    assert.equal(receipt.evidence.message_sha256, message.sha256);
    // After the claim ended: 410, as for GET /v1/claims/{id}.
    await assert.rejects(claim.message(), (e) => e.status === 410);
  });
});

describe("message.header() and message.attachment()", { skip }, () => {
  it("find a header case-insensitively and an attachment by file name, whose read() checks its sha256", async () => {
    const { run, claim, message } = await claimedInvoice("message-find", "invoice-find");
    assert.equal(message.header("x-SIGNALBOX-run"), run);
    assert.equal(message.header("Reply-To"), "help@example.test");
    assert.deepEqual(message.headerValues("subject"), ["Your invoice"]);
    assert.equal(message.header("X-Not-There"), null);
    const pdf = message.attachment("invoice.pdf");
    assert.ok(pdf, JSON.stringify(message.attachments));
    assert.equal(pdf.content_type, "application/pdf");
    assert.equal(message.attachment("other.pdf"), null);
    if (routes.attachment) assert.deepEqual(Buffer.from(await pdf.read()), PDF);
    // The view's fields survive JSON as before.
    assert.equal(JSON.parse(JSON.stringify(message)).attachments[0].filename, "invoice.pdf");
    await claim.consume();
  });
});
