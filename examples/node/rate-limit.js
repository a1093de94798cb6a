// Rate limiting for Express with valkey-ratelimit's RL.ALL.
//
// Copy this file into your service; it needs `iovalkey` and the
// `valkey-ratelimit` package (clients/node: the RL.ALL call, its typed
// result, the header values and the timeout are the package's):
//
//   const config = configFromEnv();             // or { ...DEFAULTS, keyBurst: 10, ... }
//   const client = createClient(config);
//   app.use('/api', rateLimit(client, config));
//
// Every request through the middleware is charged to two limiters in one
// atomic call: its API key (a GCRA: bursts of keyBurst, keyRate per
// keyPeriod seconds) and its client IP (a sliding window: ipLimit per
// ipPeriod seconds). The contract (headers, status codes, failure policy) is
// examples/README.md's.

import net from 'node:net';
import Valkey from 'iovalkey';
import { AllResult, RateLimitClient, RateLimitResult, RateLimitTimeoutError, recommendedOptions } from 'valkey-ratelimit';

export const DEFAULTS = Object.freeze({
  valkeyAddr: '127.0.0.1:6379',
  prefix: 'rl:v1:api', // bump the version to start from fresh limiters
  keyBurst: 5, // per API key: GCRA burst ...
  keyRate: 5, // ... and sustained rate of keyRate per keyPeriod seconds
  keyPeriod: 1,
  ipLimit: 20, // per client IP: sliding window of ipLimit per ipPeriod seconds
  ipPeriod: 60,
  trustedProxies: [], // IPs or CIDRs whose X-Forwarded-For we believe
  failureMode: 'open', // 'open': serve when Valkey fails; 'closed': answer 503
  timeoutMs: 50, // connect and command timeout (a call costs at most this: see createClient)
  logger: console,
});

/** Longer API keys are refused (401) before any Valkey call: one request must not create a huge key. */
export const MAX_API_KEY_BYTES = 256;

/** The knobs from environment variables (names shared by every recipe); unset, empty or blank ones keep their default. */
export function configFromEnv(env = process.env) {
  const get = (name) => (env[name] ?? '').trim() || undefined;
  const num = (name, dflt) => (get(name) === undefined ? dflt : Number(get(name)));
  return {
    ...DEFAULTS,
    valkeyAddr: get('VALKEY_ADDR') ?? DEFAULTS.valkeyAddr,
    prefix: get('RL_PREFIX') ?? DEFAULTS.prefix,
    keyBurst: num('RL_KEY_BURST', DEFAULTS.keyBurst),
    keyRate: num('RL_KEY_RATE', DEFAULTS.keyRate),
    keyPeriod: num('RL_KEY_PERIOD', DEFAULTS.keyPeriod),
    ipLimit: num('RL_IP_LIMIT', DEFAULTS.ipLimit),
    ipPeriod: num('RL_IP_PERIOD', DEFAULTS.ipPeriod),
    trustedProxies: (get('RL_TRUSTED_PROXIES') ?? '').split(',').map((s) => s.trim()).filter(Boolean),
    failureMode: get('RL_FAILURE_MODE') ?? DEFAULTS.failureMode,
    timeoutMs: num('RL_TIMEOUT_MS', DEFAULTS.timeoutMs),
  };
}

function validate(config) {
  const c = { ...DEFAULTS, ...config };
  if (c.failureMode !== 'open' && c.failureMode !== 'closed') {
    throw new Error(`failureMode must be 'open' or 'closed', not ${JSON.stringify(c.failureMode)}`);
  }
  for (const name of ['keyBurst', 'keyRate', 'keyPeriod', 'ipLimit', 'ipPeriod', 'timeoutMs']) {
    if (!Number.isInteger(c[name]) || c[name] < 1) throw new Error(`${name} must be an integer >= 1`);
  }
  return c;
}

/**
 * A client that gives up quickly: a limiter must never be the slow part of a
 * request. iovalkey's defaults suit a cache, not this: the package's
 * recommendedOptions(timeoutMs) change each on purpose (see its README):
 * connect and command timeouts of timeoutMs; no offline queue and no retries
 * per request (while disconnected a command fails at once instead of being
 * queued and sent, stale, after the request was answered); no re-sending
 * after a reconnect (it would charge the limiters twice); no ready check (a
 * server that accepts and never answers INFO would leave the client in
 * "connect"; a server still loading answers RL.ALL with -LOADING, a failure
 * like any other). The client keeps reconnecting in the background; a
 * request never waits for a connection, so the whole call is the command,
 * cut at timeoutMs (within the contract's 2 * timeoutMs). check() drops a
 * connection on which a command timed out (iovalkey would keep it).
 */
