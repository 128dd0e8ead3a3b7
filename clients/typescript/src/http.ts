/**
 * One HTTP call to the API: ids checked and every path segment encoded, the
 * retry policy (only where repeating is harmless), and a non-2xx answer
 * turned into the client's error. The same rules as the Python client.
 */
import * as errors from "./errors.js";
import type { DeadLetter, Receipt } from "./types.js";

/** The server answers a long poll after at most this many seconds. */
export const SERVER_MAX_WAIT = 60;
/** Extra time allowed on top of a long poll's `wait` before the request is abandoned. */
export const LONG_POLL_MARGIN_SECONDS = 15;
/** Pauses before retry number 0, 1, 2, … */
export const RETRY_BACKOFF_SECONDS = [0.25, 1, 2];

/** One request, and whether repeating it after a connection error or a 5xx is harmless. */
export interface Call {
  method: "GET" | "POST" | "PUT" | "DELETE";
  path: string;
  query?: Record<string, string | number | undefined | null>;
  json?: unknown;
  headers?: Record<string, string>;
  /** Safe to repeat: GETs, the idempotent create, consume. Never claim or mailbox creation. */
  retry?: boolean;
  timeoutMs?: number;
  /** The answer is bytes, not JSON (attachments, raw). */
  binary?: boolean;
}

export interface Answer<T = unknown> {
  status: number;
  body: T;
  headers: Headers;
}

// --- ids in paths --------------------------------------------------------------

export const ID_PREFIXES = { signal: "sig_", claim: "clm_", dead_letter: "dlq_", mailbox: "mbx_" } as const;
export type IdKind = keyof typeof ID_PREFIXES;
const ID_BODY = /^[A-Za-z0-9_-]{1,128}$/;
const RUN_ID = /^[A-Za-z0-9._:-]{1,128}$/;

function shown(value: unknown): string {
  const text = typeof value === "string" ? JSON.stringify(value) : String(value);
  return text.length <= 60 ? text : `${text.slice(0, 57)}...`;
}

/** `value` if it is a well-formed id of `kind`, else `InvalidId` (nothing is sent). */
export function checkedId(kind: IdKind, value: unknown): string {
  const prefix = ID_PREFIXES[kind];
  if (typeof value === "string" && value.startsWith(prefix) && ID_BODY.test(value.slice(prefix.length))) {
    return value;
  }
  const name = kind.replace("_", " ");
  throw new errors.InvalidId(
    `not a ${name} id: ${shown(value)} (expected '${prefix}' then letters, digits, '_' or '-')`,
    { field: `${kind}_id` },
  );
}

/** `value` if it is a run id the API accepts (1-128 of `[A-Za-z0-9._:-]`, not only dots). */
export function checkedRunId(value: unknown): string {
  if (typeof value === "string" && RUN_ID.test(value) && value.replace(/\./g, "") !== "") {
    return value;
  }
  throw new errors.InvalidId(
    `not a run id: ${shown(value)} (expected 1-128 of letters, digits, '.', '_', ':' or '-')`,
    { field: "run_id" },
  );
}

/** An opaque id the server gave (an attachment's): 1-128 of `[A-Za-z0-9_-]`. */
export function checkedOpaqueId(field: string, value: unknown): string {
  if (typeof value === "string" && ID_BODY.test(value)) return value;
  throw new errors.InvalidId(`not a ${field.replace("_", " ")}: ${shown(value)}`, { field });
}

/** One path segment, percent-encoded (`/`, `?`, `#` and `%` included). */
export function segment(value: string): string {
  return encodeURIComponent(value);
}

/** `template` with each `{}` replaced by the next checked, encoded id
 * (`attachment`: an opaque id the server gave, see `checkedOpaqueId`). */
export function idPath(template: string, ...ids: [IdKind | "attachment", unknown][]): string {
  let i = 0;
  return template.replace(/\{\}/g, () => {
    const [kind, value] = ids[i++]!;
    return segment(kind === "attachment" ? checkedOpaqueId("attachment_id", value) : checkedId(kind, value));
  });
}

