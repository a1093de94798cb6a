#!/usr/bin/env python3
"""make demo: one traffic pattern through every algorithm, on the server's clock.

Starts its own valkey-server with the module on a free loopback port (always
stopped, also on Ctrl-C or an error), and sends one scheduled timeline of
requests. Each request is one MULTI/EXEC holding TIME and one call per
algorithm, so all five limiters see the same request at the same server time
(the module decides on the server's per-command cached clock, which is the
same for every command of a transaction and is what TIME reports there).

Every algorithm has the same nominal limit, 10 per 1 s:

    fixed window            RL.WINDOW k 10 1s
    sliding window counter  RL.WINDOW k 10 1s SLIDING
    sliding log             RL.SLIDINGLOG k 10 1s
    token bucket            RL.TOKENBUCKET k 10 10 1s
    GCRA                    RL.GCRA k 10 10 1s

The timeline, in seconds from a whole second of the server's clock (fixed
windows begin on every whole second):

    0.0 - 2.94   steady: one request every 210 ms, about half the limit
    4.905-4.986  10 requests just before the 5 s window boundary,
    5.005-5.086  10 just after it
    6.5 - 8.49   a client hammering at 100 per second for 2 s
    8.5 - 10.3   idle, then 10 requests at once (10.3 - 10.39)

Output: a text summary (per algorithm and phase: allowed, denied, the most
allowed in any 1000 ms), target/demo/demo.png with one panel per algorithm
(copied to docs/demo.png for the README) and target/demo/demo.csv with every
decision. Without matplotlib the text summary is still printed. About 14 s.
"""

import csv
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench import Client as BenchClient  # noqa: E402
MODULE = Path(os.environ.get("RL_MODULE", ROOT / "target/release/libvalkey_ratelimit.so"))
SERVER = os.environ.get("VALKEY_SERVER") or shutil.which("valkey-server") or "valkey-server"
OUT = ROOT / "target/demo"
DOCS_PNG = ROOT / "docs/demo.png"

LIMIT = 10
ALGOS = [
    ("fixed window", "fixed", ["RL.WINDOW", "demo:fixed", LIMIT, "1s"]),
    ("sliding window counter", "sliding", ["RL.WINDOW", "demo:sliding", LIMIT, "1s", "SLIDING"]),
    ("sliding log", "log", ["RL.SLIDINGLOG", "demo:log", LIMIT, "1s"]),
    ("token bucket", "bucket", ["RL.TOKENBUCKET", "demo:bucket", LIMIT, LIMIT, "1s"]),
    ("GCRA", "gcra", ["RL.GCRA", "demo:gcra", LIMIT, LIMIT, "1s"]),
]

