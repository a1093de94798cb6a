// A Valkey Cluster of primaries with the module, on free loopback ports, for
// the tests that need one (cluster.test.mjs, scale.test.mjs).
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Redis as Valkey } from 'iovalkey';
import { sleep } from './helpers.mjs';

export const SERVER = process.env.VALKEY_SERVER;
export const MODULE = process.env.RL_MODULE;
/** Why the cluster tests cannot run, or false. */
export const skipCluster = !SERVER || !MODULE ? 'VALKEY_SERVER and RL_MODULE are not set' : false;

async function freePort() {
  const s = net.createServer().listen(0, '127.0.0.1');
  await new Promise((r) => s.once('listening', r));
  const { port } = s.address();
  await new Promise((r) => s.close(r));
  return port;
}

const listening = (port) => new Promise((resolve) => {
  const sock = net.connect(port, '127.0.0.1', () => { sock.destroy(); resolve(true); });
  sock.on('error', () => resolve(false));
});

/**
 * Starts `primaries` servers in cluster mode, gives each an equal contiguous
 * slot range (as `valkey-cli --cluster create` does), joins them and waits
 * for `cluster_state:ok`. Returns `{ ports, stop }`; `stop()` always stops
 * every server it started and removes their directory, also when the start
 * failed half way (it is then called before the error is thrown).
 */
export async function startCluster(primaries = 3) {
  const dir = await mkdtemp(path.join(tmpdir(), 'rl-node-cluster-'));
  const nodes = [];
  const admin = [];
  const stop = async () => {
    for (const c of admin) c.disconnect();
    for (const { proc } of nodes) proc.kill();
    await Promise.all(nodes.map(({ proc }) => (proc.exitCode === null && proc.signalCode === null ? new Promise((r) => proc.once('exit', r)) : null)));
    await rm(dir, { recursive: true, force: true });
  };
  try {
    for (let i = 0; i < primaries; i++) {
      const port = await freePort();
      const proc = spawn(SERVER, ['--bind', '127.0.0.1', '--port', String(port), '--cluster-enabled', 'yes',
        '--cluster-config-file', path.join(dir, `nodes-${port}.conf`), '--save', '', '--appendonly', 'no',
        '--dir', dir, '--loadmodule', MODULE], { stdio: 'ignore' });
      nodes.push({ port, proc });
    }
    for (const { port, proc } of nodes) {
      for (let t = 0; !(await listening(port)); t++) {
        if (t > 100 || proc.exitCode !== null) throw new Error(`valkey-server on ${port} did not start`);
        await sleep(100);
      }
      admin.push(new Valkey({ host: '127.0.0.1', port }));
    }
    // The ranges valkey-cli --cluster create gives (three primaries: 0-5460, 5461-10922, 10923-16383).
    const per = 16384 / primaries;
    for (let i = 0, first = 0; i < primaries; i++) {
      const last = i === primaries - 1 ? 16383 : Math.round(i * per + per - 1);
      await admin[i].call('CLUSTER', 'ADDSLOTSRANGE', first, last);
      first = last + 1;
    }
    for (let i = 1; i < primaries; i++) await admin[0].call('CLUSTER', 'MEET', '127.0.0.1', nodes[i].port);
    for (let t = 0; ; t++) {
      const states = await Promise.all(admin.map((c) => c.call('CLUSTER', 'INFO')));
      if (states.every((s) => /cluster_state:ok/.test(s) && new RegExp(`cluster_known_nodes:${primaries}\\b`).test(s))) break;
      if (t > 200) throw new Error('the cluster did not come up');
      await sleep(100);
    }
    for (const c of admin.splice(0)) c.disconnect();
  } catch (err) {
    await stop();
    throw err;
  }
  return { ports: nodes.map((n) => n.port), stop };
}
