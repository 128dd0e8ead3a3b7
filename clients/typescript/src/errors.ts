/**
 * The client's errors: one root, and a class per failure a caller handles.
 * Every error keeps the HTTP `status`, the API's error `code` and the decoded
 * `body` (when there was one), so a test can print exactly what the server said.
 */
import type { DeadLetter, MessageSummary, NearMiss, Receipt, SignalView } from "./types.js";

export interface ErrorDetails {
  status?: number | null;
  code?: string | null;
  body?: unknown;
  cause?: unknown;
}

/** Root of every error the Signalbox client throws. */
export class SignalboxError extends Error {
  readonly status: number | null;
  readonly code: string | null;
  readonly body: unknown;

  constructor(message: string, details: ErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = new.target.name;
    this.status = details.status ?? null;
    this.code = details.code ?? null;
    this.body = details.body;
  }
}

/** The token is missing or not valid (HTTP 401): check SIGNALBOX_TOKEN. */
export class Unauthorized extends SignalboxError {}

/** The token may not do this (HTTP 403): `ops_forbidden`, `recipient_not_owned`, … */
export class Forbidden extends Unauthorized {}

/** No such object in the token's namespace (HTTP 404). */
export class NotFound extends SignalboxError {}

/** The server refused the input (HTTP 400/422); `field` names the offending field. */
export class InvalidRequest extends SignalboxError {
  readonly field: string | null;

  constructor(message: string, details: ErrorDetails & { field?: string | null } = {}) {
    super(message, details);
    this.field = details.field ?? null;
  }
}

/**
 * An id or run id handed to the client is not well formed; nothing was sent.
 * Ids are checked by prefix (`sig_`, `clm_`, `dlq_`, `mbx_`) and character set
 * before they go into a URL, so a crafted id never reaches another route.
 */
export class InvalidId extends InvalidRequest {}

/** The request conflicts with the object's state (HTTP 409); `code` says which. */
export class Conflict extends SignalboxError {}

/** Another holder has an active lease on this signal's message. */
export class AlreadyClaimed extends Conflict {
  readonly claimId: string | null;
  readonly leaseUntil: string | null;
  readonly owner: string | null;

  constructor(
    message: string,
    details: ErrorDetails & { claimId?: string | null; leaseUntil?: string | null; owner?: string | null } = {},
  ) {
    super(message, details);
    this.claimId = details.claimId ?? null;
    this.leaseUntil = details.leaseUntil ?? null;
    this.owner = details.owner ?? null;
  }
}

/** The signal was already consumed; `receipt` is the existing receipt. */
export class AlreadyConsumed extends Conflict {
  readonly receipt: Receipt | null;

  constructor(message: string, details: ErrorDetails & { receipt?: Receipt | null } = {}) {
    super(message, details);
    this.receipt = details.receipt ?? null;
  }
}

/** The claim's lease lapsed before consume: a stale holder can never consume. */
export class LeaseExpired extends Conflict {}

/** The `runId` given is not the signal's run. */
export class RunMismatch extends Conflict {}

/** The idempotency key exists with another recipient, test case, filters, provider or expectation. */
export class IdempotencyConflict extends Conflict {}

/** A signal with `expect: "none"` (or one that ended `absent`/`arrived`) cannot be claimed. */
export class NotClaimable extends Conflict {}

/** A claim was attempted before a message matched (HTTP 202 `waiting`). */
export class SignalNotReady extends SignalboxError {
  readonly retryAfterSeconds: number | null;

  constructor(message: string, details: ErrorDetails & { retryAfterSeconds?: number | null } = {}) {
    super(message, details);
    this.retryAfterSeconds = details.retryAfterSeconds ?? null;
  }
}

/** A bound was reached (HTTP 429): `too_many_waiting`, `too_many_long_polls`, … */
export class RateLimited extends SignalboxError {
  readonly retryAfterSeconds: number | null;

  constructor(message: string, details: ErrorDetails & { retryAfterSeconds?: number | null } = {}) {
    super(message, details);
    this.retryAfterSeconds = details.retryAfterSeconds ?? null;
  }
}

/**
 * The signal ended without a usable message. `diagnosis` is the dead
 * letter's reason, recommendation and near misses as readable lines;
 * `deadLetter` the whole dead letter; `view` the signal's last view.
 */
