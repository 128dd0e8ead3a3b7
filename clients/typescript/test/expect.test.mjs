// Assertions on mail: expectNone and expectExactlyOne (POST /v1/signals with
// `expect`). Skipped, saying so, while the server's SignalCreate lacks `expect`.
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { NotClaimable, Signalbox, SignalExpired, UnexpectedMessage } from "../dist/index.js";
import { hasField, runId, sendMail } from "./helpers.mjs";

const skip = (await hasField("SignalCreate", "expect")) ? false : "SignalCreate has no `expect` on this server yet";

function client(name) {
  return new Signalbox({ runId: runId(name), testCase: name });
}

describe("expectNone", { skip, concurrency: true }, () => {
  it("resolves with the absent view when no matching email came before the deadline", async () => {
    const sb = client("none-absent");
    const box = await sb.mailbox();
    const none = await sb.expectNone({ recipient: box.address, subjectContains: "Password changed", expiresInSeconds: 2 });
    await sendMail({ to: box.address, subject: "Weekly digest", text: "not the one" });
    const view = await none.wait();
    assert.equal(view.status, "absent");
    assert.equal(view.result, "absent");
    await assert.rejects(none.claim(), NotClaimable);
  });

  it("rejects with UnexpectedMessage as soon as a matching email arrives", async () => {
    const sb = client("none-arrived");
    const box = await sb.mailbox();
    const none = await sb.expectNone({ recipient: box.address, subjectContains: "Password changed", expiresInSeconds: 120 });
    await sendMail({ to: box.address, subject: "Password changed", text: "someone changed it" });
    const error = await none.wait({ timeoutSeconds: 60 }).catch((e) => e);
    assert.ok(error instanceof UnexpectedMessage, String(error));
    assert.equal(error.view.result, "arrived");
    assert.equal(error.arrived.subject, "Password changed");
  });
});

describe("expectExactlyOne", { skip, concurrency: true }, () => {
  it("resolves once one email came and no second within settleSeconds", async () => {
    const sb = client("one-found");
    const box = await sb.mailbox();
    const one = await sb.expectExactlyOne({ recipient: box.address, subjectContains: "Receipt", settleSeconds: 1, expiresInSeconds: 60 });
    await sendMail({ to: box.address, subject: "Receipt #1", text: "thanks" });
    const view = await one.wait();
    assert.equal(view.result, "found");
    const claim = await one.claim();
    await claim.consume();
  });

  it("rejects with SignalExpired (duplicate_messages) when a second one came", async () => {
    const sb = client("one-duplicate");
    const box = await sb.mailbox();
    const one = await sb.expectExactlyOne({ recipient: box.address, subjectContains: "Receipt", settleSeconds: 5, expiresInSeconds: 60 });
    await sendMail({ to: box.address, subject: "Receipt #1", text: "thanks" });
    await sendMail({ to: box.address, subject: "Receipt #1 (again)", text: "thanks again" });
    const error = await one.wait().catch((e) => e);
    assert.ok(error instanceof SignalExpired, String(error));
    assert.equal(error.reason, "duplicate_messages");
    assert.match(error.diagnosis, /duplicate_messages/);
  });
});
