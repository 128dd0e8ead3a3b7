/**
 * Playwright fixtures: `signalbox` (a client bound to this test's own run id)
 * and `mailbox` (a fresh address per test, deleted after it when the test
 * passed; a failed test's is kept, its mail readable in the inbox and the
 * console). The receipts, the diagnosis of every dead letter and the run's
 * evidence are attached to the test's report, so a red test says why the
 * email did not come. At the end of the test, every signal it watched that
 * has not ended is cancelled (reason `test_failed` or `test_ended`): a
 * failed test leaves no dead letter behind it.
 *
 * ```ts
 * import { test, expect } from "signalbox-client/playwright";
 *
 * test("signup sends a verification link", async ({ page, signalbox, mailbox }) => {
 *   const handle = await signalbox.watch({ recipient: mailbox.address, subjectContains: "Verify" });
 *   await page.goto("/signup");
 *   await page.getByLabel("Email").fill(mailbox.address);
 *   await page.getByRole("button", { name: "Sign up" }).click();
 *   await handle.wait();
 *   const claim = await handle.claim();
 *   await page.goto(claim.links[0]!);
 *   await claim.consume();
 * });
 * ```
 */
import { createHash, randomBytes } from "node:crypto";
import { test as base, type TestInfo } from "@playwright/test";

import { Signalbox, type SignalHandle } from "./client.js";
import type { SignalboxOptions, WatchOptions } from "./options.js";
import { NotCancellable, type SignalExpired, type UnexpectedMessage } from "./errors.js";
import type { Mailbox, Receipt } from "./types.js";

export { expect } from "@playwright/test";

/** Set in the config's `use` (or `test.use`): where Signalbox is and how to reach it. */
export interface SignalboxFixtureOptions {
  signalboxOptions: Pick<SignalboxOptions, "url" | "token" | "timeoutMs" | "retries"> & {
    /** Provider of the `mailbox` fixture (default `sink`). */
    provider?: string;
  };
}

export interface SignalboxFixtures {
  /** A client whose `runId` is this test attempt's and whose `testCase` is its title. */
  signalbox: TestSignalbox;
  /** A fresh address for this test attempt alone, deleted after the test unless it failed. */
  mailbox: Mailbox;
}

/**
 * The fixture's client: `watch()` and the expectations default to this
 * test's run id and title (a second watch in one test gets `… #2`, so each
 * is its own signal).
 */
export class TestSignalbox extends Signalbox {
  private watches = 0;

  override async watch(options: WatchOptions): Promise<SignalHandle> {
    this.watches += 1;
    const testCase =
      options.testCase ?? (this.watches === 1 ? this.testCase : `${this.testCase} #${this.watches}`.slice(-200));
    return super.watch({ ...options, testCase });
  }
}

const SLUG_MAX = 48;

function slug(text: string, max: number): string {
  return text
    .normalize("NFKD")
    .replace(/[^A-Za-z0-9]+/g, "-")
    .replace(/^-+|-+$/g, "")
    .toLowerCase()
    .slice(0, max)
    .replace(/-+$/g, "");
}

/**
 * The run id of one test attempt: the test's title path (slug and hash),
 * its project and its retry, then `SIGNALBOX_RUN_ID` or a random part,
 * so a retry (or a second run of the suite) never matches an earlier
 * attempt's mail. At most 128 of `[A-Za-z0-9._:-]`.
 */
export function runIdFor(testInfo: Pick<TestInfo, "titlePath" | "retry" | "repeatEachIndex" | "project">): string {
  const path = testInfo.titlePath.join(" › ");
  const project = slug(testInfo.project.name || "default", 24) || "default";
  const hash = createHash("sha256").update(`${project}\u0000${path}`).digest("hex").slice(0, 8);
  const title = slug(testInfo.titlePath.slice(1).join(" ") || path, SLUG_MAX) || "test";
  const repeat = testInfo.repeatEachIndex ? `.x${testInfo.repeatEachIndex}` : "";
  const given = (process.env.SIGNALBOX_RUN_ID ?? "").replace(/[^A-Za-z0-9._:-]/g, "-").slice(0, 32);
  const unique = given || randomBytes(4).toString("hex");
  return `pw:${unique}:${title}:${hash}:${project}:r${testInfo.retry}${repeat}`.slice(0, 128);
}

/** The test case of a test: its title path without the file, at most 200 characters. */
export function testCaseFor(testInfo: Pick<TestInfo, "titlePath" | "title">): string {
  const path = testInfo.titlePath.slice(1).join(" › ") || testInfo.title;
  return path.length <= 200 ? path : path.slice(path.length - 200);
}

