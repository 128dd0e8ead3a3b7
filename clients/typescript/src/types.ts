/**
 * The API's JSON objects, field for field as the server sends them
 * (snake_case, timestamps as ISO-8601 strings with `Z`). See the
 * repository's docs/api.md, and the OpenAPI document at `GET /openapi.json`:
 * the request bodies below are checked against its schemas, and the views
 * against live answers, by test/openapi.test.mjs.
 *
 * A field marked optional (`?`) is one a server of an older version may not
 * send yet; read it as possibly `undefined`.
 */

/** Where a signal is in its life. */
export type SignalStatus =
  | "waiting"
  | "found"
  | "claimed"
  | "consumed"
  | "expired"
  | "absent"
  | "arrived"
  | "cancelled";

/** What to act on: the status, except `provider_error` while the latest check failed. */
export type SignalResult = SignalStatus | "provider_error";

/** What a signal asserts: the first match (default), exactly one, or none at all. */
export type Expect = "first" | "exactly_one" | "none";

/** `POST /v1/signals` (schema `SignalCreate`). */
export interface SignalCreate {
  run_id: string;
  test_case: string;
  recipient: string;
  subject_contains?: string | null;
  body_contains?: string | null;
  received_after?: string | null;
  expires_in_seconds?: number;
  max_checks?: number;
  provider?: string;
  require_run_marker?: boolean;
  metadata?: Record<string, unknown>;
  expect?: Expect;
  settle_seconds?: number;
}

/** `POST /v1/signals/{signal_id}/claim` (schema `ClaimCreate`). */
export interface ClaimCreate {
  run_id: string;
  lease_seconds?: number;
  owner?: string;
}

/** `POST /v1/claims/{claim_id}/extend` (schema `ClaimExtend`). */
export interface ClaimExtend {
  lease_seconds?: number;
}

/** `POST /v1/mailboxes` (schema `MailboxCreate`). */
export interface MailboxCreate {
  run_id: string;
  provider?: string;
}

/** A fresh isolated address: no earlier message can match it. */
export interface Mailbox {
  mailbox_id: string;
  run_id: string;
  address: string;
  provider: string;
  created_at: string;
  expires_at: string | null;
}

export interface LastCheck {
  at: string | null;
  outcome: string | null;
  error_code: string | null;
}

/** The matched message in a signal view: never its body, links or codes. */
export interface MessageSummary {
  message_id: string;
  received_at: string;
  subject: string | null;
  recipient: string | null;
  run_marker: string | null;
}

export interface ClaimState {
  claim_id: string;
  message_id: string;
  claimed_at: string;
  lease_until: string | null;
  owner?: string | null;
}

export interface Warning {
  code: string;
  field?: string;
  suggestion?: string;
}

/** `GET /v1/signals/{signal_id}`: one expected email for one run, as the server sees it now. */
export interface SignalView {
  signal_id: string;
  run_id: string;
  test_case: string;
  status: SignalStatus;
  result: SignalResult;
  expiry_reason: string | null;
  recipient: string;
  subject_contains: string | null;
  body_contains: string | null;
  provider: string;
  require_run_marker: boolean;
  metadata: Record<string, unknown>;
  created_at: string;
  received_after: string;
  expires_at: string;
  found_at: string | null;
  checks: number;
  max_checks: number;
  /** A polling hint: when the next look is due. Never the time left to the deadline. */
  retry_after_seconds: number | null;
  last_check: LastCheck | null;
  message: MessageSummary | null;
  claim: ClaimState | null;
  receipt: Receipt | null;
  /** The dead letter once expired: its id, or the whole view. */
  dead_letter: DeadLetter | string | null;
  expect?: Expect;
  settle_seconds?: number | null;
  warnings?: Warning[];
  /** Once expired: the dead letter's recommendation. */
  recommendation?: string | null;
  /** A `cancelled` signal's reason and when (`POST /v1/signals/{id}/cancel`). */
  cancellation?: { reason: string; cancelled_at: string } | null;
}

