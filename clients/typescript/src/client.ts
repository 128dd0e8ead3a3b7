/**
 * The client: `new Signalbox({url, token})`, then `watch(...)` → a handle to
 * `wait()` on and `claim()`; a claim's `links`, `codes`, `message()`,
 * `consume()` and `release()`.
 *
 * ```ts
 * const sb = new Signalbox();                       // SIGNALBOX_URL / SIGNALBOX_TOKEN
 * const box = await sb.mailbox({ runId: "ci-4711" });
 * const handle = await sb.watch({ runId: "ci-4711", testCase: "signup", recipient: box.address });
 * // … make the application send the email …
 * await handle.wait();                              // rejects with SignalExpired (and its diagnosis)
 * const claim = await handle.claim();
 * await page.goto(claim.links[0]);
 * await claim.consume();
 * ```
 */
import { Claim, SignalHandle } from "./handles.js";
import { Message } from "./message.js";
import {
  SignalboxError,
  SignalCancelled,
  SignalExpired,
  SignalNotReady,
  RateLimited,
  UnexpectedMessage,
  WaitTimeout,
} from "./errors.js";
import {
  Transport,
  checkedId,
  checkedRunId,
  idPath,
  longPollSeconds,
  LONG_POLL_MARGIN_SECONDS,
  segment,
  sleep,
  type Call,
} from "./http.js";
import type {
  ClaimBody,
  DeadLetter,
  Evidence,
  Mailbox,
  MessageView,
  Page,
  Receipt,
  SignalCreate,
  SignalView,
} from "./types.js";

export { Claim, SignalHandle };
import type {
  ClaimOptions,
  Listener,
  SignalboxEvent,
  SignalboxOptions,
  WaitOptions,
  WatchOptions,
} from "./options.js";

export const DEFAULT_URL = "http://127.0.0.1:8040";
export const DEFAULT_HTTP_TIMEOUT_MS = 30_000;
export const DEFAULT_RETRIES = 2;
/** A wait with no timeout gives up this long after the signal's deadline if the
 * server still has not ended it (its workers are not running). */
export const DEADLINE_GRACE_SECONDS = 30;
const PENDING = new Set(["waiting", "provider_error"]);
/** The first long poll of a wait without a timeout (before the deadline is known). */
const SERVER_FIRST_POLL = 60;
const VERSION = "0.1.0";


function env(name: string): string | undefined {
  const value = typeof process !== "undefined" ? process.env?.[name] : undefined;
  return value ? value : undefined;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null;
}

export class Signalbox {
  readonly url: string;
  readonly token: string | null;
  readonly runId: string | undefined;
  readonly testCase: string | undefined;
  private readonly transport: Transport;
  private readonly listeners = new Set<Listener>();

