#!/usr/bin/env python3
"""Many RLQS streams from one client, built with grpcio from Envoy's own .proto files (the stubs
come from rlqs_envoy.py's compile_protos): what one client opening a crowd of streams can do to
an aggregator. Prints JSON lines; three modes:

    sybil:   --liars N streams on ONE channel (one HTTP/2 connection) each report --liar-rps
             allowed requests a second for --route, beside one honest instance on its own
             connection that offers --rps and admits what it is told:
             {"event": "honest", "t": 3.0, "told": "rate", "rate": 30.0}
    streams: --streams N streams on one channel, each sending one report; which were refused:
             {"event": "stream", "n": 3, "code": "RESOURCE_EXHAUSTED", "detail": "..."}
             {"event": "streams", "open": 16, "refused": 4}
    memory:  --streams N streams over --channels C connections, each reporting --buckets bucket
             ids with --value-bytes long values, held for --seconds, then closed:
             {"event": "reported", "t": 4.1, "refused": 0}   (all reports sent and answered)
             {"event": "closed", "t": 9.0}                    (every stream ended)

Used by crates/cli/tests/all/rlqs_crowd.rs.
"""

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rlqs_envoy import compile_protos, emit, now, told_of  # noqa: E402


def channel(target):
    import grpc

    # Its own subchannel pool: grpcio would otherwise share one connection between channels to
    # the same target, and a channel here means a connection.
    return grpc.insecure_channel(
        target,
        options=[
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_send_message_length", 64 << 20),
        ],
    )


class Stream:
    """One StreamRateLimitQuotas call: reports go in through `send`, actions come out in `on`."""

    def __init__(self, stub, on=None):
        import queue

        self.outbox = queue.Queue()
        self.ended = threading.Event()
        self.error = None
        self.answers = 0
        self.on = on
        self.call = stub.StreamRateLimitQuotas(self._requests())
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _requests(self):
        import queue

        while not self.ended.is_set():
            try:
                item = self.outbox.get(timeout=0.05)
            except queue.Empty:
                continue
            if item is None:
                return
            yield item

    def _read(self):
        import grpc

        try:
            for response in self.call:
                self.answers += 1
                if self.on:
                    self.on(response)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                self.error = (err.code().name, err.details())
        finally:
            self.ended.set()

    def send(self, report):
        self.outbox.put(report)

    def close(self):
        self.outbox.put(None)
        self.call.cancel()
        self.thread.join(timeout=5)


def usage(pb, domain, ids, allowed, denied, seconds):
    usages = []
    for bucket in ids:
        u = pb.RateLimitQuotaUsageReports.BucketQuotaUsage(
            num_requests_allowed=allowed, num_requests_denied=denied
        )
        for key, value in bucket.items():
            u.bucket_id.bucket[key] = value
        u.time_elapsed.FromMilliseconds(round(seconds * 1000))
        usages.append(u)
    return pb.RateLimitQuotaUsageReports(domain=domain, bucket_quota_usages=usages)


def sybil(args, pb, rpc):
    shared = channel(args.target)
    liars_stub = rpc.RateLimitQuotaServiceStub(shared)
    ids = [{"route": args.route}]
    lie = round(args.liar_rps * args.interval)
    liars = [Stream(liars_stub) for _ in range(args.liars)]
    told = {"kind": "allow", "rate": None}

    def on_honest(response):
        for action in response.bucket_action:
            kind, rate, _ = told_of(action)
            told["kind"], told["rate"] = kind, rate
            emit({"event": "honest", "t": now(), "told": kind, "rate": rate})

    honest = Stream(rpc.RateLimitQuotaServiceStub(channel(args.target)), on_honest)
    end = time.monotonic() + args.seconds
    next_report = time.monotonic()
    while time.monotonic() < end:
        offered = round(args.rps * args.interval)
        if told["kind"] == "deny":
            allowed = 0
        elif told["kind"] == "rate":
            allowed = min(offered, round(told["rate"] * args.interval))
        else:
            allowed = offered
        honest.send(usage(pb, args.domain, ids, allowed, offered - allowed, args.interval))
        for liar in liars:
            liar.send(usage(pb, args.domain, ids, lie, 0, args.interval))
        next_report += args.interval
        time.sleep(max(0.0, next_report - time.monotonic()))
    errors = [s.error for s in liars if s.error]
    emit({"event": "liars", "open": sum(1 for s in liars if not s.ended.is_set()),
          "errors": errors[:3], "refused": len(errors)})
    for s in liars + [honest]:
        s.close()


def streams(args, pb, rpc):
    stub = rpc.RateLimitQuotaServiceStub(channel(args.target))
    ids = [{"route": args.route}]
    opened = []
    for n in range(args.streams):
        s = Stream(stub)
        s.send(usage(pb, args.domain, ids, 1, 0, args.interval))
        opened.append(s)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
    refused = 0
    for n, s in enumerate(opened):
        if s.error:
            refused += 1
            emit({"event": "stream", "n": n, "code": s.error[0], "detail": s.error[1]})
    emit({"event": "streams", "open": sum(1 for s in opened if not s.ended.is_set()),
          "refused": refused})
    for s in opened:
        s.close()


def memory(args, pb, rpc):
    stubs = [rpc.RateLimitQuotaServiceStub(channel(args.target)) for _ in range(args.channels)]
    opened = []
    pad = "v" * args.value_bytes
    for n in range(args.streams):
        s = Stream(stubs[n % len(stubs)])
        ids = [{"user": f"{n}-{i}-{pad}"[: args.value_bytes]} for i in range(args.buckets)]
        s.send(usage(pb, args.domain, ids, 1, 0, 1.0))
        opened.append(s)
    # Answered (or refused): every stream's report was taken in.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(s.answers or s.ended.is_set() for s in opened):
        time.sleep(0.1)
    errors = [s.error for s in opened if s.error]
    emit({"event": "reported", "t": now(), "refused": len(errors), "errors": errors[:3],
          "answered": sum(1 for s in opened if s.answers)})
    time.sleep(args.seconds)
    for s in opened:
        s.close()
    emit({"event": "closed", "t": now()})
    # Hold the connections until told to go (stdin closes).
    sys.stdin.read()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["sybil", "streams", "memory"])
    parser.add_argument("--proto-dir", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--domain", default="edge")
    parser.add_argument("--route", default="checkout")
    parser.add_argument("--rps", type=float, default=100.0)
    parser.add_argument("--liars", type=int, default=40)
    parser.add_argument("--liar-rps", type=float, default=1e9)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--buckets", type=int, default=10_000)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    pb, rpc = compile_protos(args.proto_dir)
    {"sybil": sybil, "streams": streams, "memory": memory}[args.mode](args, pb, rpc)


if __name__ == "__main__":
    main()
