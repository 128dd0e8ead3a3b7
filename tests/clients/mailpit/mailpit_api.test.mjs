// The real `mailpit-api` npm client (installed by scripts/install-test-deps.sh
// into .signalbox/node) driving Signalbox's Mailpit-compatible API: what each
// call returns is checked against what was sent. Run by
// tests/clients/test_mailpit_api.py with SIGNALBOX_URL, the two namespaces'
// tokens and the sink's address in the environment.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import net from "node:net";
import { createRequire } from "node:module";

const require = createRequire(process.env.MAILPIT_API_MODULE);
const { MailpitClient } = require("mailpit-api");

const URL = process.env.SIGNALBOX_URL;
const TOKEN_A = process.env.TOKEN_A;
const TOKEN_B = process.env.TOKEN_B;
const SMTP_HOST = process.env.SIGNALBOX_SMTP_HOST;
const SMTP_PORT = Number(process.env.SIGNALBOX_SMTP_PORT);

const a = new MailpitClient(URL, { auth: { username: "ci", password: TOKEN_A } });
const b = new MailpitClient(URL, { auth: { username: "ci", password: TOKEN_B } });

/** Send one message over SMTP (a few lines of the protocol); the 250's text. */
function smtpSend(from, to, data) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(SMTP_PORT, SMTP_HOST);
    const steps = [
      null,
      "EHLO test.local",
      `MAIL FROM:<${from}>`,
      ...to.map((t) => `RCPT TO:<${t}>`),
      "DATA",
      data.replace(/\r?\n/g, "\r\n").replace(/^\./gm, "..") + "\r\n.",
      "QUIT",
    ];
    let buffer = "";
    let step = 0;
    let queued = "";
    socket.setEncoding("utf8");
    socket.on("data", (chunk) => {
      buffer += chunk;
      const lines = buffer.split("\r\n");
      buffer = lines.pop();
      for (const line of lines) {
        if (line[3] === "-") continue; // a multi-line reply goes on
        const code = Number(line.slice(0, 3));
        if (code >= 400) return reject(new Error(`SMTP ${line}`));
        if (steps[step] && steps[step].endsWith("\r\n.")) queued = line;
        step += 1;
        if (step < steps.length) socket.write(steps[step] + "\r\n");
        else socket.end();
      }
    });
    socket.on("end", () => resolve(queued));
    socket.on("error", reject);
  });
}

function mail({ to, subject, text, attachment }) {
  const boundary = "b0undary";
  const head = [
    `From: "Brand App" <app@brand.test>`,
    `To: "Ann" <${to}>`,
    `Subject: ${subject}`,
    `Message-ID: <${subject.replace(/\W/g, "")}@brand.test>`,
    `Date: ${new Date().toUTCString()}`,
    "MIME-Version: 1.0",
  ];
  if (!attachment) {
    return [...head, "Content-Type: text/plain; charset=utf-8", "", text].join("\n");
  }
  return [
    ...head,
    `Content-Type: multipart/mixed; boundary="${boundary}"`,
    "",
    `--${boundary}`,
    "Content-Type: multipart/alternative; boundary=alt",
    "",
    "--alt",
    "Content-Type: text/plain; charset=utf-8",
    "",
    text,
    "--alt",
    "Content-Type: text/html; charset=utf-8",
    "",
    `<p>${text}</p>`,
    "--alt--",
    `--${boundary}`,
    `Content-Type: application/pdf; name="${attachment.name}"`,
    `Content-Disposition: attachment; filename="${attachment.name}"`,
    "Content-Transfer-Encoding: base64",
    "",
    attachment.bytes.toString("base64").replace(/(.{76})/g, "$1\n"),
    `--${boundary}--`,
  ].join("\n");
}

async function mailboxOfA() {
  const answer = await fetch(`${URL}/v1/mailboxes`, {
    method: "POST",
    headers: { Authorization: `Bearer ${TOKEN_A}`, "Content-Type": "application/json" },
    body: JSON.stringify({ run_id: "mailpit-api", provider: "sink" }),
  });
  assert.equal(answer.status, 201);
  return (await answer.json()).address;
}

const sha256 = (bytes) => createHash("sha256").update(bytes).digest("hex");

