#!/usr/bin/env python3
"""An outside client of Envoy's Rate Limit Service v3, built with grpcio from Envoy's own .proto
files (vendored in crates/rls/tests/proto, never Spillway's code).

It compiles the protos with grpc_tools.protoc into a temporary folder, reads one JSON request per
line on stdin, calls `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` for each on
one channel, in order, and prints one JSON line per answer:

    {"code": "OK", "statuses": [{"code": "OK", "limit": {"name": "foo", "requests_per_unit": 2,
     "unit": "MINUTE"}, "remaining": 1, "reset": 59.2}], "headers": [["RateLimit-Limit", "2"]]}

or, for a call the server refused, {"error": "INVALID_ARGUMENT", "details": "..."}. A request:

    {"domain": "rl", "descriptors": [{"entries": [["foo", "a"]], "hits_addend": 3}],
     "hits_addend": 0}

(`hits_addend` optional on both).

    envoy_client.py --proto-dir crates/rls/tests/proto --target 127.0.0.1:8089 < requests.jsonl

Used by crates/cli/tests/all/rls_python.rs; grpcio and grpcio-tools come from PyPI (scripts/test
installs them in the virtual environment of SPILLWAY_PYTHON).
"""

import argparse
import atexit
import importlib
import json
import os
import shutil
import sys
import tempfile

# The roots of the vendored protos, each the root of its upstream repository's proto tree.
ROOTS = ("data-plane-api", "xds", "protoc-gen-validate")


def compile_protos(proto_dir):
    """Every vendored .proto compiled to Python (the RLS messages import most of them), and the RLS
    modules imported from the result."""
    import grpc_tools
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="spillway-envoy-client-")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    includes = [os.path.join(proto_dir, root) for root in ROOTS]
    # google/protobuf/*.proto ship with grpcio-tools.
    includes.append(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))
    protos = []
    for root in includes[: len(ROOTS)]:
        for folder, _, files in os.walk(root):
            protos += [
                os.path.relpath(os.path.join(folder, f), root) for f in files if f.endswith(".proto")
            ]
    rc = protoc.main(
        ["protoc"]
        + [f"-I{include}" for include in includes]
        + [f"--python_out={out}", f"--grpc_python_out={out}"]
        + sorted(protos)
    )
    if rc != 0:
        raise SystemExit(f"protoc failed: exit {rc}")
    sys.path.insert(0, out)
    pb = importlib.import_module("envoy.service.ratelimit.v3.rls_pb2")
    rpc = importlib.import_module("envoy.service.ratelimit.v3.rls_pb2_grpc")
    return pb, rpc


def request_of(pb, spec):
    request = pb.RateLimitRequest(domain=spec.get("domain", ""), hits_addend=spec.get("hits_addend", 0))
    for d in spec.get("descriptors", []):
        descriptor = request.descriptors.add()
        for key, value in d.get("entries", []):
            descriptor.entries.add(key=key, value=value)
        if "hits_addend" in d:
            descriptor.hits_addend.value = d["hits_addend"]
    return request


def answer_of(pb, response):
    code = pb.RateLimitResponse.Code.Name
    unit = pb.RateLimitResponse.RateLimit.Unit.Name
    statuses = []
    for s in response.statuses:
        limit = None
        if s.HasField("current_limit"):
            limit = {
                "name": s.current_limit.name,
                "requests_per_unit": s.current_limit.requests_per_unit,
                "unit": unit(s.current_limit.unit),
            }
        reset = None
        if s.HasField("duration_until_reset"):
            reset = s.duration_until_reset.seconds + s.duration_until_reset.nanos / 1e9
        statuses.append(
            {"code": code(s.code), "limit": limit, "remaining": s.limit_remaining, "reset": reset}
        )
    return {
        "code": code(response.overall_code),
        "statuses": statuses,
        "headers": [[h.key, h.value] for h in response.response_headers_to_add],
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proto-dir", required=True)
    parser.add_argument("--target", required=True)
    args = parser.parse_args()

    import grpc

    pb, rpc = compile_protos(args.proto_dir)
    channel = grpc.insecure_channel(args.target)
    grpc.channel_ready_future(channel).result(timeout=10)
    stub = rpc.RateLimitServiceStub(channel)
    for line in sys.stdin:
        if not line.strip():
            continue
        spec = json.loads(line)
        try:
            answer = answer_of(pb, stub.ShouldRateLimit(request_of(pb, spec), timeout=5))
        except grpc.RpcError as err:
            answer = {"error": err.code().name, "details": err.details()}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