/** The `wait` to ask for when `remainingSeconds` of the caller's budget are left. */
export function longPollSeconds(remainingSeconds: number): number {
  return Math.max(1, Math.min(SERVER_MAX_WAIT, Math.ceil(remainingSeconds)));
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

// --- the transport ---------------------------------------------------------------

export interface TransportOptions {
  url: string;
  token: string | null;
  timeoutMs: number;
  retries: number;
  fetch: typeof fetch;
  userAgent: string;
}

export class Transport {
  constructor(readonly options: TransportOptions) {}

  /** `call`'s answer; after a connection error or a 5xx it is repeated
   * `retries` times, but only where repeating is harmless (`call.retry`). */
  async send<T = unknown>(call: Call, signal?: AbortSignal): Promise<Answer<T>> {
    const attempts = 1 + (call.retry ? this.options.retries : 0);
    for (let attempt = 0; ; attempt++) {
      const last = attempt + 1 >= attempts;
      let response: Response;
      try {
        response = await this.once(call, signal);
      } catch (error) {
        if (signal?.aborted) throw signal.reason;
        if (last) {
          throw new errors.ServiceUnavailable(`cannot reach Signalbox at ${this.options.url}: ${describe(error)}`, {
            cause: error,
          });
        }
        await sleep(backoffMs(attempt), signal);
        continue;
      }
      if (response.status >= 500 && !last) {
        await response.body?.cancel();
        await sleep(backoffMs(attempt), signal);
        continue;
      }
      return decode<T>(response, call);
    }
  }

  private async once(call: Call, signal?: AbortSignal): Promise<Response> {
    const url = new URL(this.options.url + call.path);
    for (const [key, value] of Object.entries(call.query ?? {})) {
      if (value !== undefined && value !== null) url.searchParams.set(key, String(value));
    }
    const headers: Record<string, string> = {
      Accept: call.binary ? "*/*" : "application/json",
      "User-Agent": this.options.userAgent,
      ...call.headers,
    };
    if (this.options.token) headers.Authorization = `Bearer ${this.options.token}`;
    let body: string | undefined;
    if (call.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(call.json);
    }
    const timeout = AbortSignal.timeout(call.timeoutMs ?? this.options.timeoutMs);
    return this.options.fetch(url, {
      method: call.method,
      headers,
      body,
      signal: signal ? anySignal([signal, timeout]) : timeout,
    });
  }
}

function backoffMs(attempt: number): number {
  return 1000 * RETRY_BACKOFF_SECONDS[Math.min(attempt, RETRY_BACKOFF_SECONDS.length - 1)]!;
}

function anySignal(signals: AbortSignal[]): AbortSignal {
  const any = (AbortSignal as unknown as { any?: (s: AbortSignal[]) => AbortSignal }).any;
  if (any) return any(signals);
  const controller = new AbortController();
  for (const s of signals) {
    if (s.aborted) {
      controller.abort(s.reason);
      break;
    }
    s.addEventListener("abort", () => controller.abort(s.reason), { once: true });
  }
  return controller.signal;
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: unknown }).cause;
    if (error.name === "TimeoutError") return `no answer in time (${error.message})`;
    if (cause instanceof Error) {
      const code = (cause as { code?: string }).code;
      return `${error.message}: ${code ? `${code} ` : ""}${cause.message}`;
    }
    return `${error.name}: ${error.message}`;
  }
  return String(error);
}

async function decode<T>(response: Response, call: Call): Promise<Answer<T>> {
  let body: unknown = null;
  if (call.binary && response.status < 400) {
    body = new Uint8Array(await response.arrayBuffer());
  } else {
    const text = await response.text();
    if (text) {
      try {
        body = JSON.parse(text);
      } catch {
        body = text;
      }
    }
  }
  if (response.status >= 400) {
    throw errorFor(response.status, body, `${call.method} ${call.path}`, response.headers);
  }
  return { status: response.status, body: body as T, headers: response.headers };
}

// --- errors --------------------------------------------------------------------

type Json = Record<string, unknown>;

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function str(value: unknown): string | null {
  return typeof value === "string" ? value : null;
}

/** The meaningful object of an error body (FastAPI's `detail` unwrapped if present). */
function payloadOf(body: unknown): Json {
  if (!isObject(body)) return {};
  if (isObject(body.detail) && !("error" in body)) return body.detail;
  return body;
}

