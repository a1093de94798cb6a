/**
 * Typed errors. Every failure of a call is one of these; the server's own
 * message is kept verbatim (`ERR limit must be an integer from 1 to ...`).
 */

/** The base class: `err instanceof RateLimitError` catches every failure of this package. */
export class RateLimitError extends Error {
  override name = 'RateLimitError';
}

/**
 * The server answered with an error reply. `message` is the server's, `code`
 * its first word (`ERR`, `WRONGTYPE`, `NOPERM`, `LOADING`, ...).
 */
export class RateLimitServerError extends RateLimitError {
  override name = 'RateLimitServerError';
  readonly code: string;
  readonly command: string;
  constructor(message: string, command: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = /^[A-Z]+/.exec(message)?.[0] ?? 'ERR';
    this.command = command;
  }

  /**
   * True for replies that say the server cannot serve right now (it is
   * loading, busy, a replica, out of memory, the cluster is down), not that
   * the call is wrong: the failure policy treats them as an outage.
   */
  get transient(): boolean {
    return TRANSIENT_CODES.has(this.code);
  }
}

const TRANSIENT_CODES = new Set(['LOADING', 'BUSY', 'CLUSTERDOWN', 'TRYAGAIN', 'MASTERDOWN', 'READONLY', 'OOM', 'NOREPLICAS']);

/** The server could not be reached, or the connection broke. `cause` is the client library's error. */
export class RateLimitUnavailableError extends RateLimitError {
  override name = 'RateLimitUnavailableError';
}

/** No answer within the timeout (the call may still reach the server later). */
export class RateLimitTimeoutError extends RateLimitUnavailableError {
  override name = 'RateLimitTimeoutError';
  readonly timeoutMs: number;
  constructor(command: string, timeoutMs: number) {
    super(`${command}: no answer within ${timeoutMs} ms`);
    this.timeoutMs = timeoutMs;
  }
}

/** A reply of a shape this package does not know (a module version mismatch, or another module on the name). */
export class RateLimitReplyError extends RateLimitError {
  override name = 'RateLimitReplyError';
}

/** True when the failure means "the limiter is unavailable" rather than "the call is wrong". */
export function isUnavailable(err: unknown): boolean {
  return err instanceof RateLimitUnavailableError || (err instanceof RateLimitServerError && err.transient);
}

/**
 * The client library's rejection as one of ours. iovalkey and ioredis reject
 * error replies with a `ReplyError`; anything else (connection closed,
 * "Stream isn't writeable", a cluster that cannot route) is an outage.
 */
export function fromClientError(err: unknown, command: string): RateLimitError {
  if (err instanceof RateLimitError) return err;
  const e = err instanceof Error ? err : new Error(String(err));
  if (e.name === 'ReplyError') return new RateLimitServerError(e.message, command, { cause: e });
  return new RateLimitUnavailableError(`${command}: ${e.message}`, { cause: e });
}
