"""A real WebSocket peer for the proxy's upgrade tests (crates/proxy/tests/all/websocket.rs).

server: an echo server on 127.0.0.1, its port printed on the first line, one line per
        connection it accepted ("connected") after that.
client URL: connects through the proxy, sends --messages messages (text and binary, up to
        256 KiB), pausing --pause seconds between them, and checks each echo; prints
        "echoed N", or "refused STATUS" when the handshake is answered with another status.
Every wait is bounded (--timeout).
"""

import argparse
import asyncio
import sys

from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from websockets.exceptions import InvalidStatus


async def run_server():
    async def echo(ws):
        print("connected", flush=True)
        async for message in ws:
            await ws.send(message)

    async with serve(echo, "127.0.0.1", 0, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        print(port, flush=True)
        await asyncio.Future()


def message(i):
    if i % 2 == 0:
        return f"text message {i} " + "é" * (i % 7)
    return bytes((i + k) % 256 for k in range(min(256 * 1024, 1 << (i % 19))))


async def run_client(url, messages, pause):
    try:
        async with connect(url, max_size=None, open_timeout=5) as ws:
            for i in range(messages):
                sent = message(i)
                await ws.send(sent)
                got = await ws.recv()
                if got != sent:
                    print(f"message {i} came back changed", flush=True)
                    return 1
                if pause:
                    await asyncio.sleep(pause)
            await ws.close()
    except InvalidStatus as refused:
        print(f"refused {refused.response.status_code}", flush=True)
        return 0
    print(f"echoed {messages}", flush=True)
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["server", "client"])
    parser.add_argument("url", nargs="?")
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    if args.mode == "server":
        asyncio.run(asyncio.wait_for(run_server(), args.timeout))
        return 0
    return asyncio.run(asyncio.wait_for(run_client(args.url, args.messages, args.pause), args.timeout))


if __name__ == "__main__":
    sys.exit(main())