export interface ReceiptEvidence {
  claim_id: string;
  /** The recipient as a keyed hash (see docs/api.md, Evidence). */
  recipient_hash: string;
  recipient: string;
  subject: string;
  body: string;
  run_marker: string;
  received_at: string;
  received_after: string;
  provider: string;
  message_sha256?: string;
  attachments?: { filename: string; content_type: string; size: number; sha256: string }[];
}

/** Proof of consumption: which message, why it belongs to the run, when. */
export interface Receipt {
  receipt_id: string;
  signal_id: string;
  claim_id: string;
  run_id: string;
  message_id: string;
  claimed_at: string;
  consumed_at: string;
  evidence: ReceiptEvidence;
  owner?: string | null;
}

/** A message to the recipient that failed a rule (`why`; `also` the other rules it failed). */
export interface NearMiss {
  message_id: string;
  received_at: string;
  subject: string | null;
  why: string;
  also?: string[];
}

/** A signal that ended without being consumed, with its diagnosis. */
export interface DeadLetter {
  dead_letter_id: string;
  signal_id: string;
  run_id: string;
  /** Shown to operators. */
  namespace?: string;
  reason: string;
  state: string;
  created_at: string;
  resolved_at: string | null;
  provider: string;
  checks: { total: number; by_outcome: Record<string, number> };
  last_error_code: string | null;
  near_misses: NearMiss[];
  recommendation: string | null;
  /** For `duplicate_messages`: the messages and how far apart they came. */
  duplicates?: Record<string, unknown> | null;
  /** The first message that matched after the deadline, if one came. */
  late_message?: Record<string, unknown> | null;
  note: string | null;
}

/** The 200 of `POST /v1/signals/{signal_id}/claim` (and of `GET /v1/claims/{claim_id}`). */
export interface ClaimBody {
  status: "claimed";
  claim_id: string;
  signal_id: string;
  message_id: string;
  lease_until: string;
  claims_left: number;
  subject: string | null;
  received_at: string;
  body_excerpt: string;
  links: string[];
  codes: string[];
  content_purged: boolean;
  owner?: string | null;
}

/** An address of a message header, its display name decoded. */
export interface MessageAddress {
  name: string;
  address: string;
}

export interface MessageLink {
  url: string;
  text: string;
}

export interface MessageAttachment {
  attachment_id: string;
  filename: string | null;
  content_type: string;
  size: number;
  sha256: string;
  inline: boolean;
  content_id: string | null;
}

/**
 * `GET /v1/claims/{claim_id}/message`: the whole message, while the claim is active.
 * Every field is untrusted data from whoever sent the email.
 */
export interface MessageView {
  message_id: string;
  from: MessageAddress | null;
  to: MessageAddress[];
  cc: MessageAddress[];
  reply_to: MessageAddress[];
  subject: string | null;
  date: string | null;
  received_at: string;
  headers: [string, string][];
  text: string | null;
  html: string | null;
  links: MessageLink[];
  codes: string[];
  attachments: MessageAttachment[];
  size: number;
  sha256: string;
}

/** One signal in a run's evidence. */
export interface EvidenceSignal {
  signal_id: string;
  test_case: string;
  status: SignalStatus;
  result: SignalResult;
  expiry_reason: string | null;
  provider: string;
  recipient_hash: string;
  filters: { subject_contains: boolean; body_contains: boolean; require_run_marker: boolean };
  metadata: Record<string, unknown>;
  timings: Record<string, string | number | null>;
  checks: { total: number; by_outcome: Record<string, number>; max_checks: number };
  message: Record<string, unknown> | null;
  receipt: Receipt | null;
  dead_letter: Record<string, unknown> | null;
  /** `expect`, and for `none` whether it held. */
  expectation?: Record<string, unknown> | null;
}

/** `GET /v1/runs/{run_id}/evidence`: the run's CI artifact, no body, link, code or token. */
export interface Evidence {
  run_id: string;
  generated_at: string;
  summary: { signals: number; by_status: Record<string, number> };
  signals: EvidenceSignal[];
}

/** One page of a list route; pass `next_cursor` back for the next one. */
export interface Page<T> {
  items: T[];
  next_cursor: string | null;
}
