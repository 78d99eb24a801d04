#!/usr/bin/env python3
"""An outside attacker of Spillway's control plane, built from the project's own proto with grpcio.

It dials an aggregator or a controller the way a real peer would, with or without a client
certificate, and sends what a liar would send: a report of `offered = 1e9` for a bucket (the
fleet-wide outage button of an unauthenticated control plane), zone sums, or a peer's region sums.
It prints one JSON line: what happened (`code`: OK when the server kept the stream open and
answered or stayed silent, else the gRPC status code name; `detail`: its message).

    attacker.py --proto-dir crates/proto/proto --target 127.0.0.1:7001 --rpc report \
        [--cert cert.pem --key key.pem --ca ca.pem] [--host-id h1 --region r --zone z] \
        [--service api --bucket all] [--seconds 2]

Used by crates/cli/tests/all/tls.rs; grpcio and grpcio-tools come from PyPI (scripts/test installs
them when missing).
"""

import argparse
import atexit
import importlib
import json
import os
import shutil
import sys
import tempfile
import time


def compile_proto(proto_dir):
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="spillway-attacker-")
    # The generated stubs are imported from here for the whole run, then removed.
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    proto = os.path.join("spillway", "v1", "control.proto")
    rc = protoc.main(
        [
            "protoc",
            f"-I{proto_dir}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            os.path.join(proto_dir, proto),
        ]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed on {proto}: exit {rc}")
    sys.path.insert(0, out)
    pb = importlib.import_module("spillway.v1.control_pb2")
    rpc = importlib.import_module("spillway.v1.control_pb2_grpc")
    return pb, rpc


def channel(args):
    import grpc

    if not args.cert and not args.ca:
        return grpc.insecure_channel(args.target)
    read = lambda path: open(path, "rb").read() if path else None
    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(args.ca),
        private_key=read(args.key),
        certificate_chain=read(args.cert),
    )
    return grpc.secure_channel(args.target, credentials)


def messages(pb, args):
    """The liar's messages, one per 250 ms interval for `--seconds`."""
    interval_ms = 250
    counts = pb.BucketCounts(
        service=args.service,
        bucket=args.bucket,
        offered=1_000_000_000,
        allowed=1_000_000_000,
        offered_tail=250_000_000,
    )
    end = time.time() + args.seconds
    while time.time() < end:
        # Just after each interval's end, as an honest host reports it.
        now_ms = int(time.time() * 1000)
        next_ms = (now_ms // interval_ms + 1) * interval_ms
        time.sleep((next_ms - now_ms + 5) / 1000)
        sequence = next_ms // interval_ms - 1
        if args.rpc == "report":
            yield pb.Report(
                host_id=args.host_id,
                zone=args.zone,
                region=args.region,
                sequence=sequence,
                interval_ms=interval_ms,
                buckets=[counts],
            )
        elif args.rpc == "link_zone":
            hosts = pb.BucketCounts()
            hosts.CopyFrom(counts)
            hosts.hosts = 1
            yield pb.ZoneReport(
                zone=args.zone,
                region=args.region,
                sequence=sequence,
                interval_ms=interval_ms,
                buckets=[hosts],
                clients=1,
            )
        else:
            yield pb.RegionSums(
                region=args.region,
                sequence=sequence,
                interval_ms=interval_ms,
                buckets=[counts],
            )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proto-dir", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--rpc", choices=["report", "link_zone", "exchange"], required=True)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--ca")
    parser.add_argument("--host-id", default="attacker")
    parser.add_argument("--region", default="")
    parser.add_argument("--zone", default="")
    parser.add_argument("--service", default="api")
    parser.add_argument("--bucket", default="all")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()

    import grpc

    pb, rpc = compile_proto(args.proto_dir)
    chan = channel(args)
    if args.rpc == "report":
        call = rpc.AggregatorStub(chan).Link
    elif args.rpc == "link_zone":
        call = rpc.ControllerStub(chan).LinkZone
    else:
        call = rpc.ControllerStub(chan).Exchange
    result = {"code": "OK", "detail": "", "answers": 0}
    try:
        for _ in call(messages(pb, args), timeout=args.seconds + 3):
            result["answers"] += 1
    except grpc.RpcError as err:
        code = err.code()
        # The deadline is ours: the stream stayed open as long as the liar talked.
        if code != grpc.StatusCode.DEADLINE_EXCEEDED:
            result["code"] = code.name
            result["detail"] = err.details() or ""
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
