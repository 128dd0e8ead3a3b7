// What the client's tests share: the live stack's address, mail over SMTP to
// its sink, the OpenAPI document, and fetch wrappers that lose answers.
import net from "node:net";
import { randomBytes } from "node:crypto";

export const URL_ = process.env.SIGNALBOX_URL;
export const TOKEN = process.env.SIGNALBOX_TOKEN;
export const SMTP_HOST = process.env.SIGNALBOX_SMTP_HOST ?? "127.0.0.1";
export const SMTP_PORT = Number(process.env.SIGNALBOX_SMTP_PORT ?? 2525);

if (!URL_ || !TOKEN) {
  throw new Error("set SIGNALBOX_URL and SIGNALBOX_TOKEN (and SIGNALBOX_SMTP_PORT) to a running stack");
}

/** A run id of its own for each test. */
export function runId(name) {
  return `node-${name}-${randomBytes(4).toString("hex")}`;
}

/** Send one message to the sink over SMTP (CRLF line ends, dot-stuffed). */
export async function sendMail({ to, subject, text, from = "app@example.test", headers = {}, raw = null }) {
  const lines = raw ?? [
    `From: ${from}`,
    `To: ${to}`,
    `Subject: ${subject}`,
    `Message-ID: <${randomBytes(8).toString("hex")}@example.test>`,
    `Date: ${new Date().toUTCString()}`,
    ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`),
    "MIME-Version: 1.0",
    "Content-Type: text/plain; charset=utf-8",
    "",
    ...text.split("\n"),
  ].join("\r\n");
  const data = lines.replace(/^\./gm, "..");
  const socket = net.createConnection({ host: SMTP_HOST, port: SMTP_PORT });
  socket.setEncoding("utf8");
  let buffer = "";
  const waiters = [];
  socket.on("data", (chunk) => {
    buffer += chunk;
    // A reply is complete at a line "NNN text" (not "NNN-text").
    let match;
    while ((match = /^(\d{3}) [^\r\n]*\r?\n/m.exec(buffer))) {
      const end = match.index + match[0].length;
      const reply = buffer.slice(0, end);
      buffer = buffer.slice(end);
      waiters.shift()?.resolve(reply);
    }
  });
  const failed = new Promise((_, reject) => socket.on("error", reject));
  const reply = () => Promise.race([new Promise((resolve, reject) => waiters.push({ resolve, reject })), failed]);
  const expect = async (code) => {
    const text = await reply();
    if (!text.startsWith(String(code))) throw new Error(`SMTP: expected ${code}, got ${text.trim()}`);
  };
  try {
    await expect(220);
    socket.write("EHLO tests.example\r\n");
    await expect(250);
    socket.write(`MAIL FROM:<${from}>\r\n`);
    await expect(250);
    socket.write(`RCPT TO:<${to}>\r\n`);
    await expect(250);
    socket.write("DATA\r\n");
    await expect(354);
    socket.write(`${data}\r\n.\r\n`);
    await expect(250);
    socket.write("QUIT\r\n");
  } finally {
    socket.end();
  }
}

let openapi;
/** The server's OpenAPI document (fetched once). */
export async function openApi() {
  openapi ??= await (await fetch(`${URL_}/openapi.json`)).json();
  return openapi;
}

/** Whether the server has `method path` (an OpenAPI path template). */
export async function hasRoute(method, path) {
  const doc = await openApi();
  return Boolean(doc.paths?.[path]?.[method.toLowerCase()]);
}

/** Whether schema `name` of the OpenAPI document has property `field`. */
export async function hasField(name, field) {
  const doc = await openApi();
  return Boolean(doc.components?.schemas?.[name]?.properties?.[field]);
}

/** A fetch that records every request and, per `plan(request, n)`, fails some. */
export function scriptedFetch(plan = () => "pass") {
  const calls = [];
  const wrapped = async (url, init) => {
    const n = calls.length;
    calls.push({ method: init?.method ?? "GET", url: String(url) });
    const what = plan({ method: init?.method ?? "GET", url: new URL(String(url)) }, n);
    if (what === "refuse") throw new TypeError("fetch failed", { cause: Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }) });
    if (what === "503") return new Response(JSON.stringify({ error: { code: "unavailable", message: "scripted" } }), { status: 503 });
    const response = await fetch(url, init);
    if (what === "lose") {
      // The server did the work; its answer is lost on the way back.
      await response.arrayBuffer();
      throw new TypeError("fetch failed", { cause: Object.assign(new Error("socket hang up"), { code: "ECONNRESET" }) });
    }
    return response;
  };
  wrapped.calls = calls;
  return wrapped;
}