test("mailpit-api drives Signalbox; another namespace sees none of it", async () => {
  const to = await mailboxOfA();
  const pdf = Buffer.from("%PDF-1.4\n" + "x".repeat(3000));
  const welcome = mail({ to, subject: "Welcome Ann", text: "Your code is 493817." });
  const invoice = mail({
    to,
    subject: "Invoice 9",
    text: "Please find the invoice attached.",
    attachment: { name: "invoice-9.pdf", bytes: pdf },
  });

  // waitForMessage polls while the mail is on its way.
  const waiting = a.waitForMessage({ query: `to:${to} subject:Welcome` }, { timeout: 20000, interval: 200 });
  const queued = await smtpSend("app@brand.test", [to], welcome);
  const found = await waiting;
  assert.match(queued, new RegExp(found.ID));
  assert.equal(found.Subject, "Welcome Ann");
  assert.deepEqual(found.To, [{ Name: "Ann", Address: to }]);
  assert.equal(found.From.Address, "app@brand.test");
  assert.equal(found.From.Name, "Brand App");
  assert.match(found.Text, /Your code is 493817\./);

  await smtpSend("app@brand.test", [to], invoice);
  const both = await a.waitForMessages({ query: `to:${to}`, count: 2, exact: true }, { timeout: 20000, interval: 200 });
  assert.equal(both.messages_count, 2);
  assert.equal(both.messages[0].Subject, "Invoice 9", JSON.stringify(both.messages.map((m) => [m.Subject, m.Created, m.ID]))); // newest first
  assert.equal(both.messages[0].Attachments, 1);
  assert.equal(both.messages[1].Read, true); // getMessageSummary read it

  const listed = await a.listMessages(0, 50);
  assert.equal(listed.total, 2);
  assert.equal(listed.messages.length, 2);
  assert.equal(listed.unread, 1);
  const page = await a.listMessages(1, 1);
  assert.equal(page.messages.length, 1);
  assert.equal(page.messages[0].Subject, "Welcome Ann");

  const search = await a.searchMessages({ query: "has:attachment invoice" });
  assert.equal(search.messages_count, 1);
  const id = search.messages[0].ID;
  assert.equal((await a.searchMessages({ query: '-subject:"Invoice 9"' })).messages_count, 1);

  const latest = await a.getMessageSummary();
  assert.equal(latest.ID, id);
  assert.equal(latest.MessageID, "Invoice9@brand.test");
  assert.equal(latest.Attachments.length, 1);
  const part = latest.Attachments[0];
  assert.equal(part.FileName, "invoice-9.pdf");
  assert.equal(part.ContentType, "application/pdf");
  assert.equal(part.Size, pdf.length);
  assert.equal(part.Checksums.SHA256, sha256(pdf));
  const blob = await a.getMessageAttachment(id, part.PartID);
  assert.equal(sha256(Buffer.from(await blob.arrayBuffer())), sha256(pdf));

  const headers = await a.getMessageHeaders(id);
  assert.deepEqual(headers.Subject, ["Invoice 9"]);
  assert.deepEqual(headers["Message-ID"], ["<Invoice9@brand.test>"]);
  const source = await a.getMessageSource(id);
  assert.equal(source.replace(/\r\n/g, "\n").trim(), invoice.trim());
  assert.match(await a.renderMessageHTML(id), /<p>Please find the invoice attached\.<\/p>/);
  assert.match(await a.renderMessageText(id), /Please find the invoice attached\./);

  assert.equal(await a.setReadStatus({ IDs: [id], Read: false }), "ok");
  const unread = await a.searchMessages({ query: "is:unread" });
  assert.deepEqual(unread.messages.map((m) => m.ID), [id]); // the other was read by its summary
  assert.equal(await a.setReadStatus({ Read: true }), "ok");
  assert.equal((await a.listMessages()).unread, 0);
  assert.deepEqual(await a.getTags(), []);
  assert.equal((await a.getInfo()).Messages, 2);
  assert.equal((await a.getConfiguration()).MessageRelay.Enabled, false);

  // The other namespace: nothing of A's, in any call.
  assert.equal((await b.listMessages()).total, 0);
  assert.equal((await b.searchMessages({ query: `to:${to}` })).messages_count, 0);
  await assert.rejects(b.getMessageSummary(id), /404/);
  await assert.rejects(b.getMessageSource(id), /404/);
  await assert.rejects(b.renderMessageHTML(id), /404/);
  assert.equal(await b.deleteMessages(), "ok");
  assert.equal((await a.listMessages()).total, 2);

  // Not offered: 501 naming the equivalent.
  await assert.rejects(a.linkCheck(id), /501.*GET \/v1\/messages/);
  await assert.rejects(a.sendMessage({ From: { Email: "x@y.test" }, To: [] }), /501/);
  await assert.rejects(a.htmlCheck(id), /501/);

  const wrong = new MailpitClient(URL, { auth: { username: "ci", password: "not-a-token" } });
  await assert.rejects(wrong.listMessages(), /401/);

  assert.equal(await a.deleteMessagesBySearch({ query: "subject:Welcome" }), "ok");
  assert.equal((await a.listMessages()).total, 1);
  assert.equal(await a.deleteMessages({ IDs: [id] }), "ok");
  assert.equal((await a.listMessages()).total, 0);
  await a.waitForMessages({ count: 0 }, { timeout: 2000, interval: 100 });
});
