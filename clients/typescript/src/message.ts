/**
 * The whole message of a claim (`claim.message()`): every field of the
 * server's view, and `header(name)` / `attachment(filename)` as the Python
 * client has them. Every field is untrusted data from whoever sent the email.
 */
import { createHash } from "node:crypto";

import type { Signalbox } from "./client.js";
import { SignalboxError } from "./errors.js";
import type { MessageAddress, MessageAttachment, MessageLink, MessageView } from "./types.js";

/** One attachment of a claimed message; `read()` fetches its bytes, checked against `sha256`. */
export class Attachment implements MessageAttachment {
  readonly attachment_id: string;
  readonly filename: string | null;
  readonly content_type: string;
  readonly size: number;
  readonly sha256: string;
  readonly inline: boolean;
  readonly content_id: string | null;

  constructor(
    private readonly client: Signalbox,
    private readonly claimId: string,
    info: MessageAttachment,
  ) {
    this.attachment_id = info.attachment_id;
    this.filename = info.filename;
    this.content_type = info.content_type;
    this.size = info.size;
    this.sha256 = info.sha256;
    this.inline = info.inline;
    this.content_id = info.content_id;
  }

  /** The decoded bytes, while the claim is active; rejects if they are not the ones `sha256` names. */
  async read(): Promise<Uint8Array> {
    const bytes = await this.client.attachment(this.claimId, this.attachment_id);
    const digest = createHash("sha256").update(bytes).digest("hex");
    if (digest !== this.sha256) {
      throw new SignalboxError(`attachment ${this.attachment_id}: its bytes do not match sha256 ${this.sha256}`, {
        code: "attachment_mismatch",
      });
    }
    return bytes;
  }

  toJSON(): MessageAttachment {
    const { attachment_id, filename, content_type, size, sha256, inline, content_id } = this;
    return { attachment_id, filename, content_type, size, sha256, inline, content_id };
  }
}

export class Message implements MessageView {
  readonly message_id: string;
  readonly from: MessageAddress | null;
  readonly to: MessageAddress[];
  readonly cc: MessageAddress[];
  readonly reply_to: MessageAddress[];
  readonly subject: string | null;
  readonly date: string | null;
  readonly received_at: string;
  readonly headers: [string, string][];
  readonly text: string | null;
  readonly html: string | null;
  readonly links: MessageLink[];
  readonly codes: string[];
  readonly attachments: Attachment[];
  readonly size: number;
  readonly sha256: string;

  constructor(client: Signalbox, claimId: string, view: MessageView) {
    this.message_id = view.message_id;
    this.from = view.from ?? null;
    this.to = view.to ?? [];
    this.cc = view.cc ?? [];
    this.reply_to = view.reply_to ?? [];
    this.subject = view.subject ?? null;
    this.date = view.date ?? null;
    this.received_at = view.received_at;
    this.headers = Array.isArray(view.headers) ? view.headers : [];
    this.text = view.text ?? null;
    this.html = view.html ?? null;
    this.links = view.links ?? [];
    this.codes = view.codes ?? [];
    this.attachments = (view.attachments ?? []).map((a) => new Attachment(client, claimId, a));
    this.size = view.size;
    this.sha256 = view.sha256;
  }

  /** The first value of header `name` (case-insensitive), or null. */
  header(name: string): string | null {
    const wanted = name.toLowerCase();
    const found = this.headers.find(([n]) => n.toLowerCase() === wanted);
    return found ? found[1] : null;
  }

  /** Every value of header `name` (case-insensitive), in order. */
  headerValues(name: string): string[] {
    const wanted = name.toLowerCase();
    return this.headers.filter(([n]) => n.toLowerCase() === wanted).map(([, v]) => v);
  }

  /** The first attachment named `filename`, or null. */
  attachment(filename: string): Attachment | null {
    return this.attachments.find((a) => a.filename === filename) ?? null;
  }
}
