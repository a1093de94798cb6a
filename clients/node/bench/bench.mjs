// Requests per second through an Express app and through the limiter alone:
// this package (one module command per request) beside rate-limit-redis and
// rate-limiter-flexible's RateLimiterRedis (their Lua), on the same server in
// the same run, rounds interleaved. Run by bench.sh (which starts the server):
//
//   clients/node/bench.sh [--seconds 3] [--rounds 3] [--concurrency 32] [--keys 1000]
//
// Every request is allowed (limits far above the traffic), spread over
// --keys client keys: what is measured is the limiter's path, not 429s.
import { fork } from 'node:child_process';
import { once } from 'node:events';
import http from 'node:http';
import { parseArgs } from 'node:util';
import { Redis as Valkey } from 'iovalkey';
import express from 'express';
import { rateLimit } from 'express-rate-limit';
import { RedisStore } from 'rate-limit-redis';
import { RateLimiterRedis } from 'rate-limiter-flexible';
import { RateLimiterValkey, ValkeyStore } from '../dist/esm/index.js';

const { values: opt } = parseArgs({
  options: {
    seconds: { type: 'string', default: '3' }, rounds: { type: 'string', default: '3' },
    concurrency: { type: 'string', default: '32' }, keys: { type: 'string', default: '1000' },
    serve: { type: 'string' },
  },
});
const SECONDS = Number(opt.seconds);
const ROUNDS = Number(opt.rounds);
const CONCURRENCY = Number(opt.concurrency);
const KEYS = Number(opt.keys);
const [host, port] = (process.env.RL_TEST_VALKEY_ADDR ?? '127.0.0.1:6379').split(':');
const connect = () => new Valkey({ host, port: Number(port) });
const LIMIT = 1_000_000_000;
const WINDOW_MS = 3_600_000;

/** The stores and limiters compared, by name. */
const stores = {
  // a generous timeout: the others have none, and a loaded machine stalls
  'valkey-ratelimit ValkeyStore (RL.WINDOW)': (client, prefix) => new ValkeyStore({ client, prefix, timeoutMs: 10_000 }),
  'rate-limit-redis RedisStore (Lua)': (client, prefix) => new RedisStore({ sendCommand: (cmd, ...args) => client.call(cmd, ...args), prefix }),
};
const limiters = {
  'valkey-ratelimit RateLimiterValkey (RL.WINDOW)': (client, keyPrefix) => new RateLimiterValkey({ storeClient: client, points: LIMIT, duration: 3600, keyPrefix, timeoutMs: 10_000 }),
  'rate-limiter-flexible RateLimiterRedis (Lua)': (client, keyPrefix) => new RateLimiterRedis({ storeClient: client, points: LIMIT, duration: 3600, keyPrefix }),
};

// ---- the app process: `bench.mjs --serve <store name>` ----
if (opt.serve !== undefined) {
  const client = connect();
  const app = express();
  if (opt.serve !== 'none') {
    const store = stores[opt.serve](client, `bench:app:${process.pid}:`);
    app.use(rateLimit({
      windowMs: WINDOW_MS, limit: LIMIT, standardHeaders: 'draft-7', legacyHeaders: false, store,
      keyGenerator: (req) => req.headers['x-client'], validate: false,
    }));
  }
  app.get('/', (req, res) => res.send('ok'));
  const server = app.listen(0, '127.0.0.1', () => process.send(server.address().port));
  process.on('message', () => { server.close(); client.quit().finally(() => process.exit(0)); });
} else {
  await main();
}

/** Runs `one(i)` with CONCURRENCY in flight for SECONDS; returns requests/s. */
async function load(one) {
  const deadline = performance.now() + SECONDS * 1000;
  let done = 0;
  let failed = 0;
  const worker = async (w) => {
    for (let i = w; performance.now() < deadline; i += CONCURRENCY) {
      try { await one(i % KEYS); done++; } catch { failed++; }
    }
  };
  const start = performance.now();
  await Promise.all(Array.from({ length: CONCURRENCY }, (_, w) => worker(w)));
  if (failed) throw new Error(`${failed} requests failed`);
  return done / ((performance.now() - start) / 1000);
}