export function createClient(config) {
  const c = validate(config);
  const i = c.valkeyAddr.lastIndexOf(':');
  const client = new Valkey({
    host: c.valkeyAddr.slice(0, i).replace(/^\[|\]$/g, '') || '127.0.0.1',
    port: Number(c.valkeyAddr.slice(i + 1)),
    ...recommendedOptions(c.timeoutMs),
  });
  // Without a listener, every failed reconnect prints an "Unhandled error
  // event"; the middleware reports failures itself.
  client.on('error', () => {});
  return client;
}

// One RateLimitClient per connection. It fails closed: the middleware applies
// the failure policy itself (503 or serve, and the throttled warning).
const limiters = new WeakMap();
function limiterFor(client, c) {
  let rl = limiters.get(client);
  if (!rl) limiters.set(client, (rl = new RateLimitClient(client, { timeoutMs: c.timeoutMs })));
  return rl;
}

/** Charges one request; throws on any failure (the caller applies the failure policy). */
export async function check(client, config, apiKey, ip) {
  const c = config;
  // RL.ALL decides both limiters atomically: a request denied by one
  // consumes from neither. In Valkey Cluster all keys of one RL.ALL must
  // hash to one slot (else CROSSSLOT): these two do not. There, put one hash
  // tag in both keys (the package's sameSlot(apiKey, ...) makes
  // `${prefix}:key:{${apiKey}}` and `${prefix}:ip:${ip}:{${apiKey}}`, which
  // limits per key and IP), or make two calls (gcra, then window) and lose
  // the all-or-nothing. In standalone Valkey any keys work.
  const stream = client.stream;
  try {
    return await limiterFor(client, c).all([
      { key: `${c.prefix}:key:${apiKey}`, name: 'key', limiter: { algorithm: 'gcra', burst: c.keyBurst, rate: c.keyRate, period: `${c.keyPeriod}s` } },
      { key: `${c.prefix}:ip:${ip}`, name: 'ip', limiter: { algorithm: 'window', limit: c.ipLimit, period: `${c.ipPeriod}s`, sliding: true } },
    ]);
  } catch (err) {
    // A timeout only rejects the promise: iovalkey keeps the connection,
    // which may never answer again (a server gone behind a dead route). Drop
    // it (unless another request already did): destroy the socket, as
    // client.disconnect() only half-closes it and waits for the peer; the
    // client sees a lost connection and reconnects.
    const timedOut = err instanceof RateLimitTimeoutError || err.cause?.message === 'Command timed out';
    if (timedOut && client.stream === stream) stream?.destroy();
    throw err;
  }
}

/** A decision as the package's AllResult (check() returns one; tests make plain ones). */
function asDecision(d) {
  if (d instanceof AllResult) return d;
  return new AllResult(d.allowed, d.retryAfterMs, undefined, d.limiters.map((l) => new RateLimitResult(l)), d.limiters.map((l) => l.name));
}

/**
 * The header values for one decision (draft-ietf-httpapi-ratelimit-headers,
 * -07 and later): every policy in RateLimit-Policy, the most restrictive
 * limiter (the package's `binding`) in RateLimit and X-RateLimit-*.
 */
export function rateHeaders(decision, policy) {
  const d = asDecision(decision);
  const b = d.binding;
  const h = { ...b.headers({ name: d.names[d.limiters.indexOf(b)] }), 'RateLimit-Policy': policy };
  delete h['Retry-After']; // the call's wait, not the binding limiter's
  if (d.retryAfterSeconds !== null) h['Retry-After'] = String(d.retryAfterSeconds);
  return h;
}

/** Retry-After in whole seconds, rounded up and at least 1; null when it can never pass. */
export function retryAfterSeconds(decision) {
  return asDecision(decision).retryAfterSeconds;
}

