// A demo service: GET /api/hello behind the rate limiter.
//
//   VALKEY_ADDR=127.0.0.1:6379 PORT=8080 node app.js
//
// Configured from the environment (RL_KEY_BURST, RL_FAILURE_MODE, ...: see
// README.md); createApp() takes a config and a client for tests and embedding.

import { once } from 'node:events';
import { pathToFileURL } from 'node:url';
import express from 'express';
import { configFromEnv, createClient, rateLimit } from './rate-limit.js';

export function createApp(config, client) {
  const app = express();
  app.disable('x-powered-by');
  // Everything under /api is limited; /healthz and the like are not.
  app.use('/api', rateLimit(client, config));
  app.get('/api/hello', (req, res) => res.json({ message: 'hello' }));
  app.get('/healthz', (req, res) => res.json({ ok: true }));
  return app;
}

/** Waits (briefly) for the first connection, so the first requests are not failures. */
export async function waitReady(client, ms = 2000) {
  if (client.status === 'ready') return true;
  const timer = AbortSignal.timeout(ms);
  try {
    await once(client, 'ready', { signal: timer });
    return true;
  } catch {
    return false; // serve anyway: the failure policy covers a Valkey that is not there
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const config = configFromEnv();
  const client = createClient(config);
  if (!(await waitReady(client))) console.warn(`valkey at ${config.valkeyAddr} not ready yet; serving anyway`);
  const port = Number(process.env.PORT ?? 8080);
  const server = createApp(config, client).listen(port, '127.0.0.1', () => {
    console.log(`listening on http://127.0.0.1:${port}`);
  });
  const stop = () => server.close(() => client.quit().finally(() => process.exit(0)));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}