# (phase, planned times in ms from the start); the boundary burst straddles BOUNDARY.
BOUNDARY = 5000
PHASES = [
    # Every 210 ms: 5 in any 1000 ms with 50 ms to spare for timing jitter.
    ("steady ~5/s", [210 * i for i in range(15)]),
    # 9 ms apart: 10 in the last 100 ms before the boundary, 10 in the first after.
    ("boundary burst 10+10", [BOUNDARY - 95 + 9 * i for i in range(10)]
                             + [BOUNDARY + 5 + 9 * i for i in range(10)]),
    ("hammer 100/s for 2 s", [6500 + 10 * i for i in range(200)]),
    ("idle 1.8 s + 10 at once", [10300 + 10 * i for i in range(10)]),
]
# Shaded spans of the phases in the chart (ms), idle included in the last one.
PHASE_SPANS = [(0, 3000), (4800, 5200), (6500, 8500), (8500, 10500)]
END_MS = 10500


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    """In the child: get SIGKILL when the demo dies, even by SIGKILL (Linux)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Client(BenchClient):
    """bench.py's RESP2 client, with Nagle off and a pipeline that returns
    every reply."""

    def __init__(self, port):
        super().__init__(port)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def pipeline(self, commands):
        self.sock.sendall(b"".join(self.encode(c) for c in commands))
        return [self.read() for _ in commands]

    def call(self, *args):
        return self.pipeline([args])[0]


class Server:
    def __init__(self):
        if not MODULE.exists():
            raise SystemExit(f"demo: {MODULE} is missing: run `cargo build --release` (make build)")
        self.dir = tempfile.mkdtemp(prefix="rl-demo-")
        self.port = free_port()
        self.log = Path(self.dir) / "valkey.log"
        argv = [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                "--save", "", "--appendonly", "no", "--logfile", str(self.log),
                "--loadmodule", str(MODULE)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     preexec_fn=die_with_parent)
        for _ in range(100):
            if self.proc.poll() is not None:
                break
            try:
                self.client = Client(self.port)
                self.client.call("PING")
                return
            except OSError:
                time.sleep(0.05)
        log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        self.stop()
        raise SystemExit(f"demo: {SERVER} did not start with {MODULE}\n{log}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def server_us(reply):
    return int(reply[0]) * 1_000_000 + int(reply[1])


def run_timeline(client):
    """Send every planned request at its time; return the decisions and T0 (µs)."""
    a = time.perf_counter()
    now = server_us(client.call("TIME"))
    b = time.perf_counter()
    # The start: the next whole second of the server's clock at least 0.3 s away.
    t0 = (now + 300_000 + 999_999) // 1_000_000 * 1_000_000
    local_t0 = (a + b) / 2 + (t0 - now) / 1e6

    plan = sorted((ms, phase) for phase, times in PHASES for ms in times)
    rows = []
    for planned, phase in plan:
        delay = local_t0 + planned / 1000 - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        commands = [["MULTI"], ["TIME"]] + [argv for _, _, argv in ALGOS] + [["EXEC"]]
        replies = client.pipeline(commands)
        result = replies[-1]
        if result is None:
            raise RuntimeError("EXEC aborted")
        at_ms = server_us(result[0]) // 1000 - t0 // 1000  # the module's clock, in ms
        decisions = [reply[0] for reply in result[1:]]
        rows.append({"phase": phase, "planned_ms": planned, "server_ms": at_ms,
                     "allowed": decisions})
    return rows, t0


def max_in_span(times, span=1000):
    """The most times in any half-open interval [t, t + span), and its start."""
    times = sorted(times)
    best, start, j = 0, None, 0
    for i, t in enumerate(times):
        while times[j] <= t - span:
            j += 1
        if i - j + 1 > best:
            best, start = i - j + 1, times[j]
    return best, start


def summarize(rows):
    phases = [p for p, _ in PHASES]
    stats = {}
    for k, (name, short, _) in enumerate(ALGOS):
        per = {}
        for phase in phases:
            mine = [r for r in rows if r["phase"] == phase]
            allowed = [r["server_ms"] for r in mine if r["allowed"][k]]
            per[phase] = {"allowed": len(allowed), "denied": len(mine) - len(allowed),
                          "max1s": max_in_span(allowed)[0]}
        allowed_all = [r["server_ms"] for r in rows if r["allowed"][k]]
        burst = [r for r in rows if r["phase"] == phases[1]]
        stats[short] = {
            "name": name, "phases": per,
            "total_allowed": len(allowed_all), "total_denied": len(rows) - len(allowed_all),
            "max1s": max_in_span(allowed_all),
            "burst_before": sum(1 for r in burst if r["allowed"][k] and r["server_ms"] < BOUNDARY),
            "burst_after": sum(1 for r in burst if r["allowed"][k] and r["server_ms"] >= BOUNDARY),
        }
    return stats


def report(rows, stats, version):
    lines = []
    out = lines.append
    late = sorted(r["server_ms"] - r["planned_ms"] for r in rows)
    out(f"demo: {len(rows)} requests x {len(ALGOS)} algorithms, limit {LIMIT} per 1 s, "
        f"Valkey {version}, server clock")
    out(f"timing: requests reached the server {late[len(late) // 2]} ms (median), "
        f"at most {late[-1]} ms after their planned time")
    wrong = [r for r in rows if r["phase"] == PHASES[1][0]
             and (r["planned_ms"] < BOUNDARY) != (r["server_ms"] < BOUNDARY)]
    if wrong:
        out(f"warning: {len(wrong)} burst requests landed on the other side of the boundary "
            f"(the machine was busy): rerun for the intended picture")
    out("")
    width = max(len(p) for p, _ in PHASES)
    names = {"fixed window": "fixed window", "sliding window counter": "sliding counter"}
    header = f"{'phase':<{width}}  {'sent':>4}" + "".join(
        f"  {names.get(s['name'], s['name']):>15}" for s in stats.values())
    out("allowed/denied, and the most allowed in any 1000 ms")
    out(header)
    out("-" * len(header))

    def cell(allowed, denied, best):
        return f"  {allowed:>3}/{denied:<3} max {best:>2}".rjust(17)

    for phase, times in PHASES:
        out(f"{phase:<{width}}  {len(times):>4}" + "".join(
            cell(p["allowed"], p["denied"], p["max1s"])
            for p in (s["phases"][phase] for s in stats.values())))
    out(f"{'whole run':<{width}}  {len(rows):>4}" + "".join(
        cell(s["total_allowed"], s["total_denied"], s["max1s"][0]) for s in stats.values()))
    out("")
    for s in stats.values():
        best, start = s["max1s"]
        where = f"from {start / 1000:.3f} s" if start is not None else ""
        out(f"{s['name']:<22}  burst {s['burst_before']:>2} before + {s['burst_after']:>2} after "
            f"the boundary; most allowed in any 1000 ms: {best:>2} "
            f"({best / LIMIT:.1f}x the limit) {where}")
    return "\n".join(lines)


def chart(rows, stats, version, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    bucket = 100
    nb = END_MS // bucket
    fig, axes = plt.subplots(len(ALGOS), 1, figsize=(10, 8.4), sharex=True, sharey=True)
    centers = [(i + 0.5) * bucket / 1000 for i in range(nb)]
    for k, (ax, (name, short, argv)) in enumerate(zip(axes, ALGOS)):
        ok, no = [0] * nb, [0] * nb
        for r in rows:
            i = min(max(r["server_ms"], 0) // bucket, nb - 1)
            (ok if r["allowed"][k] else no)[i] += 1
        for lo, hi in PHASE_SPANS:
            ax.axvspan(lo / 1000, hi / 1000, color="#f2f2f2", zorder=0)
        for sec in range(0, END_MS // 1000 + 1):
            ax.axvline(sec, color="#999999", lw=0.6, ls=":", zorder=1)
        ax.axvline(BOUNDARY / 1000, color="#555555", lw=1.0, ls="--", zorder=1)
        ax.bar(centers, ok, width=0.085, color="#2e9d49", label="allowed", zorder=2)
        ax.bar(centers, no, width=0.085, bottom=ok, color="#d83b3b", label="denied", zorder=2)
        best, start = stats[short]["max1s"]
        if start is not None:
            colour = "#d83b3b" if best > LIMIT else "#2e9d49"
            ax.plot([start / 1000, start / 1000 + 1], [11.2, 11.2], color=colour, lw=2.5, zorder=3)
            ax.text(start / 1000 + 1.05, 11.2, f"{best} allowed in 1 s", va="center",
                    fontsize=8, color=colour)
        cmd = " ".join(str(a) for a in argv).replace(f"demo:{short}", "k")
        ax.text(-0.1, 11.6, name, fontsize=9, fontweight="bold", va="center")
        ax.text(-0.1, 10.2, cmd, fontsize=7.5, va="center", family="monospace", color="#444444")
        s = stats[short]
        ax.text(END_MS / 1000 - 0.05, 11.6, f"{s['total_allowed']} allowed, {s['total_denied']} denied",
                fontsize=8, ha="right", va="center", color="#444444")
        ax.set_ylim(0, 12.5)
        ax.set_yticks([0, 5, 10])
        ax.tick_params(labelsize=8)
    top = axes[0]
    for (phase, _), (lo, hi) in zip(PHASES, PHASE_SPANS):
        top.text((lo + hi) / 2000, 13.0, phase, ha="center", va="bottom", fontsize=8, color="#444444")
    axes[-1].set_xlim(-0.2, END_MS / 1000)
    axes[-1].set_xticks(range(0, END_MS // 1000 + 1))
    axes[-1].set_xlabel("server time, s (dotted: fixed-window boundaries; dashed: the burst's boundary)",
                        fontsize=8)
    axes[len(ALGOS) // 2].set_ylabel(f"requests per {bucket} ms", fontsize=8)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(0.30, 0.9), fontsize=8, ncol=2, frameon=False)
    fig.suptitle(f"One traffic pattern, five algorithms, all limited to {LIMIT} per 1 s "
                 f"(valkey-ratelimit on Valkey {version})", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.975), h_pad=0.6)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80, pil_kwargs={"optimize": True})
    plt.close(fig)
    return True


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["phase", "planned_ms", "server_ms"] + [short for _, short, _ in ALGOS])
        for r in rows:
            w.writerow([r["phase"], r["planned_ms"], r["server_ms"]] + r["allowed"])


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server = Server()
    try:
        info = server.client.call("INFO", "server").decode()
        version = next((l.split(":", 1)[1].strip() for l in info.splitlines()
                        if l.startswith("valkey_version:")), "?")
        print(f"demo: valkey-server {version} on 127.0.0.1:{server.port} with {MODULE.name}; "
              f"the timeline takes about {END_MS / 1000 + 1:.0f} s")
        rows, _ = run_timeline(server.client)
    finally:
        server.stop()
    stats = summarize(rows)
    text = report(rows, stats, version)
    OUT.mkdir(parents=True, exist_ok=True)
    write_csv(rows, OUT / "demo.csv")
    print(text)
    png = OUT / "demo.png"
    if chart(rows, stats, version, png):
        DOCS_PNG.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, DOCS_PNG)
        print(f"\nchart: {png} ({png.stat().st_size // 1024} KB), copied to {DOCS_PNG.relative_to(ROOT)}")
    else:
        print("\ndemo: matplotlib unavailable, the chart is skipped (text summary only)")
    (OUT / "summary.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
