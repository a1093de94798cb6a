#!/usr/bin/env python3
"""make profile: instructions per command under valgrind's callgrind, beside
INCR's, a figure that does not move with the load of a noisy machine.

Each case gets its own valkey-server under callgrind, collecting only inside
`processInputBuffer` (parsing the request, running the command, building the
reply; not the socket writes). valkey-benchmark sends WARMUP commands over
KEYS random keys (pipeline 32, one connection), the counters are dumped and
zeroed, then MEASURED commands are sent and dumped. Reported per command:
the whole command, and the instructions inside the module's own code (its
functions' self cost: parsing, deciding, encoding; the server API calls it
makes are the server's). Writes bench/PROFILE.md.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import BENCHMARK, MODULE, ROOT, SERVER, Client, free_port  # noqa: E402

KEYS = 5000
WARMUP = 20000
MEASURED = 20000

CASES = [
    ("INCR", ["INCR", "k:__rand_int__"]),
    ("RL.WINDOW", ["RL.WINDOW", "fw:__rand_int__", "1000000", "1h"]),
    ("RL.WINDOW BRIEF", ["RL.WINDOW", "fb:__rand_int__", "1000000", "1h", "BRIEF"]),
    ("RL.WINDOW SLIDING", ["RL.WINDOW", "sw:__rand_int__", "1000000", "1h", "SLIDING"]),
    ("RL.TOKENBUCKET", ["RL.TOKENBUCKET", "tb:__rand_int__", "1000000", "1000", "1s"]),
    # A bucket that does not fill up again between calls, so its key stays
    # (the row above is full 1 ms after a call: nearly every call creates it).
    ("RL.TOKENBUCKET, keys that stay", ["RL.TOKENBUCKET", "tk:__rand_int__", "1000000", "1", "1h"]),
    ("RL.SLIDINGLOG limit 1000", ["RL.SLIDINGLOG", "sl:__rand_int__", "1000", "10s"]),
    ("RL.GCRA", ["RL.GCRA", "gc:__rand_int__", "1000000", "1000", "1s"]),
    ("CL.THROTTLE", ["CL.THROTTLE", "cl:__rand_int__", "999999", "1000", "1"]),
    ("RL.ALL, two limiters", ["RL.ALL", "2", "a1:{__rand_int__}", "a2:{__rand_int__}",
                              "TOKENBUCKET", "1000000", "1000", "1s", "WINDOW", "1000000", "1m"]),
    ("RL.ALL, two policies", ["RL.ALL", "2", "p1:{__rand_int__}", "p2:{__rand_int__}",
                              "POLICY", "bucket", "POLICY", "minute"]),
    # The same with a bucket whose key stays (refilled 1 per hour), as a
    # service's limiters do: beside "RL.TOKENBUCKET, keys that stay" +
    # "RL.WINDOW" and the RL.LIMIT rows below, without the cost of creating
    # a key on nearly every call.
    ("RL.ALL, two limiters, keys that stay", ["RL.ALL", "2", "s1:{__rand_int__}", "s2:{__rand_int__}",
                                              "TOKENBUCKET", "1000000", "1", "1h", "WINDOW", "1000000", "1h"]),
    ("RL.ALL, two policies, keys that stay", ["RL.ALL", "2", "q1:{__rand_int__}", "q2:{__rand_int__}",
                                              "POLICY", "slowbucket", "POLICY", "win"]),
    # Its one-integer reply (0, or the wait): the fastest form of the call.
    ("RL.ALL BRIEF, two policies, keys that stay", ["RL.ALL", "2", "r1:{__rand_int__}", "r2:{__rand_int__}",
                                                    "POLICY", "slowbucket", "POLICY", "win", "BRIEF"]),
    ("RL.PEEK", ["RL.PEEK", "fw:__rand_int__"]),
    ("RL.LIMIT, window policy", ["RL.LIMIT", "lw:__rand_int__", "win"]),
    ("RL.LIMIT BRIEF, window policy", ["RL.LIMIT", "lb:__rand_int__", "win", "BRIEF"]),
    ("RL.LIMIT, token bucket policy", ["RL.LIMIT", "lt:__rand_int__", "bucket"]),
    ("RL.LIMIT, token bucket policy, keys that stay", ["RL.LIMIT", "ls:__rand_int__", "slowbucket"]),
    # The policy carries BRIEF: three arguments, the shortest call there is.
    ("RL.LIMIT, window policy with BRIEF", ["RL.LIMIT", "lp:__rand_int__", "winbrief"]),
    # The denied-keys report (RL.TOPDENIED) costs nothing on the allowed path
    # and one sketch update per denial: the same calls with it off and on.
    ("RL.WINDOW, report off", ["RL.WINDOW", "fo:__rand_int__", "1000000", "1h"],
     ["--ratelimit.denied-report-size", "0"]),
    ("RL.WINDOW denied, report off", ["RL.WINDOW", "dn:__rand_int__", "1", "1h", "COST", "2"],
     ["--ratelimit.denied-report-size", "0"]),
    ("RL.WINDOW denied, report of 100 keys, 5,000 keys denied",
     ["RL.WINDOW", "dr:__rand_int__", "1", "1h", "COST", "2"]),
    ("RL.WINDOW denied, report of 100 keys, one key denied",
     ["RL.WINDOW", "hot", "1", "1h", "COST", "2"]),
]

# Defined on every server before its case runs (RL.LIMIT's policies).
POLICIES = [
    ["RL.POLICY.SET", "win", "WINDOW", "1000000", "1h"],
    ["RL.POLICY.SET", "bucket", "TOKENBUCKET", "1000000", "1000", "1s"],
    ["RL.POLICY.SET", "minute", "WINDOW", "1000000", "1m"],
    ["RL.POLICY.SET", "winbrief", "WINDOW", "1000000", "1h", "BRIEF"],
    ["RL.POLICY.SET", "slowbucket", "TOKENBUCKET", "1000000", "1", "1h"],
]

# Each case twice: as on a server whose effects something may read (a
# replica, a backlog, the AOF: every change builds its RL.APPLY), and as on
# a lone primary without AOF, where nothing can and the build is skipped
# (src/shell/propagation.rs). The server drops the effect in both runs here.
MODES = [
    ("effects built", ["--ratelimit.always-propagate", "yes"]),
    ("nothing reads them", []),
]


def self_cost_in(path, object_suffix):
    """Total cost, and the self cost of functions in objects ending with
    `object_suffix`, from a callgrind output file."""
    names = {}
    total = 0
    ours = 0
    current_ours = False
    after_calls = False
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                total = max(total, int(line.split()[1]))
                continue
            if line.startswith("cob="):
                # A called object: only its name is learnt here.
                m = re.match(r"cob=\((\d+)\) (.*)", line.strip())
                if m:
                    names[m.group(1)] = m.group(2)
                continue
            if line.startswith("ob="):
                m = re.match(r"ob=\((\d+)\)(?: (.*))?", line.strip())
                if m:
                    if m.group(2):
                        names[m.group(1)] = m.group(2)
                    current_ours = names.get(m.group(1), "").endswith(object_suffix)
                else:
                    current_ours = line.strip()[3:].endswith(object_suffix)
                continue
            if line.startswith("calls="):
                after_calls = True
                continue
            if line[:1].isdigit() or line[:1] in "+-*":
                if after_calls:
                    after_calls = False  # inclusive cost of a call: not self
                    continue
                parts = line.split()
                if current_ours and len(parts) >= 2:
                    ours += int(parts[1])
    return total, ours


def run_case(name, argv, valgrind, server_args):
    work = tempfile.mkdtemp(prefix="rl-profile-")
    port = free_port()
    out = os.path.join(work, "callgrind.out")
    cmd = [valgrind, "--tool=callgrind", "--collect-atstart=no",
           "--toggle-collect=processInputBuffer", f"--callgrind-out-file={out}",
           SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", work,
           "--save", "", "--appendonly", "no", "--loadmodule", str(MODULE)] + server_args
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                Client(port).call("PING")
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"{name}: valkey-server under callgrind did not start")
        for policy in POLICIES:
            Client(port).call(*policy)

        def bench(n):
            subprocess.run([BENCHMARK, "-p", str(port), "-c", "1", "-n", str(n), "-P", "32",
                            "-r", str(KEYS), "-q"] + argv,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def dump(label):
            subprocess.run(["callgrind_control", "--dump=" + label, str(proc.pid)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        bench(WARMUP)
        dump("warmup")
        bench(MEASURED)
        dump("measured")
        time.sleep(0.5)
        dumps = sorted(Path(work).glob("callgrind.out*"))
        measured = [d for d in dumps if "measured" in d.read_text(errors="replace")[:2000]]
        if not measured:
            raise RuntimeError(f"{name}: no measured dump in {work}: {dumps}")
        total, ours = self_cost_in(measured[-1], MODULE.name)
        return total / MEASURED, ours / MEASURED
    finally:
        try:
            Client(port).send("SHUTDOWN", "NOSAVE")
        except OSError:
            pass
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def server_version():
    out = subprocess.run([SERVER, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"v=(\S+)", out)
    return m.group(1) if m else "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="run only cases whose name contains this")
    args = parser.parse_args()
    valgrind = shutil.which("valgrind")
    if not valgrind or not shutil.which("callgrind_control"):
        sys.exit("profile: valgrind is missing (apt-get install valgrind)")
    rows = []
    for name, argv, *extra in CASES:
        if args.only and args.only not in name:
            continue
        row = [name]
        for mode, server_args in MODES:
            per_call, in_module = run_case(name, argv, valgrind, server_args + sum(extra, []))
            row += [per_call, in_module]
            print(f"  {name:<32} {mode:<20} {per_call:>9,.0f} instructions/call, "
                  f"{in_module:>6,.0f} in the module", file=sys.stderr)
        rows.append(row)
    base = next((r for r in rows if r[0] == "INCR"), None)
    version = server_version()
    lines = [
        "# Instructions per command (make profile)",
        "",
        f"valgrind callgrind, Valkey {version}, `processInputBuffer` inclusive, {KEYS:,} random keys, "
        f"pipeline 32, one connection, {MEASURED:,} calls measured after {WARMUP:,} of warm-up; no replica, "
        "no AOF. \"effects built\": `ratelimit.always-propagate yes`, what every change costs where a "
        "replica, a backlog or the AOF may read it; \"nothing reads them\": the default on a lone primary "
        "without AOF, where the module skips building the effect (README, Performance). \"in the "
        "module\": the self cost of the module's own functions (parsing, deciding, encoding). "
        "Deterministic to within a few instructions from run to run.",
        "",
        "| command | effects built | x INCR | nothing reads them | x INCR | in the module |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, built, in_module, skipped, _ in rows:
        def ratio(value, column):
            return f"{value / base[column]:.2f}x" if base else "-"
        lines.append(f"| {name} | {built:,.0f} | {ratio(built, 1)} | {skipped:,.0f} | "
                     f"{ratio(skipped, 3)} | {in_module:,.0f} |")
    text = "\n".join(lines) + "\n"
    if not args.only:
        (ROOT / "bench" / "PROFILE.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