/** The IP or CIDR list as a net.BlockList, for membership tests. */
export function trustedList(entries) {
  const list = new net.BlockList();
  for (const entry of entries) {
    const [addr, bits] = entry.split('/');
    const ip = normalizeIp(addr);
    if (ip === null) throw new Error(`trusted proxy ${JSON.stringify(entry)} is not an IP or CIDR`);
    const family = net.isIPv4(ip) ? 'ipv4' : 'ipv6';
    list.addSubnet(ip, bits === undefined ? (family === 'ipv4' ? 32 : 128) : Number(bits), family);
  }
  return list;
}

/** An address in one canonical spelling, or null when it is not an IP. */
export function normalizeIp(text) {
  const s = String(text).trim();
  if (net.isIPv4(s)) return s;
  if (!net.isIPv6(s)) return null;
  let canonical;
  try {
    canonical = new URL(`http://[${s}]/`).hostname.slice(1, -1); // WHATWG URLs print IPv6 canonically
  } catch {
    return s.toLowerCase(); // e.g. a zone id (fe80::1%eth0), which URLs refuse
  }
  // An IPv4 client seen through a dual-stack socket is still that IPv4 client.
  const m = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(canonical);
  if (m) {
    const [hi, lo] = [parseInt(m[1], 16), parseInt(m[2], 16)];
    return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
  }
  return canonical;
}

/**
 * The address to limit: the peer's, unless the peer is a trusted proxy.
 *
 * Anyone can send X-Forwarded-For, so it is read only when the direct peer is
 * one of our proxies, and then from the right: each proxy appends the address
 * it saw, so the rightmost entries are the ones our proxies wrote, and the
 * first address that is not one of them is the client. Entries left of it
 * were written by the client itself and prove nothing.
 */
export function clientIp(peer, forwardedFor, trusted) {
  let ip = peer ? normalizeIp(peer) : null;
  if (ip === null) return 'unknown'; // e.g. a Unix socket: all such requests share one IP limit
  const isTrusted = (a) => trusted.check(a, net.isIPv4(a) ? 'ipv4' : 'ipv6');
  if (!isTrusted(ip) || !forwardedFor) return ip;
  for (const entry of forwardedFor.split(',').reverse()) {
    const hop = normalizeIp(entry);
    if (hop === null) break; // garbage: stop at the last hop we could vouch for
    ip = hop;
    if (!isTrusted(hop)) break;
  }
  return ip;
}

/** The Express middleware: 401 without an API key, 429 when limited, headers on every decision. */
export function rateLimit(client, config) {
  const c = validate(config);
  const trusted = trustedList(c.trustedProxies);
  // The GCRA's window is the time to earn a whole burst back; the sliding
  // window's is its period. One item per limiter, in call order.
  const keyWindow = Math.ceil((c.keyBurst * c.keyPeriod) / c.keyRate);
  const policy = `"key";q=${c.keyBurst};w=${keyWindow}, "ip";q=${c.ipLimit};w=${c.ipPeriod}`;
  const warn = throttledWarning(c);

  return async function rateLimitMiddleware(req, res, next) {
    // A repeated X-API-Key: the first one (Node would join them with ", ").
    const apiKey = (req.headersDistinct['x-api-key']?.[0] ?? '').trim();
    if (!apiKey) return res.status(401).json({ error: 'missing API key' });
    if (Buffer.byteLength(apiKey, 'latin1') > MAX_API_KEY_BYTES) return res.status(401).json({ error: 'API key too long' });
    const ip = clientIp(req.socket.remoteAddress, req.get('X-Forwarded-For'), trusted);

    let decision;
    try {
      decision = await check(client, c, apiKey, ip);
    } catch (err) {
      // Any failure: connection, timeout, error reply, odd reply.
      warn(err);
      if (c.failureMode === 'closed') {
        return res.status(503).set('Retry-After', '1').json({ error: 'rate limiter unavailable' });
      }
      return next(); // fail open: serve, without rate headers
    }
    res.set(rateHeaders(decision, policy));
    if (!decision.allowed) {
      return res.status(429).json({ error: 'rate limited', retry_after: retryAfterSeconds(decision) });
    }
    return next();
  };
}

// One line per 10 s at most: a down Valkey under load would otherwise write a
// line per request.
function throttledWarning(config) {
  let last = -Infinity;
  let failures = 0;
  return (err) => {
    failures += 1;
    const now = performance.now();
    if (now - last < 10_000) return;
    config.logger.warn(
      `rate limiter unavailable (${failures} failure(s) since the last report), failing ${config.failureMode}: ${err.message}`,
    );
    last = now;
    failures = 0;
  };
}