interface Record_ {
  signals: Map<string, { testCase: string; created: boolean }>;
  receipts: Receipt[];
  expired: SignalExpired[];
  arrived: UnexpectedMessage[];
}

/** The results of a signal that has not ended: the fixture cancels these at the test's end. */
const UNENDED = new Set(["waiting", "provider_error", "found", "claimed"]);

/** Whether the test failed (or timed out, or passed though expected to fail). */
function failed(testInfo: TestInfo): boolean {
  return testInfo.status !== undefined && testInfo.status !== "skipped" && testInfo.status !== testInfo.expectedStatus;
}

async function attachJson(testInfo: TestInfo, name: string, value: unknown): Promise<void> {
  await testInfo.attach(name, { body: JSON.stringify(value, null, 2), contentType: "application/json" });
}

async function report(sb: TestSignalbox, seen: Record_, testInfo: TestInfo): Promise<void> {
  for (const receipt of seen.receipts) {
    await attachJson(testInfo, `signalbox receipt ${receipt.receipt_id}`, receipt);
  }
  for (const error of seen.expired) {
    await testInfo.attach(`signalbox diagnosis ${error.view?.signal_id ?? ""}`.trim(), {
      body: error.diagnosis,
      contentType: "text/plain",
    });
    if (error.deadLetter) await attachJson(testInfo, `signalbox dead letter ${error.deadLetter.dead_letter_id}`, error.deadLetter);
  }
  for (const error of seen.arrived) {
    await testInfo.attach(`signalbox unexpected email ${error.view.signal_id}`, {
      body: error.message,
      contentType: "text/plain",
    });
  }
  if (seen.signals.size === 0) return;
  try {
    // Signals the test left unended (it failed, timed out, or never claimed):
    // say where they stand, then cancel them so none becomes a dead letter.
    const reason = failed(testInfo) ? "test_failed" : "test_ended";
    for (const view of await sb.signals()) {
      if (!UNENDED.has(view.result) || !seen.signals.has(view.signal_id)) continue;
      await testInfo.attach(`signalbox still ${view.result} ${view.signal_id}`, {
        body:
          `signal ${view.signal_id} (${view.test_case}, to ${view.recipient}) was still ${view.result} ` +
          `when the test ended (it would have expired at ${view.expires_at}); cancelled: ${reason}. ` +
          `checks: ${view.checks}, ` +
          `last check: ${view.last_check ? `${view.last_check.outcome} at ${view.last_check.at}` : "none yet"}`,
        contentType: "text/plain",
      });
      try {
        await sb.cancel(view.signal_id, reason);
      } catch (error) {
        if (!(error instanceof NotCancellable)) throw error; // it ended meanwhile
      }
    }
    await attachJson(testInfo, `signalbox evidence ${sb.runId}`, await sb.evidence());
  } catch (error) {
    testInfo.annotations.push({ type: "signalbox", description: `could not read the run's evidence: ${String(error)}` });
  }
}

export const test = base.extend<SignalboxFixtures & SignalboxFixtureOptions>({
  signalboxOptions: [{}, { option: true }],

  signalbox: async ({ signalboxOptions }, use, testInfo) => {
    const { provider: _provider, ...clientOptions } = signalboxOptions;
    const sb = new TestSignalbox({ ...clientOptions, runId: runIdFor(testInfo), testCase: testCaseFor(testInfo) });
    const seen: Record_ = { signals: new Map(), receipts: [], expired: [], arrived: [] };
    const off = sb.on((event) => {
      if (event.type === "signal") seen.signals.set(event.view.signal_id, { testCase: event.view.test_case, created: event.created });
      else if (event.type === "receipt") seen.receipts.push(event.receipt);
      else if (event.type === "expired") seen.expired.push(event.error);
      else seen.arrived.push(event.error);
    });
    testInfo.annotations.push({ type: "signalbox run", description: sb.runId });
    try {
      await use(sb);
    } finally {
      off();
      await report(sb, seen, testInfo);
    }
  },

  mailbox: async ({ signalbox, signalboxOptions }, use, testInfo) => {
    const box = await signalbox.mailbox({ provider: signalboxOptions.provider });
    try {
      await use(box);
    } finally {
      if (failed(testInfo)) {
        // The evidence of the failure: its mail stays readable until the mailbox expires.
        testInfo.annotations.push({ type: "signalbox mailbox kept", description: box.address });
      } else {
        try {
          await signalbox.deleteMailbox(box.mailbox_id);
        } catch (error) {
          testInfo.annotations.push({ type: "signalbox", description: `could not delete mailbox ${box.mailbox_id}: ${String(error)}` });
        }
      }
    }
  },
});