export class SignalExpired extends SignalboxError {
  readonly deadLetter: DeadLetter | null;
  readonly view: SignalView | null;

  constructor(
    message: string,
    details: ErrorDetails & { deadLetter?: DeadLetter | null; view?: SignalView | null } = {},
  ) {
    super(message, details);
    this.deadLetter = details.deadLetter ?? null;
    this.view = details.view ?? null;
  }

  /** `deadline`, `check_budget`, `provider_errors`, `claims_exhausted`, `duplicate_messages`, … */
  get reason(): string | null {
    return this.deadLetter?.reason ?? this.view?.expiry_reason ?? null;
  }

  /** The server's one actionable sentence. */
  get recommendation(): string | null {
    return this.deadLetter?.recommendation ?? null;
  }

  /** Messages to the recipient that failed a rule, each with its `why`. */
  get nearMisses(): NearMiss[] {
    return this.deadLetter?.near_misses ?? [];
  }

  /** Why the email did not come, as lines a person reads in a test report. */
  get diagnosis(): string {
    return diagnosisText(this.deadLetter, this.view);
  }
}

/** Only a waiting, found or claimed signal can be cancelled (409 `not_cancellable`). */
export class NotCancellable extends Conflict {}

/** The signal was cancelled (its test ended or failed): nothing will match it. */
export class SignalCancelled extends SignalboxError {
  readonly view: SignalView;

  constructor(message: string, details: ErrorDetails & { view: SignalView }) {
    super(message, details);
    this.view = details.view;
  }

  /** The reason it was cancelled with (`test_failed`, `test_ended`, …). */
  get reason(): string | null {
    return this.view.cancellation?.reason ?? null;
  }
}

/** A signal with `expect: "none"` saw a matching message before its deadline (`arrived`). */
export class UnexpectedMessage extends SignalboxError {
  readonly view: SignalView;

  constructor(message: string, details: ErrorDetails & { view: SignalView }) {
    super(message, details);
    this.view = details.view;
  }

  /** The message that should not have come (its summary: no body, link or code). */
  get arrived(): MessageSummary | null {
    return this.view.message;
  }
}

/**
 * The wait's own `timeoutSeconds` passed while the signal was still waiting;
 * the signal is not expired. `view` is its last view, `expiresAt` when the
 * server will end it.
 */
export class WaitTimeout extends SignalboxError {
  readonly view: SignalView | null;
  readonly expiresAt: string | null;

  constructor(message: string, details: ErrorDetails & { view?: SignalView | null } = {}) {
    super(message, details);
    this.view = details.view ?? null;
    this.expiresAt = this.view?.expires_at ?? null;
  }
}

/** Signalbox could not be reached or kept failing (connection error, timeout, 5xx). */
export class ServiceUnavailable extends SignalboxError {}

/** The dead letter (and view) as readable lines: reason, recommendation, checks, near misses. */
export function diagnosisText(deadLetter: DeadLetter | null, view: SignalView | null): string {
  const lines: string[] = [];
  const reason = deadLetter?.reason ?? view?.expiry_reason ?? "unknown";
  const who = view ? ` (${view.test_case}, to ${view.recipient})` : "";
  lines.push(`signal ${deadLetter?.signal_id ?? view?.signal_id ?? "?"}${who} expired: ${reason}`);
  if (deadLetter?.recommendation) lines.push(`recommendation: ${deadLetter.recommendation}`);
  if (deadLetter?.checks) {
    const outcomes = Object.entries(deadLetter.checks.by_outcome ?? {})
      .filter(([, n]) => n > 0)
      .map(([k, n]) => `${k} ${n}`)
      .join(", ");
    lines.push(`checks: ${deadLetter.checks.total}${outcomes ? ` (${outcomes})` : ""}`);
  }
  const misses = deadLetter?.near_misses ?? [];
  if (misses.length) {
    lines.push("near misses:");
    for (const m of misses) {
      const also = m.also?.length ? ` (also ${m.also.join(", ")})` : "";
      lines.push(`  - ${m.why}${also}: ${JSON.stringify(m.subject ?? "")} received ${m.received_at}`);
    }
  } else if (deadLetter) {
    lines.push("near misses: none (no message to this recipient came near the window)");
  }
  if (deadLetter?.dead_letter_id) lines.push(`dead letter: ${deadLetter.dead_letter_id}`);
  return lines.join("\n");
}
