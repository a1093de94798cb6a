// `npm pack`, installed into a scratch project as a user would, used from
// ES modules, CommonJS and TypeScript: the one-line migrations work.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);
const pkgDir = fileURLToPath(new URL('..', import.meta.url));
const pkg = JSON.parse(await readFile(path.join(pkgDir, 'package.json'), 'utf8'));
const devVersion = (name) => pkg.devDependencies[name];
let scratch;

before(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'rl-node-pack-'));
  // test.sh has built dist/ already: pack it as it is
  const { stdout } = await run('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', scratch], { cwd: pkgDir });
  const [{ filename, files }] = JSON.parse(stdout);
  const names = files.map((f) => f.path);
  assert.ok(names.includes('dist/esm/index.js') && names.includes('dist/cjs/index.js') && names.includes('dist/esm/index.d.ts'));
  assert.ok(names.includes('README.md') && names.includes('package.json'));
  assert.ok(!names.some((n) => n.startsWith('src/') || n.startsWith('test/')), names.join(' '));
  await writeFile(path.join(scratch, 'package.json'), JSON.stringify({ name: 'scratch', private: true, type: 'module' }));
  await run('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', '--loglevel=error', `./${filename}`,
    ...['iovalkey', 'express', 'express-rate-limit', 'rate-limiter-flexible'].map((n) => `${n}@${devVersion(n)}`)],
  { cwd: scratch, timeout: 240_000 });
});
after(() => rm(scratch, { recursive: true, force: true }));

const APP = (imports) => `${imports}
const [host, port] = process.env.RL_TEST_VALKEY_ADDR.split(':');
const client = new Valkey({ host, port: Number(port) });
const app = express();
app.use(rateLimit({ windowMs: 86_400_000, limit: 2, store: new ValkeyStore({ client, prefix: 'pack:' + process.pid + ':' }) }));
app.get('/', (req, res) => res.send('ok'));
const server = app.listen(0, '127.0.0.1', async () => {
  const url = 'http://127.0.0.1:' + server.address().port + '/';
  const statuses = [];
  for (let i = 0; i < 3; i++) statuses.push((await fetch(url)).status);
  const limiter = new RateLimiterValkey({ storeClient: client, keyPrefix: 'pack:' + process.pid, points: 1, duration: 60 });
  const first = await limiter.consume('user');
  const second = await limiter.consume('user').then(() => 'allowed', (rej) => rej.remainingPoints);
  console.log(JSON.stringify({ statuses, first: first.remainingPoints, second }));
  server.close();
  client.quit();
});
`;

for (const [file, imports] of [
  ['esm.mjs', `import { Redis as Valkey } from 'iovalkey';
import express from 'express';
import { rateLimit } from 'express-rate-limit';
import { ValkeyStore, RateLimiterValkey } from 'valkey-ratelimit';`],
  ['cjs.cjs', `const { Redis: Valkey } = require('iovalkey');
const express = require('express');
const { rateLimit } = require('express-rate-limit');
const { ValkeyStore, RateLimiterValkey } = require('valkey-ratelimit');`],
]) {
  test(`the installed tarball works from ${file.endsWith('.mjs') ? 'ES modules' : 'CommonJS'}`, async () => {
    await writeFile(path.join(scratch, file), APP(imports));
    const { stdout } = await run(process.execPath, [file], { cwd: scratch, env: process.env });
    assert.deepEqual(JSON.parse(stdout), { statuses: [200, 200, 429], first: 0, second: 0 });
  });
}

test('its type declarations check against the host libraries\' types', async () => {
  await writeFile(path.join(scratch, 'check.ts'), `import { Redis as Valkey } from 'iovalkey';
import { rateLimit, type Store } from 'express-rate-limit';
import { RateLimitClient, RateLimiterValkey, ValkeyStore, type RateLimitResult } from 'valkey-ratelimit';
const client = new Valkey();
const store: Store = new ValkeyStore({ client });
rateLimit({ store });
const r: Promise<RateLimitResult> = new RateLimitClient(client).gcra('k', 10, 5, '1s');
const n: Promise<number> = new RateLimiterValkey({ storeClient: client }).consume('k').then((res) => res.remainingPoints);
export { r, n };
`);
  await writeFile(path.join(scratch, 'tsconfig.json'), JSON.stringify({
    compilerOptions: { strict: true, module: 'NodeNext', moduleResolution: 'NodeNext', target: 'ES2022', noEmit: true, skipLibCheck: true, types: [] },
    files: ['check.ts'],
  }));
  const tsc = path.join(pkgDir, 'node_modules', 'typescript', 'bin', 'tsc');
  await run(process.execPath, [tsc, '-p', scratch], { cwd: scratch });
  assert.ok((await readdir(path.join(scratch, 'node_modules', 'valkey-ratelimit', 'dist'))).includes('cjs'));
});
