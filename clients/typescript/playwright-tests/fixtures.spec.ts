import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { test, expect } from "../dist/playwright.js";
import { NotFound, SignalExpired } from "../dist/index.js";
// @ts-expect-error: plain JavaScript, no declarations
import { sendMail } from "../test/helpers.mjs";

async function send(to: string, subject: string, runMarker: string): Promise<void> {
  await sendMail({ to, subject, text: "https://app.example.test/verify?t=1", headers: { "X-Signalbox-Run": runMarker } });
}

test.describe("the signalbox fixture", () => {
  test("names the run after the title path, project and retry", async ({ signalbox }, testInfo) => {
    expect(signalbox.runId).toMatch(
      /^pw:[A-Za-z0-9._-]+:the-signalbox-fixture-names-the-run[a-z-]*:[0-9a-f]{8}:fixtures:r0$/,
    );
    expect(signalbox.testCase).toBe("the signalbox fixture › names the run after the title path, project and retry");
    expect(signalbox.runId.length).toBeLessThanOrEqual(128);
    expect(testInfo.annotations).toContainEqual({ type: "signalbox run", description: signalbox.runId });
  });

  test("waits, claims and consumes; the receipt goes into the report", async ({ signalbox, mailbox }) => {
    const handle = await signalbox.watch({ recipient: mailbox.address, subjectContains: "Verify", requireRunMarker: true });
    // A second watch in the same test is a signal of its own.
    const other = await signalbox.watch({ recipient: mailbox.address, subjectContains: "Welcome", expiresInSeconds: 60 });
    expect(other.signalId).not.toBe(handle.signalId);
    expect(other.view.test_case).toBe(`${signalbox.testCase} #2`);
    await send(mailbox.address, "Verify your account", signalbox.runId);
    await handle.wait();
    const claim = await handle.claim();
    expect(claim.links).toEqual(["https://app.example.test/verify?t=1"]);
    const receipt = await claim.consume();
    expect(receipt.run_id).toBe(signalbox.runId);
  });

  test("an expired signal puts its diagnosis in the report", async ({ signalbox, mailbox }) => {
    test.fail(); // on purpose: the email never comes
    const handle = await signalbox.watch({ recipient: mailbox.address, subjectContains: "Never sent", expiresInSeconds: 2 });
    await send(mailbox.address, "Something else", signalbox.runId);
    await handle.wait().catch((error) => {
      expect(error).toBeInstanceOf(SignalExpired);
      throw error;
    });
  });
});

test.describe("a retried test", () => {
  test.describe.configure({ retries: 1 });

  test("gets a new run id and a new mailbox; the failed attempt's is kept, its signal cancelled", async ({ signalbox, mailbox }, testInfo) => {
    const state = join(testInfo.project.outputDir, "retry-state.json");
    if (testInfo.retry === 0) {
      const handle = await signalbox.watch({ recipient: mailbox.address, subjectContains: "Verify" });
      const waiting = await signalbox.watch({ recipient: mailbox.address, subjectContains: "Welcome", expiresInSeconds: 60 });
      await send(mailbox.address, "Verify your account", signalbox.runId);
      await handle.wait();
      writeFileSync(
        state,
        JSON.stringify({
          runId: signalbox.runId,
          address: mailbox.address,
          mailboxId: mailbox.mailbox_id,
          signalIds: [handle.signalId, waiting.signalId],
        }),
      );
      throw new Error("failing the first attempt on purpose");
    }
    expect(existsSync(state)).toBe(true);
    const first = JSON.parse(readFileSync(state, "utf8"));
    expect(signalbox.runId).toMatch(/:r1$/);
    expect(signalbox.runId).not.toBe(first.runId);
    expect(mailbox.address).not.toBe(first.address);
    // The failed attempt's signals (one found, one waiting) were cancelled: no dead letter.
    for (const signalId of first.signalIds) {
      const view = await signalbox.getSignal(signalId);
      expect([view.status, view.cancellation?.reason]).toEqual(["cancelled", "test_failed"]);
    }
    expect((await signalbox.deadLetters({ runId: first.runId })).items).toEqual([]);
    // Its mailbox was kept (the evidence of the failure): deleting it now works, once.
    await signalbox.deleteMailbox(first.mailboxId);
    await expect(signalbox.deleteMailbox(first.mailboxId)).rejects.toBeInstanceOf(NotFound);
    // This attempt's watch sees nothing of the first attempt's mail.
    const handle = await signalbox.watch({ recipient: mailbox.address, subjectContains: "Verify", expiresInSeconds: 2 });
    const error = await handle.wait().catch((e) => e);
    expect(error).toBeInstanceOf(SignalExpired);
    expect(error.nearMisses).toEqual([]);
  });
});
