#!/usr/bin/env python3
"""Envoy instances on Spillway's RLQS listener, built with grpcio from Envoy's own .proto files.

Each instance opens one `StreamRateLimitQuotas` stream on its own connection, as Envoy's
rate_limit_quota filter does, offers `--rps` requests a second to every bucket id of `--route`, admits what the
assignment it holds admits (everything before one arrives, as Envoy's no_assignment_behavior
ALLOW_ALL would), and reports its usage every `--interval` seconds. It prints JSON lines:

    {"event": "action", "t": 1.2, "instance": 0, "route": "checkout", "told": "rate", "rate": 50.0, "ttl": 2}
    {"event": "round", "t": 1.5, "rates": {"checkout": 150.0}, "told": {"checkout": ["rate", ...]}}
    {"event": "error", "t": ..., "instance": 0, "code": "INVALID_ARGUMENT", "detail": "..."}

    rlqs_envoy.py --proto-dir crates/rls/tests/proto --target 127.0.0.1:7005 --domain edge \
        --route checkout --route search --instances 3 --rps 100 --interval 0.5 --seconds 10 \
        [--reconnect-at 6] [--bad empty-domain]

Used by crates/cli/tests/all/rlqs.rs; grpcio and grpcio-tools come from PyPI (scripts/test installs
them when missing). The stubs are generated at run time, never from Spillway's code.
"""

import argparse
import atexit
import importlib
import json
import os
import queue
import shutil
import sys
import tempfile
import threading
import time


