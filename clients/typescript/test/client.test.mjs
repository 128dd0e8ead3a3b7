// The client against the real stack: create, wait, claim, consume; expiry with
// its diagnosis; idempotent retries; parallel runs; bad ids; an unreachable server.
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import {
  AlreadyClaimed,
  IdempotencyConflict,
  NotCancellable,
  NotClaimable,
  SignalCancelled,
  InvalidId,
  ServiceUnavailable,
  Signalbox,
  SignalboxError,
  SignalExpired,
  SignalNotReady,
  Unauthorized,
  WaitTimeout,
} from "../dist/index.js";
import { runId, scriptedFetch, sendMail } from "./helpers.mjs";

const SUBJECT = "Verify your account";

async function signupMail(to, run, extra = "") {
  await sendMail({
    to,
    subject: SUBJECT,
    text: `Welcome!\nConfirm: https://app.example.test/verify?token=abc123\nYour code is 482913\n${extra}`,
    headers: { "X-Signalbox-Run": run },
  });
}

describe("one signal's life", () => {
  it("creates, waits, claims with links and codes, consumes for a receipt", async () => {
    const run = runId("life");
    const sb = new Signalbox({ runId: run });
    const box = await sb.mailbox();
    assert.match(box.mailbox_id, /^mbx_/);
    const handle = await sb.watch({ testCase: "signup", recipient: box.address, subjectContains: "verify", expiresInSeconds: 60 });
    assert.equal(handle.created, true);
    assert.equal(handle.view.result, "waiting");
    await signupMail(box.address, run);

    const view = await handle.wait();
    assert.equal(view.result, "found");
    assert.equal(view.message.subject, SUBJECT);
    assert.equal(view.message.run_marker, run);

    const claim = await handle.claim({ leaseSeconds: 30 });
    assert.match(claim.claimId, /^clm_/);
    assert.deepEqual(claim.links, ["https://app.example.test/verify?token=abc123"]);
    assert.ok(claim.codes.includes("482913"), `codes: ${claim.codes}`);
    assert.equal(claim.subject, SUBJECT);

    const receipt = await claim.consume();
    assert.equal(receipt.run_id, run);
    assert.equal(receipt.signal_id, handle.signalId);
    assert.equal(receipt.message_id, claim.messageId);
    assert.equal(receipt.evidence.recipient, "matched");
    // Consuming again is harmless: the same receipt.
    assert.deepEqual(await sb.consume(claim.claimId), receipt);

    const evidence = await sb.evidence();
    assert.equal(evidence.run_id, run);
    assert.equal(evidence.signals[0].receipt.receipt_id, receipt.receipt_id);
    await sb.deleteMailbox(box.mailbox_id);
  });

  it("claims before a match are SignalNotReady; a second claim is AlreadyClaimed; release gives it back", async () => {
    const run = runId("claims");
    const sb = new Signalbox({ runId: run, testCase: "claims" });
    const box = await sb.mailbox();
    const handle = await sb.watch({ recipient: box.address, expiresInSeconds: 60 });
    await assert.rejects(handle.claim(), (e) => e instanceof SignalNotReady && e.code === "waiting");
    await signupMail(box.address, run);
    await handle.wait();
    const first = await handle.claim();
    await assert.rejects(handle.claim(), (e) => e instanceof AlreadyClaimed && e.claimId === first.claimId);
    const released = await first.release();
    assert.equal(released.result, "found");
    const second = await handle.claim();
    assert.notEqual(second.claimId, first.claimId);
    await second.consume();
  });

  it("a wait with a timeout shorter than the signal's life rejects with WaitTimeout and the view", async () => {
    const sb = new Signalbox({ runId: runId("timeout"), testCase: "timeout" });
    const box = await sb.mailbox();
    const handle = await sb.watch({ recipient: box.address, expiresInSeconds: 120 });
    await assert.rejects(handle.wait({ timeoutSeconds: 1 }), (e) => {
      assert.ok(e instanceof WaitTimeout);
      assert.equal(e.view.signal_id, handle.signalId);
      assert.equal(e.expiresAt, handle.view.expires_at);
      assert.match(e.message, /still waiting after 1s; it expires at /);
      return true;
    });
  });
});

