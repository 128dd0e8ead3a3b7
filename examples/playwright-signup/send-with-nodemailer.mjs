// Send one email with nodemailer, as an application would: the options of
// nodemailer.createTransport() come as JSON in argv[2] (host, port, secure,
// requireTLS, auth, tls), the message as JSON in argv[3] (from, to, subject,
// text). Prints {"ok": true, "response": …} or {"ok": false, "code": …,
// "responseCode": …, "message": …} and exits 0 either way. Used by
// tests/clients/test_smtp_clients.py; not part of the example app.
import { readFileSync } from "node:fs";
import nodemailer from "nodemailer";

const options = JSON.parse(process.argv[2]);
const message = JSON.parse(process.argv[3]);
if (options.tls?.caFile) {
  options.tls.ca = readFileSync(options.tls.caFile);
  delete options.tls.caFile;
}
const transport = nodemailer.createTransport({ connectionTimeout: 15_000, ...options });
try {
  const info = await transport.sendMail(message);
  console.log(JSON.stringify({ ok: true, response: info.response }));
} catch (err) {
  console.log(
    JSON.stringify({
      ok: false,
      code: err.code ?? null,
      responseCode: err.responseCode ?? null,
      message: String(err.message ?? err),
    }),
  );
} finally {
  transport.close();
}
