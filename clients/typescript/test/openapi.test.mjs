// The client's types against the server: every route the client calls is in
// the live /openapi.json, every field a request type declares is in its
// schema, and every field a view type requires is in a live answer. The
// declared fields are read from src/types.ts with the TypeScript compiler,
// so the test checks the declarations themselves.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import ts from "typescript";

import { Signalbox } from "../dist/index.js";
import { hasField, hasRoute, openApi, runId, sendMail } from "./helpers.mjs";

const source = ts.createSourceFile(
  "types.ts",
  readFileSync(new URL("../src/types.ts", import.meta.url), "utf8"),
  ts.ScriptTarget.ES2022,
  true,
);

/** Each interface's properties: name -> {optional}. */
function declared() {
  const out = new Map();
  source.forEachChild((node) => {
    if (!ts.isInterfaceDeclaration(node)) return;
    const props = new Map();
    for (const member of node.members) {
      if (ts.isPropertySignature(member)) props.set(member.name.getText(source), { optional: Boolean(member.questionToken) });
    }
    out.set(node.name.text, props);
  });
  return out;
}
const TYPES = declared();

// Routes and fields of this wave that other parts of the server add: checked
// once the server has them, reported as skipped until then.
const NEWER_FIELDS = new Set(["SignalCreate.expect", "SignalCreate.settle_seconds", "ClaimCreate.owner"]);
const NEWER_ROUTES = new Set([
  "GET /v1/claims/{claim_id}/message",
  "GET /v1/claims/{claim_id}/attachments/{attachment_id}",
  "GET /v1/claims/{claim_id}/raw",
]);

// Every route src/client.ts calls, as OpenAPI path templates.
const ROUTES = [
  "POST /v1/mailboxes",
  "DELETE /v1/mailboxes/{mailbox_id}",
  "POST /v1/signals",
  "GET /v1/signals",
  "GET /v1/signals/{signal_id}",
  "POST /v1/signals/{signal_id}/claim",
  "POST /v1/signals/{signal_id}/cancel",
  "GET /v1/claims/{claim_id}",
  "POST /v1/claims/{claim_id}/consume",
  "POST /v1/claims/{claim_id}/release",
  "POST /v1/claims/{claim_id}/extend",
  "GET /v1/runs/{run_id}/evidence",
  "GET /v1/dead-letters",
  "GET /v1/dead-letters/{dead_letter_id}",
  ...NEWER_ROUTES,
];

describe("routes", () => {
  for (const route of ROUTES) {
    const [method, path] = route.split(" ");
    it(`${route} is in /openapi.json`, async (t) => {
      if (!(await hasRoute(method, path))) {
        if (NEWER_ROUTES.has(route)) return t.skip(`${route}: not on this server yet`);
        assert.fail(`${route} is not in the server's /openapi.json`);
      }
    });
  }

  it("the client's client.ts calls no route missing from this list", () => {
    const code = readFileSync(new URL("../src/client.ts", import.meta.url), "utf8");
    const used = new Set([...code.matchAll(/"(\/v1\/[^"`]*)"/g)].map((m) => m[1].replace(/\{\}/g, "{id}")));
    const known = new Set(ROUTES.map((r) => r.split(" ")[1].replace(/\{[a-z_]+\}/g, "{id}")));
    for (const path of used) assert.ok(known.has(path), `${path} is called but not checked here`);
  });
});

describe("request bodies match their schemas", () => {
  for (const [type, schema] of [
    ["SignalCreate", "SignalCreate"],
    ["ClaimCreate", "ClaimCreate"],
    ["ClaimExtend", "ClaimExtend"],
    ["MailboxCreate", "MailboxCreate"],
  ]) {
    it(`${type} declares only fields of ${schema}, and every required one`, async (t) => {
      const doc = await openApi();
      const server = doc.components.schemas[schema];
      assert.ok(server, `schema ${schema} is in /openapi.json`);
      const props = TYPES.get(type);
      assert.ok(props?.size, `${type} is declared in src/types.ts`);
      const pending = [];
      for (const [name, { optional }] of props) {
        if (!(await hasField(schema, name))) {
          if (NEWER_FIELDS.has(`${type}.${name}`)) {
            pending.push(name);
            continue;
          }
          assert.fail(`${type}.${name} is not a property of ${schema}`);
        }
        const required = (server.required ?? []).includes(name);
        assert.equal(!optional, required, `${type}.${name}: optional in the type exactly when the schema does not require it`);
      }
      for (const name of Object.keys(server.properties ?? {})) {
        assert.ok(props.has(name), `${schema}.${name} is missing from ${type}`);
      }
      if (pending.length) t.diagnostic(`${type}: ${pending.join(", ")} not on this server yet (checked once it is)`);
    });
  }
});

/** Every required (non-optional) field `type` declares is in `live`; returns what the server has beyond them. */
function checkView(type, live) {
  const props = TYPES.get(type);
  assert.ok(props, `${type} is declared`);
  for (const [name, { optional }] of props) {
    if (!optional) assert.ok(name in live, `${type}.${name} is not in the server's answer: ${JSON.stringify(Object.keys(live))}`);
  }
  return Object.keys(live).filter((k) => !props.has(k));
}

describe("views match live answers", () => {
  it("Mailbox, SignalView, ClaimBody, Receipt, ReceiptEvidence, DeadLetter, NearMiss, Evidence", async (t) => {
    const run = runId("types");
    const sb = new Signalbox({ runId: run, testCase: "types" });
    const extra = {};
    const box = await sb.mailbox();
    extra.Mailbox = checkView("Mailbox", box);
    const handle = await sb.watch({ recipient: box.address, subjectContains: "Verify" });
    extra.SignalView = checkView("SignalView", handle.view);
    await sendMail({ to: box.address, subject: "Verify", text: "https://x.example/v?t=1 code 123456" });
    const found = await handle.wait();
    checkView("MessageSummary", found.message);
    const claim = await handle.claim();
    extra.ClaimBody = checkView("ClaimBody", claim.raw);
    const claimed = await handle.refresh();
    extra.ClaimState = checkView("ClaimState", claimed.claim);
    const receipt = await claim.consume();
    extra.Receipt = checkView("Receipt", receipt);
    extra.ReceiptEvidence = checkView("ReceiptEvidence", receipt.evidence);

    const late = await sb.watch({ testCase: "types expired", recipient: box.address, subjectContains: "Nope", expiresInSeconds: 1 });
    await sendMail({ to: box.address, subject: "Verify again", text: "x" });
    const error = await late.wait().catch((e) => e);
    extra.DeadLetter = checkView("DeadLetter", error.deadLetter);
    assert.ok(error.nearMisses.length > 0);
    extra.NearMiss = checkView("NearMiss", error.nearMisses[0]);
    checkView("LastCheck", error.view.last_check);

    const evidence = await sb.evidence();
    extra.Evidence = checkView("Evidence", evidence);
    extra.EvidenceSignal = checkView("EvidenceSignal", evidence.signals[0]);
    const undeclared = Object.entries(extra).filter(([, names]) => names.length);
    if (undeclared.length) t.diagnostic(`fields the server sends that the types do not declare: ${JSON.stringify(undeclared)}`);
  });
});