describe("cancel", () => {
  it("cancels a claimed signal: the claim ends, a wait rejects with SignalCancelled, no dead letter", async () => {
    const run = runId("cancel");
    const sb = new Signalbox({ runId: run, testCase: "cancel" });
    const box = await sb.mailbox();
    const handle = await sb.watch({ recipient: box.address, subjectContains: SUBJECT });
    await signupMail(box.address, run);
    await handle.wait();
    const claim = await handle.claim();
    const view = await handle.cancel("test_failed");
    assert.equal(view.status, "cancelled");
    assert.deepEqual(view.cancellation?.reason, "test_failed");
    assert.equal(handle.view.status, "cancelled");
    // Again: the same view. The ended claim cannot consume; the signal cannot be claimed.
    assert.deepEqual(await sb.cancel(handle.signalId, "other"), view);
    await assert.rejects(claim.consume(), (e) => e.code === "lease_expired");
    await assert.rejects(handle.claim(), NotClaimable);
    const error = await handle.wait().catch((e) => e);
    assert.ok(error instanceof SignalCancelled, String(error));
    assert.equal(error.reason, "test_failed");
    assert.deepEqual((await sb.deadLetters({ runId: run })).items, []);
  });

  it("a consumed signal is NotCancellable", async () => {
    const run = runId("cancel-ended");
    const sb = new Signalbox({ runId: run, testCase: "cancel-ended" });
    const box = await sb.mailbox();
    const handle = await sb.watch({ recipient: box.address, subjectContains: SUBJECT });
    await signupMail(box.address, run);
    await handle.wait();
    await (await handle.claim()).consume();
    await assert.rejects(handle.cancel(), NotCancellable);
  });
});

describe("expiry", () => {
  it("rejects with SignalExpired carrying the diagnosis, the dead letter and the near misses", async () => {
    const run = runId("expiry");
    const sb = new Signalbox({ runId: run, testCase: "expiry" });
    const box = await sb.mailbox();
    const handle = await sb.watch({ recipient: box.address, subjectContains: "Reset your password", expiresInSeconds: 3 });
    await signupMail(box.address, run);
    const error = await handle.wait().then(
      () => assert.fail("the wait should have rejected"),
      (e) => e,
    );
    assert.ok(error instanceof SignalExpired, String(error));
    assert.ok(error instanceof SignalboxError);
    assert.equal(error.name, "SignalExpired");
    assert.equal(error.reason, "deadline");
    assert.match(error.deadLetter.dead_letter_id, /^dlq_/);
    assert.equal(error.nearMisses.length, 1);
    assert.equal(error.nearMisses[0].why, "subject_mismatch");
    assert.equal(error.nearMisses[0].subject, SUBJECT);
    assert.ok(error.recommendation, "a recommendation");
    assert.match(error.diagnosis, /expired: deadline/);
    assert.match(error.diagnosis, /subject_mismatch/);
    assert.ok(error.diagnosis.includes(error.recommendation));
    assert.match(error.message, /expired \(deadline\): /);
    assert.equal(handle.view.result, "expired", "the handle keeps the last view");
  });
});

describe("idempotency and retries", () => {
  it("watching again with the same run and test case returns the same signal; other filters conflict", async () => {
    const sb = new Signalbox({ runId: runId("idem"), testCase: "idem" });
    const box = await sb.mailbox();
    const first = await sb.watch({ recipient: box.address, subjectContains: "Verify" });
    const again = await sb.watch({ recipient: box.address, subjectContains: "Verify" });
    assert.equal(again.signalId, first.signalId);
    assert.equal(again.created, false);
    await assert.rejects(
      sb.watch({ recipient: box.address, subjectContains: "Other" }),
      (e) => e instanceof IdempotencyConflict && e.status === 409 && e.code === "idempotency_conflict",
    );
    const keyed = await sb.watch({ recipient: box.address, testCase: "other", idempotencyKey: `key-${first.signalId}` });
    const keyedAgain = await sb.watch({ recipient: box.address, testCase: "other", idempotencyKey: `key-${first.signalId}` });
    assert.equal(keyedAgain.signalId, keyed.signalId);
    assert.notEqual(keyed.signalId, first.signalId);
  });

  it("a create whose answer was lost is retried into the same signal, not a second one", async () => {
    const run = runId("lost");
    let lose = 1;
    const fetch = scriptedFetch((req) => (req.method === "POST" && req.url.pathname === "/v1/signals" && lose-- > 0 ? "lose" : "pass"));
    const sb = new Signalbox({ runId: run, testCase: "lost", fetch });
    const box = await sb.mailbox();
    const handle = await sb.watch({ recipient: box.address });
    assert.equal(fetch.calls.filter((c) => c.url.endsWith("/v1/signals")).length, 2);
    assert.equal(handle.created, false, "the retry found the signal the lost attempt made");
    const signals = await sb.signals();
    assert.deepEqual(signals.map((s) => s.signal_id), [handle.signalId]);
  });

  it("GETs are retried after a 5xx and a refused connection; claims never are", async () => {
    const run = runId("retry");
    let failGets = 2;
    let loseClaim = true;
    const fetch = scriptedFetch((req) => {
      if (req.method === "GET" && failGets > 0) return failGets-- === 2 ? "503" : "refuse";
      if (req.url.pathname.endsWith("/claim") && loseClaim) {
        loseClaim = false;
        return "lose";
      }
      return "pass";
    });
    const sb = new Signalbox({ runId: run, testCase: "retry", fetch });
    const box = await sb.mailbox();
    const handle = await sb.watch({ recipient: box.address, expiresInSeconds: 60 });
    await signupMail(box.address, run);
    const view = await handle.wait();
    assert.equal(view.result, "found");
    assert.equal(failGets, 0, "both failed GETs were retried");
    // The claim happened on the server but its answer was lost: no blind retry.
    await assert.rejects(handle.claim(), ServiceUnavailable);
    assert.equal(fetch.calls.filter((c) => c.url.endsWith("/claim")).length, 1);
    await assert.rejects(handle.claim(), AlreadyClaimed);
  });
});

