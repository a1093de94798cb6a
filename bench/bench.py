#!/usr/bin/env python3
"""make bench: throughput, latency and memory of the RL commands beside INCR,
PING and the Lua scripts people deploy today, measured in one run.

One valkey-server (persistence off, pinned to CPU 0 where taskset exists) and
valkey-benchmark (pinned to CPU 1). Cases are interleaved A B C A B C, each
repeated, and the median is reported. Writes bench/RESULTS.md and
bench/ratios.png (when matplotlib is importable).
"""

import argparse
import csv
import io
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
MODULE = Path(os.environ.get("RL_MODULE", ROOT / "target/release/libvalkey_ratelimit.so"))
SERVER = os.environ.get("VALKEY_SERVER") or shutil.which("valkey-server") or "valkey-server"
BENCHMARK = shutil.which("valkey-benchmark") or "valkey-benchmark"
CELL_MODULE = os.environ.get("CELL_MODULE")
KEYSPACE = 100_000


def pinned(cpu, argv):
    return (["taskset", "-c", str(cpu)] + argv) if shutil.which("taskset") else argv


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """A minimal RESP2 client: enough to load scripts and read INFO."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = b""

    @staticmethod
    def encode(args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def send(self, *args):
        self.sock.sendall(self.encode(args))

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("valkey-server closed the connection")
        self.buf += data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def read(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self._fill()
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RuntimeError(f"unexpected reply {line!r}")

    def call(self, *args):
        self.send(*args)
        return self.read()

    def pipeline(self, commands, batch=1000):
        for i in range(0, len(commands), batch):
            chunk = commands[i:i + batch]
            for c in chunk:
                self.send(*c)
            for _ in chunk:
                self.read()

    def info(self, section):
        text = self.call("INFO", section).decode()
        return dict(l.split(":", 1) for l in text.splitlines() if ":" in l)


class Server:
    """A server with one module: ours, or (`module=CELL_MODULE`) redis-cell,
    which cannot share a server with our CL.THROTTLE."""

    def __init__(self, module=None, extra=(), cpu=0):
        self.dir = tempfile.mkdtemp(prefix="rl-bench-")
        self.port = free_port()
        argv = [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                "--save", "", "--appendonly", "no", "--loadmodule", str(module or MODULE), *extra]
        self.proc = subprocess.Popen(pinned(cpu, argv), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for _ in range(100):
            try:
                self.client = Client(self.port)
                self.client.call("PING")
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("valkey-server did not start")

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def cases(server, with_lua, cell_server=None):
    """(name, group, argv, port) for valkey-benchmark; __rand_int__ spreads keys."""
    c = server.client
    sha = {}
    if with_lua:
        for name in ["token_bucket", "fixed_window", "sliding_window", "sliding_log"]:
            sha[name] = c.call("SCRIPT", "LOAD", (BENCH / "lua" / f"{name}.lua").read_text()).decode()
    # Stored policies for RL.LIMIT (replicated to an attached replica).
    c.call("RL.POLICY.SET", "win", "WINDOW", "1000000", "1m")
    c.call("RL.POLICY.SET", "bucket", "TOKENBUCKET", "1000000", "1000", "1s")
    c.call("RL.POLICY.SET", "bucket100", "TOKENBUCKET", "100", "100", "1m")
    c.call("RL.POLICY.SET", "minute100", "WINDOW", "100", "1m")
    c.call("RL.POLICY.SET", "minute100brief", "WINDOW", "100", "1m", "BRIEF")
    out = [
        ("PING", "floor", ["PING"]),
        ("INCR", "floor", ["INCR", "k:__rand_int__"]),
    ]
    for keyname, label in [("__rand_int__", "random keys"), ("hot", "one hot key")]:
        out += [
            (f"RL.TOKENBUCKET ({label})", "rl", ["RL.TOKENBUCKET", f"tb:{keyname}", "1000000", "1000", "1s"]),
            (f"RL.WINDOW ({label})", "rl", ["RL.WINDOW", f"fw:{keyname}", "1000000", "1m"]),
            (f"RL.WINDOW BRIEF ({label})", "rl", ["RL.WINDOW", f"fb:{keyname}", "1000000", "1m", "BRIEF"]),
            (f"RL.WINDOW SLIDING ({label})", "rl", ["RL.WINDOW", f"sw:{keyname}", "1000000", "1m", "SLIDING"]),
            (f"RL.LIMIT, window policy ({label})", "rl", ["RL.LIMIT", f"lw:{keyname}", "win"]),
            (f"RL.LIMIT BRIEF, window policy ({label})", "rl", ["RL.LIMIT", f"lb:{keyname}", "win", "BRIEF"]),
            (f"RL.LIMIT, token bucket policy ({label})", "rl", ["RL.LIMIT", f"lt:{keyname}", "bucket"]),
            (f"RL.GCRA ({label})", "rl", ["RL.GCRA", f"gc:{keyname}", "1000000", "1000", "1s"]),
            (f"CL.THROTTLE, this module ({label})", "rl", ["CL.THROTTLE", f"cl:{keyname}", "999999", "1000", "1"]),
            # Two limiters in one atomic call, beside the same two as single calls.
            (f"RL.ALL, two limiters ({label})", "rl",
             ["RL.ALL", "2", f"a1:{keyname}", f"a2:{keyname}",
              "TOKENBUCKET", "1000000", "1000", "1s", "WINDOW", "1000000", "1m"]),
        ]
        if keyname != "hot":
            # A hot key would fill up (100,000 leases of 1 min) and measure denials.
            out.append((f"RL.LEASE acquire ({label})", "rl", ["RL.LEASE", f"ls:{keyname}", "100000", "1m"]))
        for limit in (10, 1000, 100000):
            out.append((f"RL.SLIDINGLOG limit {limit} ({label})", "rl",
                        ["RL.SLIDINGLOG", f"sl{limit}:{keyname}", str(limit), "10s"]))
    # Limiters that live, as a service's do: 100 per minute over the 100,000
    # keys. The rows above on random keys mostly measure creating a key (a
    # bucket of 1,000,000 refilled 1,000 per second is full, so gone, 1 ms
    # after a call). Here a window's key lives until its minute ends and a
    # bucket's while its key is hit more often than every 0.6 s (one token's
    # refill); the whole run sends each key about 36 requests, so no call
    # is denied.
    living = "100/min, 100,000 keys"
    out += [
        (f"RL.TOKENBUCKET ({living})", "rl", ["RL.TOKENBUCKET", "vtb:__rand_int__", "100", "100", "1m"]),
        (f"RL.WINDOW ({living})", "rl", ["RL.WINDOW", "vfw:__rand_int__", "100", "1m"]),
        (f"RL.GCRA ({living})", "rl", ["RL.GCRA", "vgc:__rand_int__", "100", "100", "1m"]),
        (f"RL.SLIDINGLOG ({living})", "rl", ["RL.SLIDINGLOG", "vsl:__rand_int__", "100", "1m"]),
        (f"RL.LIMIT, window policy ({living})", "rl", ["RL.LIMIT", "vlw:__rand_int__", "minute100"]),
        (f"RL.LIMIT, window policy with BRIEF ({living})", "rl",
         ["RL.LIMIT", "vlb:__rand_int__", "minute100brief"]),
        (f"RL.ALL, two limiters ({living})", "rl",
         ["RL.ALL", "2", "va1:{__rand_int__}", "va2:{__rand_int__}",
          "TOKENBUCKET", "100", "100", "1m", "WINDOW", "100", "1m"]),
        (f"RL.ALL, two policies ({living})", "rl",
         ["RL.ALL", "2", "vp1:{__rand_int__}", "vp2:{__rand_int__}",
          "POLICY", "bucket100", "POLICY", "minute100"]),
    ]
    if with_lua:
        out += [
            ("Lua token bucket", "lua", ["EVALSHA", sha["token_bucket"], "1", "ltb:__rand_int__", "1000000", "1000", "1"]),
            ("Lua fixed window", "lua", ["EVALSHA", sha["fixed_window"], "1", "lfw:__rand_int__", "1000000", "60"]),
            ("Lua sliding window", "lua", ["EVALSHA", sha["sliding_window"], "1", "lsw:__rand_int__", "1000000", "60000"]),
            ("Lua sliding log limit 1000", "lua", ["EVALSHA", sha["sliding_log"], "1", "lsl:__rand_int__", "1000", "10000"]),
        ]
    out = [(name, group, argv, server.port) for name, group, argv in out]
    if cell_server:
        for keyname, label in [("__rand_int__", "random keys"), ("hot", "one hot key")]:
            out.append((f"redis-cell CL.THROTTLE ({label})", "cell",
                        ["CL.THROTTLE", f"cell:{keyname}", "999999", "1000", "1"], cell_server.port))
    return out


def run_benchmark(port, argv, requests, pipeline):
    cmd = pinned(1, [BENCHMARK, "-p", str(port), "-c", "50", "-n", str(requests), "-P", str(pipeline),
                     "-r", str(KEYSPACE), "--csv"] + argv)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    row = rows[-1]
    return float(row["rps"]), float(row["p50_latency_ms"]), float(row["p99_latency_ms"])


def measure_throughput(server, todo, reps, requests, latency=True):
    results = {name: {1: [], 32: []} for name, _, _, _ in todo}
    runs = ((32, requests), (1, max(requests // 5, 1000))) if latency else ((32, requests),)
    for rep in range(reps):
        for pipeline, n in runs:
            for name, _, argv, port in todo:
                results[name][pipeline].append(run_benchmark(port, argv, n, pipeline))
        print(f"  repetition {rep + 1}/{reps} done", file=sys.stderr)
    med = {}
    for name, by_p in results.items():
        med[name] = {"rps32": statistics.median(r[0] for r in by_p[32])}
        if latency:
            med[name].update({
                "rps1": statistics.median(r[0] for r in by_p[1]),
                "p50": statistics.median(r[1] for r in by_p[1]),
                "p99": statistics.median(r[2] for r in by_p[1]),
            })
    return med


def check_living(server):
    """The living rows mean to measure allowed calls: warn if a sampled
    limiter has run out (then the rows measure denials too)."""
    c = server.client
    probes = [("vtb", ["100", "100", "1m"], "RL.TOKENBUCKET"), ("vfw", ["100", "1m"], "RL.WINDOW")]
    for prefix, params, command in probes:
        least = min(c.call(command, f"{prefix}:{i:012d}", *params, "DRYRUN")[2] for i in range(0, 100_000, 97))
        print(f"living rows: least remaining of sampled {prefix} keys: {least}", file=sys.stderr)
        if least == 0:
            print("WARNING: a living limiter ran out; its rows include denials", file=sys.stderr)


def with_replica(server, todo, reps, requests):
    """Throughput at pipeline 32 with one replica attached (on CPU 1, beside
    valkey-benchmark): INCR and every RL command now pay for propagation."""
    replica = Server(extra=("--replicaof", "127.0.0.1", str(server.port)), cpu=1)
    try:
        for _ in range(200):
            if replica.client.info("replication").get("master_link_status") == "up":
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("the replica did not connect")
        subset = [c for c in todo if c[1] == "floor" and c[0] == "INCR" or
                  c[1] == "rl" and ("random keys" in c[0] or "100,000 keys" in c[0])]
        print(f"with one replica: {len(subset)} cases x {reps} repetitions", file=sys.stderr)
        return measure_throughput(server, subset, reps, requests, latency=False)
    finally:
        replica.stop()


def lease_pairs(server, pairs):
    """Acquire + release pairs per second from one client pipelining 1,000
    of each (valkey-benchmark cannot feed a reply's lease id into the next
    command). Bound by this Python client as much as by the server."""
    c = server.client
    keys = 1000
    start = time.perf_counter()
    done = 0
    while done < pairs:
        batch = min(1000, pairs - done)
        acquired = []
        for i in range(batch):
            c.send("RL.LEASE", f"lp:{(done + i) % keys}", "100", "1m")
        for i in range(batch):
            reply = c.read()
            acquired.append((f"lp:{(done + i) % keys}", reply[5]))
        for key, lease_id in acquired:
            c.send("RL.RELEASE", key, lease_id)
        for _ in acquired:
            if c.read() != 1:
                raise RuntimeError("a release found no lease")
        done += batch
    return pairs / (time.perf_counter() - start)


def server_ms(c):
    secs, micros = c.call("TIME")
    return int(secs) * 1000 + int(micros) / 1000


def wake_latency(server, rounds):
    """How long after its permit is due a blocked client has its reply, in
    ms on the machine's clock (server and client share it): woken by the
    module's timer (token bucket refill), and by a release (lease)."""
    c, waiter = server.client, Client(server.port)
    timer, release = [], []
    for i in range(rounds):
        key = f"wake:{i}"
        c.call("RL.TOKENBUCKET", key, "1", "1", "100ms")
        c.send("MULTI")
        c.send("TIME")
        c.send("RL.TOKENBUCKET", key, "1", "1", "100ms", "DRYRUN")
        c.read(), c.read(), c.read()
        (secs, micros), reply = c.call("EXEC")
        due = int(secs) * 1000 + int(micros) / 1000 + reply[3]
        waiter.send("RL.TOKENBUCKET", key, "1", "1", "100ms", "BLOCK", "5s")
        if waiter.read()[0] != 1:
            raise RuntimeError("the waiter was not granted")
        timer.append(time.time() * 1000 - due)
        lease = f"wakel:{i}"
        held = c.call("RL.LEASE", lease, "1", "1m")[5]
        waiter.send("RL.LEASE", lease, "1", "1m", "BLOCK", "5s")
        while c.info("ratelimit").get("ratelimit_blocked_clients") != "1":
            time.sleep(0.001)
        sent = time.time() * 1000
        c.call("RL.RELEASE", lease, held)
        if waiter.read()[0] != 1:
            raise RuntimeError("the lease waiter was not granted")
        release.append(time.time() * 1000 - sent)
    waiter.sock.close()
    q = lambda xs: (statistics.median(xs), sorted(xs)[min(len(xs) - 1, int(len(xs) * 0.99))])
    return {"timer": q(timer), "release": q(release)}


