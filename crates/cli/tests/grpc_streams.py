"""A raw HTTP/2 client against a gRPC listener, for crates/cli/tests/all/grpc_bounds.rs.

It writes frames itself (hyperframe and hpack, from the `h2` package) so that it can do what a
well-behaved client library refuses to: open streams beyond the server's advertised
SETTINGS_MAX_CONCURRENT_STREAMS, and send HEADERS that are never followed by DATA.

    python grpc_streams.py HOST PORT streams N SECONDS [PATH]
        Opens N streams of PATH (default: RLS's ShouldRateLimit) with HEADERS and no DATA on one connection, then
        reads for SECONDS (answering PINGs). Prints one JSON line: the advertised
        max_concurrent_streams (null when none), how many streams were refused (RST_STREAM
        REFUSED_STREAM), otherwise reset, and answered with a grpc-status (and which), whether a
        GOAWAY came and whether the connection was still open.
    python grpc_streams.py HOST PORT idle SECONDS
        Opens a connection, exchanges SETTINGS, opens no stream and reads for SECONDS. Prints
        whether a GOAWAY came and whether the connection closed, and after how long.
"""

import json
import socket
import sys
import time

import hpack
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
REFUSED_STREAM = 0x7
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


class Conn:
    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.closed = False
        self.closed_while_sending = False
        self.decoder = hpack.Decoder()
        self.sock.sendall(PREFACE + SettingsFrame(0).serialize())

    def send(self, data):
        """Sends `data`; False when the server has closed the connection."""
        if self.closed:
            return False
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.closed_while_sending = True
            return False

    def frames(self, until):
        """Frames as they come, until the deadline `until` (time.monotonic) or the close."""
        while not self.closed:
            while len(self.buf) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(self.buf[:9]))
                if len(self.buf) < 9 + length:
                    break
                frame.parse_body(memoryview(self.buf[9 : 9 + length]))
                self.buf = self.buf[9 + length :]
                yield frame
            left = until - time.monotonic()
            if left <= 0:
                return
            self.sock.settimeout(min(left, 0.5))
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return
            self.buf += chunk

    def answer(self, frame):
        """What any client must do: acknowledge SETTINGS and PINGs."""
        if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
            self.send(SettingsFrame(0, flags=["ACK"]).serialize())
        elif isinstance(frame, PingFrame) and "ACK" not in frame.flags:
            self.send(PingFrame(0, opaque_data=frame.opaque_data, flags=["ACK"]).serialize())


def streams(host, port, n, seconds, path=METHOD):
    conn = Conn(host, port)
    advertised = None
    # The server's SETTINGS come first; read them before opening streams.
    for frame in conn.frames(time.monotonic() + 5):
        conn.answer(frame)
        if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
            advertised = frame.settings.get(SettingsFrame.MAX_CONCURRENT_STREAMS)
            break
    encoder = hpack.Encoder()
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", f"{host}:{port}"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    out = bytearray()
    sent = 0
    for i in range(n):
        frame = HeadersFrame(1 + 2 * i, flags=["END_HEADERS"])
        frame.data = encoder.encode(headers)
        out += frame.serialize()
        if len(out) > 1 << 16 or i == n - 1:
            if not conn.send(bytes(out)):
                break
            sent = i + 1
            out.clear()
    # What the server sent before any close stays readable.
    conn.closed = False
    refused = reset = answered = 0
    statuses = {}
    goaway = False
    for frame in conn.frames(time.monotonic() + seconds):
        conn.answer(frame)
        if isinstance(frame, RstStreamFrame):
            if frame.error_code == REFUSED_STREAM:
                refused += 1
            else:
                reset += 1
        elif isinstance(frame, HeadersFrame):
            fields = dict(conn.decoder.decode(frame.data))
            if "grpc-status" in fields:
                answered += 1
                statuses[fields["grpc-status"]] = statuses.get(fields["grpc-status"], 0) + 1
        elif isinstance(frame, GoAwayFrame):
            goaway = True
        elif isinstance(frame, DataFrame) and frame.data:
            conn.send(WindowUpdateFrame(0, window_increment=len(frame.data)).serialize())
    print(
        json.dumps(
            {
                "max_concurrent_streams": advertised,
                "sent": sent,
                "closed_while_sending": conn.closed_while_sending,
                "refused": refused,
                "reset": reset,
                "answered": answered,
                "statuses": statuses,
                "goaway": goaway,
                "open": not conn.closed,
            }
        ),
        flush=True,
    )


def idle(host, port, seconds):
    conn = Conn(host, port)
    start = time.monotonic()
    goaway_after = None
    for frame in conn.frames(start + seconds):
        conn.answer(frame)
        if isinstance(frame, GoAwayFrame) and goaway_after is None:
            goaway_after = time.monotonic() - start
    closed_after = time.monotonic() - start if conn.closed else None
    print(json.dumps({"goaway_after": goaway_after, "closed_after": closed_after}), flush=True)


def main():
    host, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "streams":
        streams(host, port, int(sys.argv[4]), float(sys.argv[5]), *sys.argv[6:7])
    elif mode == "idle":
        idle(host, port, float(sys.argv[4]))
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