function errorParts(payload: Json): { code: string | null; message: string | null; field: string | null } {
  const err = payload.error;
  if (isObject(err)) return { code: str(err.code), message: str(err.message), field: str(err.field) };
  if (typeof err === "string") return { code: err, message: null, field: null };
  return { code: null, message: str(payload.message), field: null };
}

const CONFLICTS: Record<string, new (message: string, details: errors.ErrorDetails) => errors.Conflict> = {
  already_claimed: errors.AlreadyClaimed,
  already_consumed: errors.AlreadyConsumed,
  lease_expired: errors.LeaseExpired,
  run_mismatch: errors.RunMismatch,
  idempotency_conflict: errors.IdempotencyConflict,
  not_claimable: errors.NotClaimable,
  not_cancellable: errors.NotCancellable,
};

/** Map a non-2xx answer to the client's error (both body shapes accepted). */
export function errorFor(status: number, body: unknown, what = "", headers?: Headers): errors.SignalboxError {
  const payload = payloadOf(body);
  const { code, message, field } = errorParts(payload);
  const prefix = what ? `${what}: ` : "";
  const details = { status, code, body };
  if (status === 401) {
    return new errors.Unauthorized(prefix + (message ?? "unauthorized: check SIGNALBOX_TOKEN"), details);
  }
  if (status === 403) return new errors.Forbidden(prefix + (message ?? "forbidden"), details);
  if (status === 404) return new errors.NotFound(prefix + (message ?? "not found"), details);
  if (status === 409) {
    const state = str(payload.status);
    const kind = state && state in CONFLICTS ? state : code;
    const text = prefix + (message ?? (kind ?? "conflict").replace(/_/g, " "));
    const conflictDetails = { ...details, code: kind ?? code };
    if (kind === "already_claimed") {
      return new errors.AlreadyClaimed(text, {
        ...conflictDetails,
        claimId: str(payload.claim_id),
        leaseUntil: str(payload.lease_until),
        owner: str(payload.owner),
      });
    }
    if (kind === "already_consumed") {
      return new errors.AlreadyConsumed(text, {
        ...conflictDetails,
        receipt: isObject(payload.receipt) ? (payload.receipt as unknown as Receipt) : null,
      });
    }
    const cls = (kind && CONFLICTS[kind]) || errors.Conflict;
    return new cls(text, conflictDetails);
  }
  if (status === 410) {
    const deadLetter = isObject(payload.dead_letter) ? (payload.dead_letter as unknown as DeadLetter) : null;
    const reason = deadLetter?.reason ?? str(payload.reason);
    return new errors.SignalExpired(prefix + (message ?? `signal expired${reason ? ` (${reason})` : ""}`), {
      ...details,
      code: code ?? str(payload.status) ?? "expired",
      deadLetter,
    });
  }
  if (status === 400 || status === 422) {
    const name = field ?? fieldFromDetail(body);
    let detail = message ?? (name ? `invalid field '${name}'` : "invalid request");
    if (name && !detail.includes(name)) detail += ` (field '${name}')`;
    return new errors.InvalidRequest(prefix + detail, { ...details, field: name });
  }
  if (status === 429) {
    const retry = Number(headers?.get("Retry-After") ?? NaN);
    return new errors.RateLimited(prefix + (message ?? "too many requests"), {
      ...details,
      retryAfterSeconds: Number.isFinite(retry) ? retry : null,
    });
  }
  if (status >= 500) {
    return new errors.ServiceUnavailable(prefix + `server error ${status}${message ? `: ${message}` : ""}`, details);
  }
  return new errors.SignalboxError(prefix + (message ?? (typeof body === "string" && body ? body : `unexpected HTTP ${status}`)), details);
}

function fieldFromDetail(body: unknown): string | null {
  if (!isObject(body) || !Array.isArray(body.detail)) return null;
  for (const item of body.detail) {
    if (isObject(item) && Array.isArray(item.loc)) {
      const parts = item.loc.map(String).filter((p) => !["body", "query", "path", "header"].includes(p));
      return parts.join(".") || null;
    }
  }
  return null;
}
