/**
 * signalbox-client: wait for an expected email as a contract.
 * See README.md; the Playwright fixtures are in `signalbox-client/playwright`.
 */
export {
  Signalbox,
  SignalHandle,
  Claim,
  DEFAULT_URL,
  DEADLINE_GRACE_SECONDS,
} from "./client.js";
export type {
  SignalboxOptions,
  WatchOptions,
  WaitOptions,
  ClaimOptions,
  SignalboxEvent,
  Listener,
} from "./options.js";
export {
  SignalboxError,
  Unauthorized,
  Forbidden,
  NotFound,
  InvalidRequest,
  InvalidId,
  Conflict,
  AlreadyClaimed,
  AlreadyConsumed,
  LeaseExpired,
  RunMismatch,
  IdempotencyConflict,
  NotClaimable,
  NotCancellable,
  SignalCancelled,
  SignalNotReady,
  RateLimited,
  SignalExpired,
  UnexpectedMessage,
  WaitTimeout,
  ServiceUnavailable,
  diagnosisText,
} from "./errors.js";
export { Message, Attachment } from "./message.js";
export { checkedId, checkedRunId, segment, ID_PREFIXES } from "./http.js";
export type * from "./types.js";
