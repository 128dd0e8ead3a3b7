// The Playwright fixtures, run by Playwright's own runner (no browser needed):
// playwright-tests/fixtures.spec.ts, read back from its JSON report: the run
// ids, the retry, and what each test attached to its report.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { it } from "node:test";

const root = fileURLToPath(new URL("..", import.meta.url));
const cli = createRequire(import.meta.url).resolve("@playwright/test/cli");

function run() {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [cli, "test", "-c", "playwright-tests/playwright.config.mjs", "--reporter=json"], {
      cwd: root,
      env: { ...process.env, PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD: "1", FORCE_COLOR: "0" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (err += d));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, out, err }));
  });
}

function specs(suite, path = []) {
  const here = [...path, suite.title].filter(Boolean);
  return [
    ...(suite.specs ?? []).map((s) => ({ ...s, path: [...here, s.title] })),
    ...(suite.suites ?? []).flatMap((s) => specs(s, here)),
  ];
}

function attachment(result, prefix) {
  const found = result.attachments.filter((a) => a.name.startsWith(prefix));
  return found.map((a) => ({ ...a, text: a.body ? Buffer.from(a.body, "base64").toString("utf8") : null }));
}

it("the fixtures' Playwright tests pass, and their reports carry the receipt and the diagnosis", { timeout: 180_000 }, async () => {
  const { code, out, err } = await run();
  let report;
  try {
    report = JSON.parse(out);
  } catch {
    assert.fail(`no JSON report (exit ${code}):\n${out}\n${err}`);
  }
  const all = report.suites.flatMap((s) => specs(s));
  const byTitle = new Map(all.map((s) => [s.title, s]));
  const failed = all.filter((s) => !s.ok).map((s) => `${s.path.join(" › ")}: ${JSON.stringify(s.tests[0].results.map((r) => r.error?.message))}`);
  assert.deepEqual(failed, [], `failed:\n${failed.join("\n")}\n${err}`);
  assert.equal(code, 0, err);
  assert.equal(all.length, 4);

  const consumed = byTitle.get("waits, claims and consumes; the receipt goes into the report").tests[0].results[0];
  const [receipt] = attachment(consumed, "signalbox receipt ");
  assert.ok(receipt, `attachments: ${consumed.attachments.map((a) => a.name)}`);
  assert.equal(receipt.contentType, "application/json");
  const body = JSON.parse(receipt.text);
  assert.match(body.receipt_id, /^rcp_/);
  const [evidence] = attachment(consumed, "signalbox evidence ");
  assert.equal(JSON.parse(evidence.text).run_id, body.run_id);
  // The second watch of that test was left waiting: the report says so, and
  // the passed test cancelled it (test_ended) rather than leave a dead letter.
  const [still] = attachment(consumed, "signalbox still waiting ");
  assert.match(still.text, /cancelled: test_ended/);
  const [evidenceAfter] = attachment(consumed, "signalbox evidence ");
  const cancelled = JSON.parse(evidenceAfter.text).signals.filter((s) => s.status === "cancelled");
  assert.deepEqual(cancelled.map((s) => s.cancellation.reason), ["test_ended"]);

  const expired = byTitle.get("an expired signal puts its diagnosis in the report").tests[0];
  assert.equal(expired.expectedStatus, "failed");
  const [diagnosis] = attachment(expired.results[0], "signalbox diagnosis ");
  assert.ok(diagnosis, `attachments: ${expired.results[0].attachments.map((a) => a.name)}`);
  assert.equal(diagnosis.contentType, "text/plain");
  assert.match(diagnosis.text, /expired: deadline/);
  assert.match(diagnosis.text, /recommendation: /);
  assert.match(diagnosis.text, /subject_mismatch: "Something else"/);
  const [deadLetter] = attachment(expired.results[0], "signalbox dead letter dlq_");
  assert.equal(JSON.parse(deadLetter.text).reason, "deadline");

  const retried = byTitle.get("gets a new run id and a new mailbox; the failed attempt's is kept, its signal cancelled").tests[0];
  const keptNote = [...(retried.results[0].annotations ?? []), ...retried.annotations].find(
    (a) => a.type === "signalbox mailbox kept",
  );
  assert.match(keptNote?.description ?? "", /@/, "the failed attempt's report names the kept mailbox");
  assert.equal(retried.status, "flaky", "failed once on purpose, then passed on its retry");
  const runs = retried.results.map((r) => r.annotations?.find((a) => a.type === "signalbox run")?.description ?? null);
  const annotations = retried.annotations.filter((a) => a.type === "signalbox run").map((a) => a.description);
  const ids = runs.every(Boolean) ? runs : annotations;
  assert.equal(new Set(ids).size, 2, `two attempts, two run ids: ${ids}`);
});