def compile_protos(proto_dir):
    from grpc_tools import protoc
    import grpc_tools

    out = tempfile.mkdtemp(prefix="spillway-rlqs-")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    # One include root per vendored project (data-plane-api, xds, protoc-gen-validate).
    roots = sorted(
        os.path.join(proto_dir, d)
        for d in os.listdir(proto_dir)
        if os.path.isdir(os.path.join(proto_dir, d))
    )
    sources = []
    for root_dir in roots:
        for root, _, files in os.walk(root_dir):
            for name in files:
                if name.endswith(".proto"):
                    sources.append(os.path.relpath(os.path.join(root, name), root_dir))
    rc = protoc.main(
        [
            "protoc",
            *[f"-I{r}" for r in roots],
            f"-I{well_known}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *sources,
        ]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed on the protos of {proto_dir}: exit {rc}")
    # Every generated package needs to be importable: protoc writes no __init__.py.
    sys.path.insert(0, out)
    pb = importlib.import_module("envoy.service.rate_limit_quota.v3.rlqs_pb2")
    rpc = importlib.import_module("envoy.service.rate_limit_quota.v3.rlqs_pb2_grpc")
    return pb, rpc


START = time.monotonic()


def now():
    return round(time.monotonic() - START, 3)


lock = threading.Lock()


def emit(line):
    with lock:
        print(json.dumps(line), flush=True)


def told_of(action):
    """(kind, rate, ttl) of one BucketAction."""
    if action.HasField("abandon_action"):
        return ("abandon", None, None)
    assignment = action.quota_assignment_action
    ttl = assignment.assignment_time_to_live
    strategy = assignment.rate_limit_strategy
    which = strategy.WhichOneof("strategy")
    if which == "blanket_rule":
        kind = "allow" if strategy.blanket_rule == 0 else "deny"
        return (kind, None, ttl.seconds + ttl.nanos / 1e9)
    if which == "token_bucket":
        tb = strategy.token_bucket
        fill = tb.fill_interval.seconds + tb.fill_interval.nanos / 1e9
        per_fill = tb.tokens_per_fill.value if tb.HasField("tokens_per_fill") else 1
        return ("rate", per_fill / fill, ttl.seconds + ttl.nanos / 1e9)
    return (which or "none", None, None)


class Instance:
    def __init__(self, n, args, pb, rpc):
        self.n, self.args, self.pb, self.rpc = n, args, pb, rpc
        self.told = {}
        self.stop = threading.Event()

    def usage(self):
        pb, args = self.pb, self.args
        offered = round(args.rps * args.interval)
        usages = []
        for route in args.route:
            kind, rate, _ = self.told.get(route, ("allow", None, None))
            if kind == "deny":
                allowed = 0
            elif kind == "rate":
                allowed = min(offered, round(rate * args.interval))
            else:
                allowed = offered
            usage = pb.RateLimitQuotaUsageReports.BucketQuotaUsage(
                num_requests_allowed=allowed, num_requests_denied=offered - allowed
            )
            usage.bucket_id.bucket["route"] = route
            usage.time_elapsed.FromMilliseconds(round(args.interval * 1000))
            usages.append(usage)
        report = pb.RateLimitQuotaUsageReports(domain=args.domain, bucket_quota_usages=usages)
        return bad(report, args.bad) if args.bad else report

    def run_stream(self, until):
        import grpc

        outbox = queue.Queue()
        outbox.put(self.usage())
        ended = threading.Event()

        def requests():
            while not ended.is_set():
                try:
                    item = outbox.get(timeout=0.05)
                except queue.Empty:
                    continue
                if item is None:
                    return
                yield item

        # Each instance its own connection, as separate Envoys have: grpcio would otherwise
        # share one between channels to the same target, and the aggregator counts a connection
        # (without TLS) as one host, whatever streams it carries.
        channel = grpc.insecure_channel(
            self.args.target, options=[("grpc.use_local_subchannel_pool", 1)]
        )
        stub = self.rpc.RateLimitQuotaServiceStub(channel)
        responses = stub.StreamRateLimitQuotas(requests())

        def reader():
            try:
                for response in responses:
                    for action in response.bucket_action:
                        route = action.bucket_id.bucket.get("route", "")
                        kind, rate, ttl = told_of(action)
                        self.told[route] = (kind, rate, ttl)
                        emit({"event": "action", "t": now(), "instance": self.n,
                              "route": route, "told": kind, "rate": rate, "ttl": ttl})
            except grpc.RpcError as err:
                if not ended.is_set():
                    emit({"event": "error", "t": now(), "instance": self.n,
                          "code": err.code().name, "detail": err.details()})
            finally:
                ended.set()

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        next_report = time.monotonic() + self.args.interval
        while time.monotonic() < until and not ended.is_set() and not self.stop.is_set():
            time.sleep(max(0.0, min(0.05, next_report - time.monotonic())))
            if time.monotonic() >= next_report:
                outbox.put(self.usage())
                next_report += self.args.interval
        ended.set()
        outbox.put(None)
        responses.cancel()
        channel.close()
        thread.join(timeout=2)


def bad(report, kind):
    """A usage report broken as `kind` says."""
    if kind == "empty-domain":
        report.domain = ""
    elif kind == "no-usage":
        del report.bucket_quota_usages[:]
    elif kind == "no-bucket-id":
        report.bucket_quota_usages[0].ClearField("bucket_id")
    elif kind == "no-time-elapsed":
        report.bucket_quota_usages[0].ClearField("time_elapsed")
    return report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proto-dir", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--domain", default="edge")
    parser.add_argument("--route", action="append", required=True)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--rps", type=float, default=100.0)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--reconnect-at", type=float)
    parser.add_argument("--bad")
    args = parser.parse_args()
    pb, rpc = compile_protos(args.proto_dir)
    end = time.monotonic() + args.seconds
    instances = [Instance(n, args, pb, rpc) for n in range(args.instances)]

    def run(instance):
        if args.reconnect_at is not None and instance.n == 0:
            instance.run_stream(START + args.reconnect_at)
            emit({"event": "reconnect", "t": now(), "instance": 0})
            instance.told = {}
        instance.run_stream(end)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in instances]
    for thread in threads:
        thread.start()
    while time.monotonic() < end and any(t.is_alive() for t in threads):
        time.sleep(args.interval)
        rates, told = {}, {}
        for route in args.route:
            kinds = [i.told.get(route, ("none", None, None)) for i in instances]
            told[route] = [k for k, _, _ in kinds]
            if all(k == "rate" for k, _, _ in kinds):
                rates[route] = sum(r for _, r, _ in kinds)
        emit({"event": "round", "t": now(), "rates": rates, "told": told})
    for thread in threads:
        thread.join(timeout=3)


if __name__ == "__main__":
    main()