def blocking_table(pairs_per_s, wake):
    lines = ["", f"RL.LEASE + RL.RELEASE pairs from one Python client (pipeline 1000, 1,000 keys): "
             f"{pairs_per_s:,.0f} pairs/s", "",
             "| blocked client woken by | median ms after due | p99 ms |", "|---|---:|---:|"]
    labels = {"timer": "the module's timer (token bucket refill due)",
              "release": "RL.RELEASE from another client (from sending it)"}
    for name, (median, p99) in wake.items():
        lines.append(f"| {labels[name]} | {median:.2f} | {p99:.2f} |")
    return "\n".join(lines) + "\n"


def used_memory(c):
    return int(c.info("memory")["used_memory"])


def memory_per_limiter(server, count, with_lua):
    """used_memory delta per key after creating `count` limiters of each kind."""
    c = server.client
    kinds = [
        ("INCR counter", lambda i: ["INCR", f"m:inc:{i}"]),
        ("RL.TOKENBUCKET", lambda i: ["RL.TOKENBUCKET", f"m:tb:{i}", "100", "1", "1h"]),
        ("RL.WINDOW", lambda i: ["RL.WINDOW", f"m:fw:{i}", "100", "1h"]),
        ("RL.WINDOW SLIDING", lambda i: ["RL.WINDOW", f"m:sw:{i}", "100", "1h", "SLIDING"]),
        ("RL.SLIDINGLOG (1 entry)", lambda i: ["RL.SLIDINGLOG", f"m:sl:{i}", "100", "1h"]),
        ("RL.GCRA", lambda i: ["RL.GCRA", f"m:gc:{i}", "100", "1", "1h"]),
    ]
    if with_lua:
        sha = c.call("SCRIPT", "LOAD", (BENCH / "lua" / "token_bucket.lua").read_text()).decode()
        kinds.append(("Lua token bucket (hash)", lambda i: ["EVALSHA", sha, "1", f"m:ltb:{i}", "100", "1", "1"]))
    out = {}
    for name, make in kinds:
        c.call("FLUSHALL", "SYNC")
        before = used_memory(c)
        c.pipeline([make(i) for i in range(count)])
        out[name] = (used_memory(c) - before) / count
    c.call("FLUSHALL", "SYNC")
    return out


