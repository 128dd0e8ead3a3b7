// The options and events of the Signalbox client (src/client.ts).
import type { Expect, Receipt, SignalView } from "./types.js";
import type { SignalExpired, UnexpectedMessage } from "./errors.js";

export interface SignalboxOptions {
  /** Default `SIGNALBOX_URL`, else http://127.0.0.1:8040. */
  url?: string;
  /** Default `SIGNALBOX_TOKEN`. */
  token?: string;
  /** Default run id for `watch`, `mailbox` and the expectations. */
  runId?: string;
  /** Default test case for `watch` and the expectations. */
  testCase?: string;
  /** Per-request timeout (a long poll gets its `wait` plus 15 s on top). */
  timeoutMs?: number;
  /** Retries after the first attempt, where a retry is harmless. */
  retries?: number;
  /** Another `fetch` (tests, proxies). */
  fetch?: typeof fetch;
}

export interface WatchOptions {
  runId?: string;
  testCase?: string;
  recipient: string;
  subjectContains?: string;
  bodyContains?: string;
  /** ISO-8601 with zone, or a Date; default: the server's now. */
  receivedAfter?: string | Date;
  expiresInSeconds?: number;
  maxChecks?: number;
  provider?: string;
  requireRunMarker?: boolean;
  metadata?: Record<string, unknown>;
  /** `first` (default), `exactly_one`, `none`. */
  expect?: Expect;
  /** For `exactly_one`: how long no second match may arrive (1-300, server default 5). */
  settleSeconds?: number;
  /** The `Idempotency-Key` header; else the server keys on `run_id:test_case`. */
  idempotencyKey?: string;
}

export interface WaitOptions {
  /** Give up (WaitTimeout) after this long; default: wait until the signal ends. */
  timeoutSeconds?: number;
  /** Called with each view seen. */
  onPoll?: (view: SignalView) => void;
  signal?: AbortSignal;
}

export interface ClaimOptions {
  /** 5-900, default 90. */
  leaseSeconds?: number;
  /** Who holds the claim (1-200 characters; the server's default is the token's name). */
  owner?: string;
  runId?: string;
}

/** What a client tells its listeners (the Playwright fixture records these). */
export type SignalboxEvent =
  | { type: "signal"; view: SignalView; created: boolean }
  | { type: "receipt"; receipt: Receipt }
  | { type: "expired"; error: SignalExpired }
  | { type: "arrived"; error: UnexpectedMessage };

export type Listener = (event: SignalboxEvent) => void;
