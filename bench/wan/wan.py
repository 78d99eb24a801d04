#!/usr/bin/env python3
"""Regions behind real networks: Spillway's control plane across Linux network namespaces.

Each region is a network namespace holding its own `spillway controller`, one
`spillway aggregator`, two linked `spillway proxy` sidecars, an upstream that counts what the
sidecars admit, a paced load, and a delaying relay in front of its controller. The regions reach
each other only through a hub namespace, over veth pairs, by routing:

    region r1 (198.18.1.2) --veth-- hub (forwards) --veth-- region r2 (198.18.2.2) ...

Addresses are from 198.18.0.0/15, the range set aside for network benchmarks (RFC 2544); they exist
only inside the namespaces this script makes, and the load never leaves them.

- Delay: the kernel may lack netem, so each region's relay (asyncio, in its namespace) accepts the
  peers' streams on the region's address and holds every chunk D ms before passing it on, both
  ways: one-way delay D between any two regions, a round trip of 2 D.
- Partition: an nftables set in the hub's forward chain; a region's address in it is cut off from
  every other region (`ip saddr @cut drop`, `ip daddr @cut drop`). Healing flushes the set.
- Loss: `numgen random mod 100 < 1 drop` in the hub's forward chain: each packet between two
  regions is lost with probability 1%.

One global drop-ratio bucket; every region offers the same load, 1.5 times the limit in all. The
upstreams count admitted requests in 100 ms bins; the figures come from those counts.

Usage (as root, from the repository's root):
  bench/wan/wan.py steady --delay-ms 50 [--seconds 20]
  bench/wan/wan.py partition --delay-ms 25 [--partition-seconds 30]
  bench/wan/wan.py loss --delay-ms 25
Common options: --spillway PATH (default $CARGO_TARGET_DIR or target, debug build), --regions N,
--limit RPS, --interval-ms MS, --json (one JSON object on stdout instead of the summary).
Exits 77 with "skipped: needs root and network namespaces" where it cannot make namespaces.
"""

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
CONTROLLER_PORT = 7001
AGGREGATOR_PORT = 7101
UPSTREAM_PORT = 8000
PROXY_PORTS = (8081, 8082)
PROXY_ADMIN_PORTS = (9911, 9912)
CONTROLLER_ADMIN = 9902
BIN_MS = 100


# ---------------------------------------------------------------- the agent (inside a region)


class Counter:
    """Counts in 100 ms bins of Unix time."""

    def __init__(self):
        self.bins = {}

    def add(self):
        b = int(time.time() * 1000) // BIN_MS
        self.bins[b] = self.bins.get(b, 0) + 1


async def upstream(admitted):
    async def serve(reader, writer):
        try:
            while True:
                # GETs without a body: the head up to its blank line.
                while True:
                    line = await reader.readline()
                    if not line:
                        return
                    if line == b"\r\n":
                        break
                admitted.add()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", UPSTREAM_PORT)


async def relay(listen, delay_s):
    """Accepts on `listen`, dials the controller on loopback, and holds every chunk `delay_s`
    before writing it on, in order, each way."""

    async def pump(reader, writer):
        queue = asyncio.Queue()

        async def read():
            try:
                while True:
                    data = await reader.read(65536)
                    await queue.put((time.monotonic() + delay_s, data))
                    if not data:
                        return
            except ConnectionError:
                await queue.put((time.monotonic(), b""))

        async def write():
            try:
                while True:
                    due, data = await queue.get()
                    wait = due - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    if not data:
                        writer.close()
                        return
                    writer.write(data)
                    await writer.drain()
            except ConnectionError:
                writer.close()

        await asyncio.gather(read(), write())

    async def serve(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(
                "127.0.0.1", CONTROLLER_PORT
            )
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            pump(client_reader, server_writer),
            pump(server_reader, client_writer),
            return_exceptions=True,
        )

    return await asyncio.start_server(serve, listen, CONTROLLER_PORT)