describe("eight tests in parallel, each with its own run", { concurrency: 8 }, () => {
  const receipts = new Map();
  for (let i = 0; i < 8; i++) {
    it(`parallel test ${i}`, async () => {
      const run = runId(`par${i}`);
      const sb = new Signalbox({ runId: run, testCase: "parallel signup" });
      const box = await sb.mailbox();
      const handle = await sb.watch({ recipient: box.address, subjectContains: "verify", requireRunMarker: true, expiresInSeconds: 90 });
      await signupMail(box.address, run, `for test ${i}`);
      await handle.wait();
      const claim = await handle.claim();
      assert.match(claim.bodyExcerpt, new RegExp(`for test ${i}\\b`));
      const receipt = await claim.consume();
      assert.equal(receipt.run_id, run);
      receipts.set(i, receipt);
    });
  }
  it("took eight different messages", async () => {
    // Runs with the others: it waits until all eight have their receipt.
    for (let t = 0; t < 1200 && receipts.size < 8; t++) await new Promise((r) => setTimeout(r, 100));
    assert.equal(new Set([...receipts.values()].map((r) => r.message_id)).size, 8);
  });
});

describe("bad input and a bad server", () => {
  it("checks ids and run ids before anything is sent", async () => {
    const fetch = scriptedFetch();
    const sb = new Signalbox({ fetch, runId: "ok-run" });
    for (const bad of ["../v1/dead-letters", "sig_a/b", "sig_", "clm_x", "sig_a?b=1", "sig_%2e%2e", 42, null]) {
      await assert.rejects(sb.getSignal(bad), InvalidId, `signal id ${String(bad)}`);
    }
    await assert.rejects(sb.consume("clm_../../x"), (e) => e instanceof InvalidId && e.field === "claim_id");
    await assert.rejects(sb.deadLetter("sig_abc"), InvalidId);
    await assert.rejects(sb.deleteMailbox("mbx_a#b"), InvalidId);
    await assert.rejects(sb.evidence("../x"), (e) => e instanceof InvalidId && e.field === "run_id");
    await assert.rejects(sb.evidence("..."), InvalidId);
    assert.throws(() => new Signalbox({ runId: "a/b" }), InvalidId);
    assert.equal(fetch.calls.length, 0);
  });

  it("a wrong token is Unauthorized", async () => {
    const sb = new Signalbox({ token: "tok-wrong-0123456789", runId: runId("auth") });
    await assert.rejects(sb.mailbox(), (e) => e instanceof Unauthorized && e.status === 401);
  });

  it("an unreachable server is ServiceUnavailable naming the URL, after the retries a call allows", async () => {
    const probe = (await import("node:net")).createServer();
    await new Promise((r) => probe.listen(0, "127.0.0.1", r));
    const port = probe.address().port;
    await new Promise((r) => probe.close(r));
    const url = `http://127.0.0.1:${port}`;
    const fetch = scriptedFetch();
    const sb = new Signalbox({ url, token: "t", fetch, runId: "r" });
    await assert.rejects(sb.getSignal("sig_abc"), (e) => {
      assert.ok(e instanceof ServiceUnavailable);
      assert.ok(e.message.includes(url), e.message);
      assert.match(e.message, /ECONNREFUSED/);
      return true;
    });
    assert.equal(fetch.calls.length, 3, "a GET: the first attempt and two retries");
    await assert.rejects(sb.mailbox(), ServiceUnavailable);
    assert.equal(fetch.calls.length, 4, "creating a mailbox is never retried");
  });

  it("reads SIGNALBOX_URL and SIGNALBOX_TOKEN by default", () => {
    const sb = new Signalbox();
    assert.equal(sb.url, process.env.SIGNALBOX_URL.replace(/\/+$/, ""));
    assert.equal(sb.token, process.env.SIGNALBOX_TOKEN);
  });
});
