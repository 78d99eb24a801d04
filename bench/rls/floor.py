#!/usr/bin/env python3
"""The floor under a decision served over a socket, one call at a time (docs/benchmarks.md).

    python3 bench/rls/floor.py [ROUNDS] [RATE] [SECONDS]      (defaults 5, 6000, 2)

A server that does nothing but read each request and write a reply back, with no HTTP/2, no
gRPC and no decision, against a client that sends one request at a time on a clock, as
bench/rls/run.sh's open loop does (four connections, taken in turn, each call due at
start + i / RATE). The server's CPU per message (utime + stime of its own process, from
getrusage) is what any server pays per call when its calls do not overlap: a wakeup, a read
and a write. Two servers, each over loopback TCP (Nagle off) and a Unix socket:

  blocking  one thread per connection in recv/send: the fewest system calls a call can cost
  epoll     one thread, non-blocking sockets and epoll_wait, as tokio serves them

Rounds interleave the four; the table gives the median (lowest-highest) over the rounds. The
client spins until each call is due, so its vCPU stays awake and its own CPU is not counted.
Standard library only; Linux.
"""

import ast
import os
import resource
import select
import socket
import statistics
import sys
import tempfile
import threading
import time

REQUEST = b"q" * 120  # about an RLS call's HEADERS and DATA frames
REPLY = b"a" * 80  # about its answer's HEADERS, DATA and trailers
CONNECTIONS = 4


def listener(family, where):
    if family == "tcp":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        address = sock.getsockname()
    else:
        address = os.path.join(where, "floor.sock")
        if os.path.exists(address):
            os.unlink(address)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(address)
    sock.listen(CONNECTIONS)
    return sock, address


def accept_all(sock, family):
    conns = []
    for _ in range(CONNECTIONS):
        conn, _ = sock.accept()
        if family == "tcp":
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append(conn)
    return conns


def serve_blocking(conns, count):
    def one(conn, n):
        for _ in range(n):
            if not conn.recv(4096):
                return
            conn.sendall(REPLY)

    threads = [
        threading.Thread(target=one, args=(c, count // CONNECTIONS)) for c in conns
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def serve_epoll(conns, count):
    poll = select.epoll()
    by_fd = {}
    for conn in conns:
        conn.setblocking(False)
        poll.register(conn.fileno(), select.EPOLLIN | select.EPOLLET)
        by_fd[conn.fileno()] = conn
    served = 0
    while served < count:
        for fd, _ in poll.poll():
            conn = by_fd[fd]
            while True:
                try:
                    data = conn.recv(4096)
                except BlockingIOError:
                    break
                if not data:
                    return
                conn.send(REPLY)
                served += 1
                if len(data) < 4096:
                    break  # drained; as tokio, no second read for the EAGAIN
    poll.close()


def server(family, kind, count, where, ready_w, result_w):
    sock, address = listener(family, where)
    os.write(ready_w, repr(address).encode() + b"\n")
    conns = accept_all(sock, family)
    before = resource.getrusage(resource.RUSAGE_SELF)
    (serve_blocking if kind == "blocking" else serve_epoll)(conns, count)
    after = resource.getrusage(resource.RUSAGE_SELF)
    system = (after.ru_stime - before.ru_stime) / count * 1e6
    user = (after.ru_utime - before.ru_utime) / count * 1e6
    os.write(result_w, f"{system} {user}\n".encode())


def run(family, kind, rate, seconds, where):
    count = int(rate * seconds) // CONNECTIONS * CONNECTIONS
    ready_r, ready_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            server(family, kind, count, where, ready_w, result_w)
        finally:
            os._exit(0)
    address = ast.literal_eval(os.read(ready_r, 4096).decode())
    clients = []
    for _ in range(CONNECTIONS):
        conn = socket.socket(socket.AF_INET if family == "tcp" else socket.AF_UNIX)
        conn.connect(address)
        if family == "tcp":
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        clients.append(conn)
    start = time.perf_counter()
    deadline = start + seconds * 3 + 5  # bounded even if the server falls behind
    for i in range(count):
        due = start + i / rate
        while time.perf_counter() < due:
            pass
        conn = clients[i % CONNECTIONS]
        conn.sendall(REQUEST)
        conn.recv(4096)
        if time.perf_counter() > deadline:
            break
    for conn in clients:
        conn.close()
    os.waitpid(pid, 0)
    system, user = map(float, os.read(result_r, 4096).split())
    for fd in (ready_r, ready_w, result_r, result_w):
        os.close(fd)
    return system, user


def spread(values):
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else 6000.0
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
    cases = [(f, k) for k in ("blocking", "epoll") for f in ("tcp", "unix")]
    seen = {case: [] for case in cases}
    with tempfile.TemporaryDirectory() as where:
        for r in range(rounds):
            for case in cases:
                system, user = run(*case, rate, seconds, where)
                seen[case].append((system, user))
                print(
                    f"round {r + 1} {case[1]} {case[0]}: {system:.1f} us system, {user:.1f} us user",
                    file=sys.stderr,
                )
    print(
        f"Server CPU per message, {rate:,.0f} messages/s over {CONNECTIONS} connections, "
        f"{rounds} round{'s' if rounds != 1 else ''} of {seconds:g} s; median (lowest-highest), "
        "microseconds:\n"
    )
    print("| server | socket | system | user | total |")
    print("| --- | --- | ---: | ---: | ---: |")
    for case in cases:
        system = [s for s, _ in seen[case]]
        user = [u for _, u in seen[case]]
        total = [s + u for s, u in seen[case]]
        print(
            f"| {case[1]} | {'loopback TCP' if case[0] == 'tcp' else 'Unix socket'} "
            f"| {spread(system)} | {spread(user)} | {spread(total)} |"
        )


if __name__ == "__main__":
    main()
