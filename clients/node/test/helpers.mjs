// Shared by the tests: the server test.sh started, connections of both
// client libraries, unique keys.
import { randomUUID } from 'node:crypto';
import Valkey from 'iovalkey';
import Redis from 'ioredis';

const [host, port] = (process.env.RL_TEST_VALKEY_ADDR ?? '').split(':');
if (!port) throw new Error('RL_TEST_VALKEY_ADDR is not set: run the tests with clients/node/test.sh');
export const server = { host, port: Number(port) };

/** The client libraries the package supports: the same tests run on each. */
export const libraries = [
  ['iovalkey', Valkey],
  ['ioredis', Redis],
];

/** A connection of `Lib` to the test server (closed by the caller). */
export async function connect(Lib = Valkey, options = {}) {
  const c = new Lib({ ...server, lazyConnect: true, ...options });
  await c.connect();
  return c;
}

/** A key no other test uses. */
export const uniq = (name = 'k') => `test:${name}:${randomUUID().slice(0, 8)}`;

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A seeded random number generator in [0, 1): the same sequence every run. */
export function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