  constructor(options: SignalboxOptions = {}) {
    this.url = (options.url ?? env("SIGNALBOX_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
    this.token = options.token ?? env("SIGNALBOX_TOKEN") ?? null;
    this.runId = options.runId === undefined ? undefined : checkedRunId(options.runId);
    this.testCase = options.testCase;
    const f = options.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new SignalboxError("no global fetch: Node 20 or later is needed");
    this.transport = new Transport({
      url: this.url,
      token: this.token,
      timeoutMs: options.timeoutMs ?? DEFAULT_HTTP_TIMEOUT_MS,
      retries: options.retries ?? DEFAULT_RETRIES,
      fetch: f,
      userAgent: `signalbox-client-js/${VERSION}`,
    });
  }

  /** Listen to signals created, receipts and expiries; returns the unsubscribe function. */
  on(listener: Listener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  protected emit(event: SignalboxEvent): void {
    for (const listener of [...this.listeners]) listener(event);
  }

  /** One call's decoded body (see `Transport.send`). */
  protected async body<T>(call: Call, signal?: AbortSignal): Promise<T> {
    return (await this.transport.send<T>(call, signal)).body;
  }

  protected runIdOf(runId: string | undefined): string {
    const value = runId ?? this.runId;
    if (value === undefined) throw new SignalboxError("no runId: pass one, or give the client a default runId");
    return checkedRunId(value);
  }

  // --- mailboxes ---------------------------------------------------------------

  /** A fresh, isolated address for the run: no earlier message can match it. */
  async mailbox(options: { runId?: string; provider?: string } = {}): Promise<Mailbox> {
    // Each POST makes a new address, so a blind retry could make two: not retried.
    return this.body<Mailbox>({
      method: "POST",
      path: "/v1/mailboxes",
      json: { run_id: this.runIdOf(options.runId), provider: options.provider ?? "sink" },
    });
  }

  /** Purge a mailbox's messages (receipts and evidence stay). */
  async deleteMailbox(mailboxId: string): Promise<void> {
    await this.body({ method: "DELETE", path: idPath("/v1/mailboxes/{}", ["mailbox", mailboxId]), retry: true });
  }

  // --- signals -------------------------------------------------------------------

  /**
   * Declare one expected email and return a handle to wait on. Watch before
   * acting: the window opens when the signal is created.
   *
   * Idempotent: the same key (`idempotencyKey`, else `run_id:test_case`)
   * returns the existing signal (`handle.created` is then false); with other
   * filters it rejects with `IdempotencyConflict`.
   */
  async watch(options: WatchOptions): Promise<SignalHandle> {
    const testCase = options.testCase ?? this.testCase;
    if (!testCase) throw new SignalboxError("no testCase: pass one, or give the client a default testCase");
    const body: SignalCreate = { run_id: this.runIdOf(options.runId), test_case: testCase, recipient: options.recipient };
    const optional: Partial<SignalCreate> = {
      subject_contains: options.subjectContains,
      body_contains: options.bodyContains,
      received_after: options.receivedAfter instanceof Date ? options.receivedAfter.toISOString() : options.receivedAfter,
      expires_in_seconds: options.expiresInSeconds,
      max_checks: options.maxChecks,
      provider: options.provider,
      require_run_marker: options.requireRunMarker || undefined,
      metadata: options.metadata,
      expect: options.expect,
      settle_seconds: options.settleSeconds,
    };
    for (const [key, value] of Object.entries(optional)) {
      if (value !== undefined && value !== null) (body as unknown as Record<string, unknown>)[key] = value;
    }
    const headers: Record<string, string> = options.idempotencyKey ? { "Idempotency-Key": options.idempotencyKey } : {};
    // Idempotent by key, so a retry after a lost answer returns the same signal.
    const answer = await this.transport.send<SignalView>({ method: "POST", path: "/v1/signals", json: body, headers, retry: true });
    const created = answer.status === 201;
    this.emit({ type: "signal", view: answer.body, created });
    return new SignalHandle(this, answer.body, created);
  }

  /** Assert that no matching email arrives before the deadline: `wait()` resolves
   * with the `absent` view, or rejects with `UnexpectedMessage` as soon as one arrives. */
  async expectNone(options: Omit<WatchOptions, "expect" | "settleSeconds">): Promise<SignalHandle> {
    return this.watch({ ...options, expect: "none" });
  }

  /** Assert exactly one matching email: `wait()` resolves once one came and no
   * second one within `settleSeconds`; a second → `SignalExpired` (`duplicate_messages`). */
  async expectExactlyOne(options: Omit<WatchOptions, "expect">): Promise<SignalHandle> {
    return this.watch({ ...options, expect: "exactly_one" });
  }

  /** The signal's current view; with `waitSeconds` (≤ 60) a long poll. */
  async getSignal(signalId: string, options: { waitSeconds?: number; signal?: AbortSignal } = {}): Promise<SignalView> {
    const wait = options.waitSeconds ?? 0;
    return this.body<SignalView>(
      {
        method: "GET",
        path: idPath("/v1/signals/{}", ["signal", signalId]),
        query: wait ? { wait } : {},
        retry: true,
        timeoutMs: wait ? (wait + LONG_POLL_MARGIN_SECONDS) * 1000 : undefined,
      },
      options.signal,
    );
  }

  /** A handle on an existing signal (one GET). */
  async signal(signalId: string): Promise<SignalHandle> {
    return new SignalHandle(this, await this.getSignal(signalId), false);
  }

  /** Every signal of a run (all pages). */
  async signals(runId?: string): Promise<SignalView[]> {
    const out: SignalView[] = [];
    let cursor: string | null = null;
    do {
      const page: Page<SignalView> = await this.body({
        method: "GET",
        path: "/v1/signals",
        query: { run_id: this.runIdOf(runId), cursor },
        retry: true,
      });
      out.push(...page.items);
      cursor = page.next_cursor;
    } while (cursor);
    return out;
  }

  /**
   * Wait until the signal leaves `waiting`, resuming the server's long poll
   * (≤ 60 s a request). Resolves with the view once `found` (or `claimed`,
   * `consumed`, `absent`); rejects with `SignalExpired` (with the diagnosis)
   * when it expired, `UnexpectedMessage` when an `expect: "none"` signal saw
   * a match, `WaitTimeout` when `timeoutSeconds` passed first.
   */
  async wait(signalId: string, options: WaitOptions = {}): Promise<SignalView> {
    checkedId("signal", signalId);
    const deadline = options.timeoutSeconds === undefined ? null : Date.now() + options.timeoutSeconds * 1000;
    let view: SignalView | null = null;
    for (;;) {
      const remaining = deadline !== null ? (deadline - Date.now()) / 1000 : untilEnd(view);
      const n = remaining > 0 ? longPollSeconds(remaining) : 0;
      const started = Date.now();
      try {
        view = await this.getSignal(signalId, { waitSeconds: n, signal: options.signal });
      } catch (error) {
        // The server bounds concurrent long polls: back off as it says, then go on.
        if (!(error instanceof RateLimited)) throw error;
        await sleep(1000 * Math.max(1, error.retryAfterSeconds ?? 1), options.signal);
        continue;
      }
      options.onPoll?.(view);
      if (view.result === "expired") throw await this.expired(view);
      if (view.result === "arrived") {
        const error = new UnexpectedMessage(
          `signal ${view.signal_id} (${view.test_case}) expected no email to ${view.recipient}, ` +
            `but one arrived: ${JSON.stringify(view.message?.subject ?? "")} at ${view.message?.received_at ?? "?"}`,
          { view, code: "arrived" },
        );
        this.emit({ type: "arrived", error });
        throw error;
      }
      if (view.result === "cancelled") {
        throw new SignalCancelled(
          `signal ${view.signal_id} (${view.test_case}) was cancelled (${view.cancellation?.reason ?? "no reason"})`,
          { view, code: "cancelled" },
        );
      }
      if (!PENDING.has(view.result)) return view;
      const now = Date.now();
      if (deadline !== null && now >= deadline) {
        throw new WaitTimeout(
          `signal ${signalId} still ${view.result} after ${options.timeoutSeconds}s; it expires at ${view.expires_at}`,
          { view, code: "wait_timeout" },
        );
      }
      if (deadline === null && untilEnd(view) <= 0) {
        throw new WaitTimeout(
          `signal ${signalId} still ${view.result} ${DEADLINE_GRACE_SECONDS}s after its deadline ` +
            `${view.expires_at}: is a Signalbox worker running?`,
          { view, code: "wait_timeout" },
        );
      }
      if (now - started < n * 1000 - 500) {
        // The server answered early without a change: do not spin.
        const left = deadline !== null ? deadline - now : untilEnd(view) * 1000;
        await sleep(Math.max(0, Math.min(1000 * (view.retry_after_seconds || 1), left)), options.signal);
      }
    }
  }

  /** The error for an expired view, with the dead letter's diagnosis fetched. */
  protected async expired(view: SignalView): Promise<SignalExpired> {
    let deadLetter: unknown = view.dead_letter;
    // The dead letter is recorded just after expiry; give it a moment to appear.
    for (let i = 0; i < 3 && !deadLetter; i++) {
      await sleep(500);
      view = await this.getSignal(view.signal_id);
      deadLetter = view.dead_letter;
    }
    let full: DeadLetter | null = isObject(deadLetter) ? (deadLetter as unknown as DeadLetter) : null;
    const id = typeof deadLetter === "string" ? deadLetter : full?.dead_letter_id;
    if ((!full || !full.reason) && id) {
      try {
        full = await this.deadLetter(id);
      } catch {
        // The view's reason still says why; the diagnosis is a bonus here.
      }
    }
    const reason = full?.reason ?? view.expiry_reason ?? "unknown";
    const recommendation = full?.recommendation ? `: ${full.recommendation}` : "";
    const error = new SignalExpired(
      `signal ${view.signal_id} (${view.test_case}) expired (${reason})${recommendation}`,
      { code: "expired", body: view, deadLetter: full, view },
    );
    this.emit({ type: "expired", error });
    return error;
  }

  // --- claims --------------------------------------------------------------------

  /**
   * Lease the signal's message. Rejects with `AlreadyClaimed`, `AlreadyConsumed`,
   * `RunMismatch`, `NotClaimable`, `SignalNotReady` (no match yet) or `SignalExpired`.
   */
  async claim(signalId: string, options: ClaimOptions = {}): Promise<Claim> {
    const json: Record<string, unknown> = {
      run_id: this.runIdOf(options.runId),
      lease_seconds: options.leaseSeconds ?? 90,
    };
    if (options.owner !== undefined) json.owner = options.owner;
    // Never retried: a lost 200 would look like `already_claimed` on the second try.
    const answer = await this.transport.send<Record<string, unknown>>({
      method: "POST",
      path: idPath("/v1/signals/{}/claim", ["signal", signalId]),
      json,
    });
    if (answer.status === 202 || answer.body?.status === "waiting") {
      const retry = answer.body?.retry_after_seconds;
      throw new SignalNotReady(`signal ${signalId} has no matching message yet`, {
        status: answer.status,
        code: "waiting",
        body: answer.body,
        retryAfterSeconds: typeof retry === "number" ? retry : null,
      });
    }
    return new Claim(this, answer.body as unknown as ClaimBody);
  }

  /** The claim's content again, while it is active (after a lost answer). */
  async getClaim(claimId: string): Promise<Claim> {
    const body = await this.body<ClaimBody>({ method: "GET", path: idPath("/v1/claims/{}", ["claim", claimId]), retry: true });
    return new Claim(this, body);
  }

  /**
   * The whole message of an active claim: headers, text, HTML, links,
   * attachments; `header(name)` and `attachment(filename)` find one.
   */
  async message(claimId: string): Promise<Message> {
    const view = await this.body<MessageView>({ method: "GET", path: idPath("/v1/claims/{}/message", ["claim", claimId]), retry: true });
    return new Message(this, claimId, view);
  }

  /**
   * End a signal its test no longer waits for: `cancelled` (final, no dead
   * letter; an active claim ends). Again → the same view; a signal that
   * ended otherwise rejects with `NotCancellable`.
   */
  async cancel(signalId: string, reason = "cancelled"): Promise<SignalView> {
    const path = idPath("/v1/signals/{}/cancel", ["signal", signalId]);
    return this.body<SignalView>({ method: "POST", path, json: { reason }, retry: true });
  }

  /** One attachment's decoded bytes. */
  async attachment(claimId: string, attachmentId: string): Promise<Uint8Array> {
    const path = idPath("/v1/claims/{}/attachments/{}", ["claim", claimId], ["attachment", attachmentId]);
    return this.body<Uint8Array>({ method: "GET", path, retry: true, binary: true });
  }

  /** The message's bytes as received (`message/rfc822`). */
  async raw(claimId: string): Promise<Uint8Array> {
    return this.body<Uint8Array>({ method: "GET", path: idPath("/v1/claims/{}/raw", ["claim", claimId]), retry: true, binary: true });
  }

  /** Consume a claim for its receipt (again: the same receipt). `LeaseExpired` after the lease lapsed. */
  async consume(claimId: string): Promise<Receipt> {
    // Consuming again returns the same receipt, so a retry is harmless.
    const receipt = await this.body<Receipt>({ method: "POST", path: idPath("/v1/claims/{}/consume", ["claim", claimId]), retry: true });
    this.emit({ type: "receipt", receipt });
    return receipt;
  }

  /** Give the message back: the signal is `found` again. */
  async release(claimId: string): Promise<SignalView> {
    return this.body<SignalView>({ method: "POST", path: idPath("/v1/claims/{}/release", ["claim", claimId]) });
  }

  /** Extend a lease; resolves the new `lease_until`. */
  async extend(claimId: string, leaseSeconds = 90): Promise<string | null> {
    const body = await this.body<Record<string, unknown>>({
      method: "POST",
      path: idPath("/v1/claims/{}/extend", ["claim", claimId]),
      json: { lease_seconds: leaseSeconds },
    });
    return typeof body?.lease_until === "string" ? body.lease_until : null;
  }

  // --- evidence and dead letters -----------------------------------------------

  /** The run's evidence artifact (no body, link, code or token in it). */
  async evidence(runId?: string): Promise<Evidence> {
    return this.body<Evidence>({ method: "GET", path: `/v1/runs/${segment(this.runIdOf(runId))}/evidence`, retry: true });
  }

  /** One dead letter with its diagnosis. */
  async deadLetter(deadLetterId: string): Promise<DeadLetter> {
    return this.body<DeadLetter>({ method: "GET", path: idPath("/v1/dead-letters/{}", ["dead_letter", deadLetterId]), retry: true });
  }

  /** One page of dead letters. */
  async deadLetters(
    filter: { state?: string; reason?: string; provider?: string; runId?: string; cursor?: string; limit?: number } = {},
  ): Promise<Page<DeadLetter>> {
    return this.body<Page<DeadLetter>>({
      method: "GET",
      path: "/v1/dead-letters",
      query: {
        state: filter.state ?? "open",
        reason: filter.reason,
        provider: filter.provider,
        run_id: filter.runId === undefined ? undefined : checkedRunId(filter.runId),
        cursor: filter.cursor,
        limit: filter.limit,
      },
      retry: true,
    });
  }
}

/** Seconds until a wait without a timeout gives up: the deadline plus a grace. */
function untilEnd(view: SignalView | null): number {
  if (!view) return SERVER_FIRST_POLL;
  const end = Date.parse(view.expires_at);
  if (Number.isNaN(end)) return SERVER_FIRST_POLL;
  return (end - Date.now()) / 1000 + DEADLINE_GRACE_SECONDS;
}