async function throughApp(name) {
  const child = fork(new URL(import.meta.url), ['--serve', name], { env: process.env });
  const [appPort] = await once(child, 'message');
  const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  const get = (k) => new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: appPort, path: '/', agent, headers: { 'x-client': `c${k}` } }, (res) => {
      res.resume();
      res.on('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`HTTP ${res.statusCode}`))));
    }).on('error', reject);
  });
  try {
    await load(get); // warm-up round, not counted
    return await load(get);
  } finally {
    agent.destroy();
    child.send('stop');
    await once(child, 'exit');
  }
}

/** requests/s of the limiter alone, and the server's time per request (INFO commandstats, reset first). */
async function limiterAlone(client, name, kind) {
  const prefix = `bench:alone:${Math.random().toString(36).slice(2)}:`;
  let one;
  if (kind === 'store') {
    const store = stores[name](client, prefix);
    store.init?.({ windowMs: WINDOW_MS, limit: LIMIT });
    await store.increment('warm');
    one = (k) => store.increment(`c${k}`);
  } else {
    const limiter = limiters[name](client, prefix);
    await limiter.consume('warm');
    one = (k) => limiter.consume(`c${k}`);
  }
  await client.call('CONFIG', 'RESETSTAT');
  const rate = await load(one);
  return { rate, serverUs: serverUsPerRequest(await client.info('commandstats'), rate * SECONDS) };
}

/** The server's time in commands (a script's inner calls are inside its EVALSHA), per request. */
function serverUsPerRequest(stats, requests) {
  let usec = 0;
  for (const m of stats.matchAll(/^cmdstat_(\S+):calls=\d+,usec=(\d+)/gm)) if (!['info', 'config|resetstat'].includes(m[1])) usec += Number(m[2]);
  return usec / requests;
}

async function main() {
  const client = connect();
  const info = await client.info('server');
  const version = /valkey_version:(\S+)/.exec(info)?.[1] ?? '?';
  console.log(`valkey ${version} at ${host}:${port}, node ${process.version}; ${ROUNDS} rounds of ${SECONDS} s, ${CONCURRENCY} in flight, ${KEYS} keys`);
  const results = new Map();
  const server = new Map();
  const record = (label, value) => results.set(label, [...(results.get(label) ?? []), value]);
  const alone = [
    ...Object.keys(stores).map((name) => [`limiter alone: ${name}.increment`, name, 'store']),
    ...Object.keys(limiters).map((name) => [`limiter alone: ${name}.consume`, name, 'limiter']),
  ];
  const apps = ['none', ...Object.keys(stores)];
  for (let round = 1; round <= ROUNDS; round++) {
    // interleaved, every other round in reverse: drift and ordering hit all alike
    const order = (xs) => (round % 2 ? xs : [...xs].reverse());
    for (const name of order(apps)) record(`Express app: ${name === 'none' ? 'no limiter' : name}`, await throughApp(name));
    for (const [label, name, kind] of order(alone)) {
      const { rate, serverUs } = await limiterAlone(client, name, kind);
      record(label, rate);
      server.set(label, [...(server.get(label) ?? []), serverUs]);
    }
    console.error(`round ${round}/${ROUNDS} done`);
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const f = (x) => Math.round(x).toLocaleString('en-US');
  console.log('\n| path | requests/s (median) | min | max | server µs per request |\n|---|---:|---:|---:|---:|');
  for (const [label, xs] of results) {
    const us = server.get(label);
    console.log(`| ${label} | ${f(median(xs))} | ${f(Math.min(...xs))} | ${f(Math.max(...xs))} | ${us ? median(us).toFixed(2) : ''} |`);
  }
  await client.quit();
}
