// A tiny signup web app: GET /signup shows a form; POST /signup mails a
// verification link over SMTP (Signalbox's sink by default); GET /verify
// checks the link's token. No dependencies: node:http and a few lines of SMTP.
//
//   SIGNALBOX_SMTP_HOST (127.0.0.1), SIGNALBOX_SMTP_PORT (2525), SIGNUP_PORT (8051)
//
// A request header X-Signalbox-Run is copied onto the email, so Signalbox can
// tie the email to the test run that caused it.
import { randomBytes, timingSafeEqual } from "node:crypto";
import http from "node:http";
import net from "node:net";
import { pathToFileURL } from "node:url";

export const SUBJECT = "Verify your Signup account";

const page = (title, body) =>
  `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${title}</title></head>` +
  `<body><main>${body}</main></body></html>`;

const escape = (s) => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

const FORM = page(
  "Sign up",
  `<h1>Create your account</h1>
   <form method="post" action="/signup">
     <label for="email">Email</label>
     <input id="email" name="email" type="email" required>
     <button type="submit">Sign up</button>
   </form>`,
);

/** Send one plain-text email over SMTP: the replies are read one by one. */
export async function sendMail({ host, port, from, to, subject, text, headers = {} }) {
  const socket = net.createConnection({ host, port });
  socket.setEncoding("utf8");
  socket.setTimeout(15_000, () => socket.destroy(new Error("SMTP server did not answer")));
  let buffer = "";
  const pending = [];
  const replies = [];
  socket.on("data", (chunk) => {
    buffer += chunk;
    let m;
    while ((m = /^(\d{3}) [^\n]*\n/m.exec(buffer))) {
      const reply = buffer.slice(0, m.index + m[0].length);
      buffer = buffer.slice(m.index + m[0].length);
      const waiter = pending.shift();
      if (waiter) waiter.resolve(reply);
      else replies.push(reply);
    }
  });
  const closed = new Promise((_, reject) => {
    socket.on("error", reject);
    socket.on("close", () => reject(new Error("SMTP connection closed")));
  });
  closed.catch(() => {});
  const expect = async (code) => {
    const reply = replies.shift() ?? (await Promise.race([new Promise((resolve) => pending.push({ resolve })), closed]));
    if (!reply.startsWith(String(code))) throw new Error(`SMTP: expected ${code}, got ${reply.trim()}`);
  };
  const message = [
    `From: ${from}`,
    `To: ${to}`,
    `Subject: ${subject}`,
    `Date: ${new Date().toUTCString()}`,
    `Message-ID: <${randomBytes(12).toString("hex")}@signup.example>`,
    ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`),
    "MIME-Version: 1.0",
    "Content-Type: text/plain; charset=utf-8",
    "Content-Transfer-Encoding: 7bit",
    "",
    ...text.split("\n"),
  ]
    .join("\r\n")
    .replace(/^\./gm, "..");
  try {
    await expect(220);
    for (const [command, code] of [
      ["EHLO signup.example", 250],
      [`MAIL FROM:<${from.replace(/^.*<|>.*$/g, "")}>`, 250],
      [`RCPT TO:<${to}>`, 250],
      ["DATA", 354],
      [`${message}\r\n.`, 250],
    ]) {
      socket.write(`${command}\r\n`);
      await expect(code);
    }
    socket.write("QUIT\r\n");
  } finally {
    socket.end();
  }
}

/** Start the app; resolves `{url, close()}`. */
export function startApp({
  port = Number(process.env.SIGNUP_PORT ?? 8051),
  smtpHost = process.env.SIGNALBOX_SMTP_HOST ?? "127.0.0.1",
  smtpPort = Number(process.env.SIGNALBOX_SMTP_PORT ?? 2525),
} = {}) {
  const users = new Map(); // email -> {token, verified}
  const server = http.createServer(async (req, res) => {
    const url = new URL(req.url, "http://app");
    const reply = (status, html) => {
      res.writeHead(status, { "Content-Type": "text/html; charset=utf-8" });
      res.end(html);
    };
    try {
      if (req.method === "GET" && (url.pathname === "/" || url.pathname === "/signup")) return reply(200, FORM);
      if (req.method === "POST" && url.pathname === "/signup") {
        let body = "";
        for await (const chunk of req) body += chunk;
        const email = new URLSearchParams(body).get("email")?.trim() ?? "";
        if (!/^[^@\s]+@[^@\s]+$/.test(email)) return reply(422, page("Sign up", "<p>Enter a valid email address.</p>"));
        const token = randomBytes(16).toString("base64url");
        users.set(email.toLowerCase(), { token, verified: false });
        const base = `http://${req.headers.host}`;
        const run = req.headers["x-signalbox-run"];
        await sendMail({
          host: smtpHost,
          port: smtpPort,
          from: "Signup <noreply@signup.example>",
          to: email,
          subject: SUBJECT,
          text: `Welcome to Signup!\n\nConfirm your address: ${base}/verify?token=${token}\n`,
          headers: typeof run === "string" && /^[A-Za-z0-9._:-]{1,128}$/.test(run) ? { "X-Signalbox-Run": run } : {},
        });
        return reply(201, page("Check your inbox", `<h1>Check your inbox</h1><p>We sent a link to ${escape(email)}.</p>`));
      }
      if (req.method === "GET" && url.pathname === "/verify") {
        const given = Buffer.from(url.searchParams.get("token") ?? "");
        for (const [email, user] of users) {
          const want = Buffer.from(user.token);
          if (want.length === given.length && timingSafeEqual(want, given)) {
            user.verified = true;
            return reply(200, page("Verified", `<h1>Your address is verified</h1><p>${escape(email)}</p>`));
          }
        }
        return reply(404, page("Unknown link", "<h1>This link is not valid</h1>"));
      }
      reply(404, page("Not found", "<h1>Not found</h1>"));
    } catch (error) {
      reply(502, page("Error", `<p>Could not send the email: ${escape(String(error.message ?? error))}</p>`));
    }
  });
  return new Promise((resolve) => {
    server.listen(port, "127.0.0.1", () => {
      const { port: bound } = server.address();
      resolve({ url: `http://127.0.0.1:${bound}`, close: () => new Promise((r) => server.close(r)) });
    });
  });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const app = await startApp();
  console.log(`signup app on ${app.url}`);
}