async def load(port, rate, start, end, offered, limited):
    """`rate` GETs a second on one keep-alive connection, paced from `start` to `end` (Unix
    seconds); behind schedule it sends at once, never more than the schedule."""
    period = 1.0 / rate
    n = 0
    conn = None
    while True:
        due = start + n * period
        if due >= end:
            break
        n += 1
        wait = due - time.time()
        if wait > 0:
            await asyncio.sleep(wait)
        elif wait < -0.2:
            # Far behind (the machine stalled): skip what is missed rather than send it in a
            # burst, which would not be the paced load the figures assume.
            n = int((time.time() - start) / period) + 1
        try:
            if conn is None:
                conn = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
            reader, writer = conn
            writer.write(b"GET /orders HTTP/1.1\r\nhost: wan\r\n\r\n")
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), 5)
            status = int(status_line.split()[1])
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.decode().partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if length:
                await reader.readexactly(length)
            offered.add()
            if status == 429:
                limited.add()
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
            if conn is not None:
                conn[1].close()
            conn = None


async def agent_main(args):
    admitted, offered, limited = Counter(), Counter(), Counter()
    servers = [await upstream(admitted)]
    if args.relay:
        servers.append(await relay(args.relay, args.delay_ms / 1000.0))
    # Ready: the orchestrator waits for this line, then sends when the load starts and ends
    # (Unix seconds) once every sidecar is linked.
    print("ready", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    try:
        args.load_start, args.end = (float(x) for x in line.split())
    except ValueError:
        return
    loads = []
    for port in PROXY_PORTS:
        for _ in range(2):
            loads.append(
                load(port, args.rate / 4, args.load_start, args.end, offered, limited)
            )
    # Bounded: the load ends at `end`, the agent a second later whatever happens.
    remaining = args.end + 1 - time.time()
    try:
        await asyncio.wait_for(asyncio.gather(*loads), max(remaining, 0.1))
    except asyncio.TimeoutError:
        pass
    for s in servers:
        s.close()
    with open(args.out, "w") as f:
        json.dump({"admitted": admitted.bins, "offered": offered.bins, "limited": limited.bins}, f)


# ---------------------------------------------------------------- the orchestrator


def run(cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


def can_make_namespaces():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nft"):
        return False
    name = f"swprobe{os.getpid()}"
    ok = run(["ip", "netns", "add", name], check=False).returncode == 0
    if ok:
        run(["ip", "netns", "del", name], check=False)
    return ok


class Wan:
    """The namespaces, links, nftables and processes of one run; `close` undoes all of it and is
    safe to call twice (it runs at exit and on SIGTERM too)."""

    def __init__(self, regions, tag):
        self.tag = tag
        self.hub = f"{tag}-hub"
        self.regions = [f"{tag}-r{i}" for i in range(1, regions + 1)]
        self.procs = []
        self.made = []

    def addr(self, i):
        return f"198.18.{i + 1}.2"

    def up(self):
        run(["ip", "netns", "add", self.hub])
        self.made.append(self.hub)
        run(["ip", "-n", self.hub, "link", "set", "lo", "up"])
        run(["ip", "netns", "exec", self.hub, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        for i, ns in enumerate(self.regions):
            run(["ip", "netns", "add", ns])
            self.made.append(ns)
            hub_side, region_side = f"{self.tag}h{i + 1}", f"{self.tag}r{i + 1}"
            run(["ip", "link", "add", hub_side, "netns", self.hub, "type", "veth",
                 "peer", "name", region_side, "netns", ns])
            run(["ip", "-n", self.hub, "addr", "add", f"198.18.{i + 1}.1/24", "dev", hub_side])
            run(["ip", "-n", self.hub, "link", "set", hub_side, "up"])
            run(["ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", region_side])
            run(["ip", "-n", ns, "link", "set", region_side, "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            run(["ip", "-n", ns, "route", "add", "default", "via", f"198.18.{i + 1}.1"])
        ruleset = (
            "table inet wan {\n"
            "  set cut { type ipv4_addr; }\n"
            "  chain forward {\n"
            "    type filter hook forward priority 0; policy accept;\n"
            "    ip saddr @cut drop\n"
            "    ip daddr @cut drop\n"
            "  }\n"
            "}\n"
        )
        run(["ip", "netns", "exec", self.hub, "nft", "-f", "-"], input=ruleset)

    def nft(self, *command):
        run(["ip", "netns", "exec", self.hub, "nft", *command])

    def lossy(self, percent):
        self.nft("add", "rule", "inet", "wan", "forward", "numgen", "random", "mod", "100",
                 "<", str(percent), "drop")

    def cut(self, i):
        self.nft("add", "element", "inet", "wan", "cut", "{", self.addr(i), "}")

    def heal(self):
        self.nft("flush", "set", "inet", "wan", "cut")

    def spawn(self, ns, cmd, log, **kw):
        f = open(log, "w")
        p = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], stdout=kw.pop("stdout", f),
                             stderr=f, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 5
        for p in self.procs:
            try:
                p.wait(max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        self.procs = []
        # Deleting a namespace deletes its veth ends, and the pair with them.
        for ns in reversed(self.made):
            run(["ip", "netns", "del", ns], check=False)
        self.made = []


def rules(limit, interval_ms, ttl_s):
    return (
        "version: 1\ncontrol:\n"
        f"  report_interval: {interval_ms}ms\n  instruction_ttl: {ttl_s}s\n"
        "services:\n  api:\n    buckets:\n"
        f"      - {{ name: all, limit: {limit}/s, scope: global }}\n"
    )


def in_ns(ns, url):
    """A GET inside namespace `ns` (curl, 1 s at most): the body, or '' when it fails."""
    r = run(["ip", "netns", "exec", ns, "curl", "-s", "-m", "1", url], check=False)
    return r.stdout if r.returncode == 0 else ""


def metric(body, name, having=""):
    for line in body.splitlines():
        if line.startswith(name) and having in line:
            try:
                return float(line.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None


def start_fleet(wan, args, work):
    with open(f"{work}/rules.yaml", "w") as f:
        f.write(rules(args.limit, args.interval_ms, args.ttl_s))
    # The sidecars' own file: a limit nobody reaches, so only the control plane's rules drop.
    with open(f"{work}/proxy.yaml", "w") as f:
        f.write(rules(1_000_000, args.interval_ms, args.ttl_s))
    n = len(wan.regions)
    agents = []
    for i, ns in enumerate(wan.regions):
        p = wan.spawn(ns, [sys.executable, os.path.abspath(__file__), "agent",
                           "--relay", wan.addr(i), "--delay-ms", str(args.delay_ms),
                           "--rate", str(1.5 * args.limit / n),
                           "--out", f"{work}/agent-{i}.json"],
                      f"{work}/agent-{i}.log", stdout=subprocess.PIPE, stdin=subprocess.PIPE)
        agents.append(p)
    for p in agents:
        line = p.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError("an agent did not start: see its log")
    sw = args.spillway
    for i, ns in enumerate(wan.regions):
        region = f"r{i + 1}"
        peers = []
        for j in range(n):
            if j != i:
                peers += ["--peer", f"http://{wan.addr(j)}:{CONTROLLER_PORT}"]
        wan.spawn(ns, [sw, "controller", "--listen", f"127.0.0.1:{CONTROLLER_PORT}",
                       "--region", region, "-c", f"{work}/rules.yaml", *peers,
                       "--admin", f"127.0.0.1:{CONTROLLER_ADMIN}"],
                  f"{work}/controller-{region}.log")
        wan.spawn(ns, [sw, "aggregator", "--listen", f"127.0.0.1:{AGGREGATOR_PORT}",
                       "--region", region, "--zone", f"{region}a",
                       "--controller", f"http://127.0.0.1:{CONTROLLER_PORT}"],
                  f"{work}/aggregator-{region}.log")
        for k, (port, admin) in enumerate(zip(PROXY_PORTS, PROXY_ADMIN_PORTS)):
            host = f"{region}p{k + 1}"
            wan.spawn(ns, [sw, "proxy", "-c", f"{work}/proxy.yaml",
                           "--listen", f"127.0.0.1:{port}",
                           "--upstream", f"http://127.0.0.1:{UPSTREAM_PORT}",
                           "--aggregator", f"http://127.0.0.1:{AGGREGATOR_PORT}",
                           "--region", region, "--zone", f"{region}a", "--host-id", host,
                           "--state-dir", f"{work}/{host}-state",
                           "--admin", f"127.0.0.1:{admin}"],
                      f"{work}/proxy-{host}.log")
    # Every sidecar linked and running the controller's limit before the load starts.
    deadline = time.time() + args.startup_s
    waiting = [(ns, a) for ns in wan.regions for a in PROXY_ADMIN_PORTS]
    while waiting and time.time() < deadline:
        ns, a = waiting[0]
        body = in_ns(ns, f"http://127.0.0.1:{a}/metrics")
        if (metric(body, "spillway_control_plane_connected") == 1.0
                and metric(body, "spillway_bucket_limit_rps", 'bucket="all"') == args.limit):
            waiting.pop(0)
        else:
            time.sleep(0.2)
    if waiting:
        raise RuntimeError(f"sidecars not linked within {args.startup_s} s: {waiting}")
    load_start = time.time() + 0.5
    end = load_start + args.total_s
    for p in agents:
        p.stdin.write(f"{load_start} {end}\n".encode())
        p.stdin.flush()
    return load_start, end, agents


def collect(wan, agents, work, end):
    for p in agents:
        try:
            p.wait(max(end + 5 - time.time(), 1))
        except subprocess.TimeoutExpired:
            pass
    out = []
    for i in range(len(wan.regions)):
        with open(f"{work}/agent-{i}.json") as f:
            raw = json.load(f)
        out.append({k: {int(b): c for b, c in v.items()} for k, v in raw.items()})
    return out


def series(per_region, key, regions, start, end):
    """Counts per 100 ms bin from `start` to `end` (Unix s) over `regions`."""
    first, last = int(start * 1000) // BIN_MS, int(end * 1000) // BIN_MS
    return [sum(per_region[r][key].get(b, 0) for r in regions) for b in range(first, last)]


def per_second(bins):
    """Sliding one-second sums, every 100 ms."""
    w = 1000 // BIN_MS
    return [sum(bins[k:k + w]) for k in range(0, max(len(bins) - w + 1, 0))]


def rate(bins):
    return sum(bins) * 1000 / BIN_MS / max(len(bins), 1)


def analyse(args, data, marks):
    n = len(data)
    everyone = range(n)
    limit = args.limit
    res = {"scenario": args.scenario, "delay_ms": args.delay_ms, "regions": n, "limit": limit,
           "interval_ms": args.interval_ms, "loss_percent": args.loss_percent}
    load_start, end = marks["load_start"], marks["end"]
    settle = load_start + args.warmup_s
    whole = series(data, "admitted", everyone, settle, end)
    windows = per_second(whole)
    res["max_second_x"] = round(max(windows) / limit, 3) if windows else None
    res["offered_rps"] = round(rate(series(data, "offered", everyone, settle, end)), 1)
    if args.scenario in ("steady", "loss"):
        res["admitted_rps"] = round(rate(whole), 1)
        res["admitted_x"] = round(rate(whole) / limit, 3)
        res["min_second_x"] = round(min(windows) / limit, 3) if windows else None
        return res
    cut, healed = marks["cut"], marks["healed"]
    before = series(data, "admitted", everyone, settle, cut)
    res["before_x"] = round(rate(before) / limit, 3)
    # During the partition, after the first two intervals and a report interval more (the sides
    # need that long to stop counting each other): each side's admitted rate.
    skip = 3 * args.interval_ms / 1000
    alone = [n - 1]
    rest = list(range(n - 1))
    during = (cut + skip, healed)
    res["partition_alone_rps"] = round(rate(series(data, "admitted", alone, *during)), 1)
    res["partition_rest_rps"] = round(rate(series(data, "admitted", rest, *during)), 1)
    res["partition_total_x"] = round(
        rate(series(data, "admitted", everyone, *during)) / limit, 3)
    res["partition_offered_rps"] = round(rate(series(data, "offered", everyone, *during)), 1)
    # Re-convergence: from the heal, the first 100 ms step from which every sliding second of
    # the admitted total stays within 10% of the limit to the end of the run.
    after = per_second(series(data, "admitted", everyone, healed, end))
    settled = None
    for k in range(len(after)):
        if all(abs(w - limit) <= 0.1 * limit for w in after[k:]):
            settled = k
            break
    res["reconverge_s"] = None if settled is None else round(settled * BIN_MS / 1000, 1)
    back = marks.get("peers_back")
    res["peers_back_s"] = None if back is None else round(back - healed, 1)
    # After the heal, from one second on (or the run's last five).
    tail = max(healed + 1, end - 5)
    res["after_x"] = round(rate(series(data, "admitted", everyone, tail, end)) / limit, 3)
    return res


def main_run(args):
    if not can_make_namespaces():
        print("skipped: needs root and network namespaces (ip netns, nft)")
        return SKIP
    tag = args.tag or f"sw{os.getpid() % 100000:05d}"
    wan = Wan(args.regions, tag)
    work = tempfile.mkdtemp(prefix="spillway-wan-")

    def stop(*_):
        wan.close()
        sys.exit(1)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        wan.up()
        if args.scenario == "loss":
            wan.lossy(args.loss_percent)
        else:
            args.loss_percent = 0
        if args.scenario == "partition":
            args.total_s = args.warmup_s + args.before_s + args.partition_s + args.after_s
        else:
            args.total_s = args.warmup_s + args.seconds
        load_start, end, agents = start_fleet(wan, args, work)
        marks = {"load_start": load_start, "end": end}
        if args.scenario == "partition":
            cut = load_start + args.warmup_s + args.before_s
            time.sleep(max(cut - time.time(), 0))
            wan.cut(len(wan.regions) - 1)
            marks["cut"] = time.time()
            time.sleep(max(cut + args.partition_s - time.time(), 0))
            wan.heal()
            marks["healed"] = time.time()
            # When the cut-off region's controller hears its peers again (its live peers gauge
            # counts those heard within the TTL, which the partition outlasted).
            ns = wan.regions[-1]
            url = f"http://127.0.0.1:{CONTROLLER_ADMIN}/metrics"
            while time.time() < end - 1:
                body = in_ns(ns, url)
                if metric(body, "spillway_controller_live_peers") == len(wan.regions) - 1:
                    marks["peers_back"] = time.time()
                    break
                time.sleep(0.1)
        data = collect(wan, agents, work, end)
        with open(f"{work}/marks.json", "w") as f:
            json.dump(marks, f)
        res = analyse(args, data, marks)
        if args.keep:
            res["work"] = work
        else:
            shutil.rmtree(work, ignore_errors=True)
    except Exception as e:  # noqa: BLE001 - reported, then the namespaces are removed
        print(f"error: {e} (logs in {work})", file=sys.stderr)
        return 1
    finally:
        wan.close()
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k}: {v}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="scenario", required=True)
    for name in ("steady", "partition", "loss"):
        s = sub.add_parser(name)
        target = os.environ.get("CARGO_TARGET_DIR", "target")
        s.add_argument("--spillway", default=os.path.join(target, "debug", "spillway"))
        s.add_argument("--regions", type=int, default=3)
        s.add_argument("--delay-ms", type=float, default=25)
        s.add_argument("--limit", type=int, default=300)
        s.add_argument("--interval-ms", type=int, default=1000)
        s.add_argument("--ttl-s", type=int, default=5)
        s.add_argument("--startup-s", type=float, default=30,
                       help="at most this long for every sidecar to link")
        s.add_argument("--warmup-s", type=float, default=5)
        s.add_argument("--seconds", type=float, default=20, help="steady, loss: measured")
        s.add_argument("--before-s", type=float, default=5)
        s.add_argument("--partition-s", type=float, default=30)
        s.add_argument("--after-s", type=float, default=15)
        s.add_argument("--loss-percent", type=int, default=1)
        s.add_argument("--json", action="store_true")
        s.add_argument("--keep", action="store_true", help="keep the logs' folder")
        s.add_argument("--tag", help="the namespaces' prefix (at most 7 characters; default "
                       "sw and the process id): TAG-hub, TAG-r1, ...")
    a = sub.add_parser("agent")
    a.add_argument("--relay")
    a.add_argument("--delay-ms", type=float, default=0)
    a.add_argument("--rate", type=float, required=True)
    a.add_argument("--out", required=True)
    args = p.parse_args()
    if args.scenario == "agent":
        asyncio.run(agent_main(args))
        return 0
    args.partition_s = getattr(args, "partition_s", 0)
    return main_run(args)


if __name__ == "__main__":
    sys.exit(main())