def log_record(limit, period_ms, at_ms):
    """The effect RL.APPLY takes for one logged request (src/core/codec.rs)."""
    return struct.pack("<BBQQQQ", 1, 0x80, limit, period_ms, at_ms, 1)


def sliding_log_entry_bytes(server, sizes, with_lua):
    """Bytes per entry of one log holding N requests, each in its own
    millisecond (a log built with RL.APPLY, as a replica would build it),
    beside a Lua sorted-set log of N members."""
    c = server.client
    out = {}
    now = int(c.call("TIME")[0]) * 1000
    for n in sizes:
        period = 3_600_000
        gap = max(1, period // (n + 1))
        start = now - gap * n
        c.call("DEL", "m:log", "m:zlog")
        c.pipeline([["RL.APPLY", "m:log", log_record(n, period, start + i * gap)] for i in range(n)])
        got = c.call("RL.SLIDINGLOG", "m:log", str(n), "1h", "COST", "0")
        assert got[2] == 0, f"log of {n} entries was not full: {got}"
        rl = c.call("MEMORY", "USAGE", "m:log") / n
        z = None
        if with_lua:
            c.pipeline([["ZADD", "m:zlog", str(start + i * gap), f"{start + i * gap}-{i}"] for i in range(n)])
            z = c.call("MEMORY", "USAGE", "m:zlog") / n
        out[n] = (rl, z)
    c.call("DEL", "m:log", "m:zlog")
    return out


def replica_table(alone, replicated):
    lines = ["", "| case (random keys) | ops/s (-P 32), no replica | x INCR | with one replica | x INCR |",
             "|---|---:|---:|---:|---:|"]
    a_incr, r_incr = alone["INCR"]["rps32"], replicated["INCR"]["rps32"]
    for name, m in replicated.items():
        a = alone[name]["rps32"]
        lines.append(f"| {name} | {a:,.0f} | {a / a_incr:.2f} | {m['rps32']:,.0f} | {m['rps32'] / r_incr:.2f} |")
    return "\n".join(lines) + "\n"


def table(throughput, memory, log_bytes, machine):
    incr = throughput["INCR"]
    lines = [f"Machine: {machine}", "",
             "| case | ops/s (-P 32) | x INCR | p50 ms (-P 1) | p99 ms (-P 1) | p99 x INCR |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, m in throughput.items():
        lines.append(f"| {name} | {m['rps32']:,.0f} | {m['rps32'] / incr['rps32']:.2f} | {m['p50']:.3f} | "
                     f"{m['p99']:.3f} | {m['p99'] / incr['p99']:.2f} |")
    lines += ["", "| memory per limiter (used_memory delta) | bytes |", "|---|---:|"]
    for name, b in memory.items():
        lines.append(f"| {name} | {b:.1f} |")
    lines += ["", "| sliding log entries | RL.SLIDINGLOG bytes/entry | Lua sorted set bytes/entry |", "|---:|---:|---:|"]
    for n, (rl, z) in log_bytes.items():
        lines.append(f"| {n:,} | {rl:.2f} | {'' if z is None else f'{z:.2f}'} |")
    return "\n".join(lines) + "\n"


def chart(throughput, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no chart", file=sys.stderr)
        return False
    incr = throughput["INCR"]["rps32"]
    names = list(throughput)
    ratios = [throughput[n]["rps32"] / incr for n in names]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(names) + 1.5))
    colors = ["#888" if n in ("PING", "INCR") else "#c33" if n.startswith(("Lua", "redis-cell")) else "#36c" for n in names]
    ax.barh(names[::-1], ratios[::-1], color=colors[::-1])
    ax.axvline(0.8, color="k", linestyle="--", linewidth=1)
    ax.set_xlabel("throughput at pipeline 32, as a ratio to INCR (same run); dashed: the 0.8 target")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def machine():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    version = subprocess.run([SERVER, "--version"], capture_output=True, text=True).stdout.split()[2]
    return f"{os.cpu_count()} cores, {cpu}, Valkey {version.removeprefix('v=')}, server pinned to CPU 0 and valkey-benchmark to CPU 1" \
        if shutil.which("taskset") else f"{os.cpu_count()} cores, {cpu}, Valkey {version}, unpinned"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run in under a minute")
    parser.add_argument("--no-lua", action="store_true")
    args = parser.parse_args()
    reps, requests, limiters, log_sizes = (1, 100_000, 10_000, [10, 1000]) if args.quick \
        else (3, 1_000_000, 100_000, [10, 1000, 100_000])
    if not MODULE.exists():
        sys.exit(f"{MODULE} is missing: run cargo build --release (make bench does)")
    server = Server()
    cell_server = Server(CELL_MODULE) if CELL_MODULE else None
    try:
        with_lua = not args.no_lua
        todo = cases(server, with_lua, cell_server)
        print(f"throughput and latency: {len(todo)} cases x 2 pipelines x {reps} repetitions", file=sys.stderr)
        throughput = measure_throughput(server, todo, reps, requests)
        check_living(server)
        server.client.call("FLUSHALL", "SYNC")
        replicated = with_replica(server, todo, reps, requests)
        server.client.call("FLUSHALL", "SYNC")
        print("memory", file=sys.stderr)
        memory = memory_per_limiter(server, limiters, with_lua)
        log_bytes = sliding_log_entry_bytes(server, log_sizes, with_lua)
        server.client.call("FLUSHALL", "SYNC")
        print("leases and blocked clients", file=sys.stderr)
        pairs_per_s = lease_pairs(server, 20_000 if args.quick else 200_000)
        wake = wake_latency(server, 10 if args.quick else 100)
        text = table(throughput, memory, log_bytes, machine()) + replica_table(throughput, replicated) \
            + blocking_table(pairs_per_s, wake)
    finally:
        server.stop()
        if cell_server:
            cell_server.stop()
    print(text)
    if not args.quick:
        (BENCH / "RESULTS.md").write_text("# Benchmark results\n\nProduced by `make bench`.\n\n" + text)
        chart(throughput, BENCH / "ratios.png")


if __name__ == "__main__":
    main()
