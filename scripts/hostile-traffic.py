#!/usr/bin/env python3
"""tmx serve under hostile traffic on loopback (standard library only).

Starts the server on a free port (or uses --url) and runs, in order:
  1. alone: a normal streaming completion (the median of three: its time to first token and its
     whole time) and a run of --clients concurrent streaming clients (tokens/s);
  2. stalled: --stalled connections that each send a partial request line and stall (one the
     server closes is opened again at once, so that as many stay open); the same completion and
     client run beside them; the server's resident memory and threads before and with them;
     with --rounds N, N client runs without and with them, alternating, and each ratio;
  3. slow drip: a request whose head is whole but whose body comes one byte every half second:
     when the server closes it (or --drip-seconds pass);
  4. flood: --flood connections opened as fast as they go (about a second for 2,000 here), each
     asking GET /health: how many were answered, refused (closed, reset or 503) or hung
     (neither within --hang-seconds);
  5. after it all: the server still answers a completion and exits 0 on SIGTERM.
It prints what it measured. With --check it exits 1 when a completion fails or takes longer
than --answer-timeout, a flood connection hangs, the drip outlives --drip-seconds or the server
dies or exits non-zero: the CI's bounded run. Times and throughput are reported, not asserted.

  scripts/hostile-traffic.py --model assets/demo --stalled 500 --flood 2000 --clients 16
"""
import argparse
import errno
import os
import selectors
import signal
import socket
import statistics
import sys
import threading
import time
from urllib.parse import urlparse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from serve_client import (ClientRun, add_server_arguments, one_request, rss_kb,  # noqa: E402
                          start_server, thread_count)

PARTIAL_HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Len"


class StalledConnections:
    """`count` connections, each holding a partial request line and saying nothing more; a
    connection the server closes is replaced at once (counted in `closed_by_server`)."""

    def __init__(self, host, port, count):
        self.host, self.port, self.count = host, port, count
        self.closed_by_server = 0
        self.open_failures = 0
        self.sel = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.opened = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()
        self.opened.wait()
        return self

    def _open_one(self):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect((self.host, self.port))
            s.sendall(PARTIAL_HEAD)
        except OSError:
            self.open_failures += 1
            s.close()
            return
        s.setblocking(False)
        self.sel.register(s, selectors.EVENT_READ)

    def open_count(self):
        return len(self.sel.get_map())

    def _run(self):
        for _ in range(self.count):
            self._open_one()
        self.opened.set()
        while not self.stop.is_set():
            for key, _ in self.sel.select(timeout=0.2):
                s = key.fileobj
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if data:
                    continue  # an answer (e.g. 408): its close comes next
                self.sel.unregister(s)
                s.close()
                self.closed_by_server += 1
                if not self.stop.is_set():
                    self._open_one()
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()

    def close(self):
        self.stop.set()
        self.thread.join()


def slow_drip(host, port, limit_s):
    """A request whose body comes a byte every half second: (seconds until the server closed it
    or None if it was still open after limit_s, the status line it answered, if any)."""
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100000\r\n\r\n")
    t0 = time.monotonic()
    answer = b""
    s.settimeout(0.5)
    try:
        while time.monotonic() - t0 < limit_s:
            try:
                data = s.recv(4096)
                if not data:
                    return time.monotonic() - t0, status_line(answer)
                answer += data
                continue
            except socket.timeout:
                pass
            try:
                s.sendall(b" ")
            except OSError:
                return time.monotonic() - t0, status_line(answer)
        return None, status_line(answer)
    except OSError:
        return time.monotonic() - t0, status_line(answer)
    finally:
        s.close()


def status_line(answer):
    return answer.split(b"\r\n", 1)[0].decode("latin-1") if answer else ""


def flood(host, port, count, hang_s):
    """Opens `count` connections at once, each sending GET /health; returns a dict of outcomes
    (answered, refused, hung and the 503s among refused) and the seconds the opening took."""
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    sel = selectors.DefaultSelector()
    outcome = {"answered": 0, "refused": 0, "hung": 0, "503": 0}
    answers = {}
    t0 = time.monotonic()
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        err = s.connect_ex((host, port))
        if err not in (0, errno.EINPROGRESS):
            outcome["refused"] += 1
            s.close()
            continue
        answers[s] = None  # None: not yet sent
        sel.register(s, selectors.EVENT_WRITE)
    opened_s = time.monotonic() - t0
    deadline = time.monotonic() + hang_s

    def settle(s, data):
        sel.unregister(s)
        s.close()
        line = status_line(data)
        if line.startswith("HTTP/1.1 200") or line.startswith("HTTP/1.0 200"):
            outcome["answered"] += 1
        else:
            outcome["refused"] += 1
            if " 503" in line:
                outcome["503"] += 1
        del answers[s]

    while answers and time.monotonic() < deadline:
        for key, events in sel.select(timeout=0.2):
            s = key.fileobj
            if answers[s] is None:  # connected (or failed)
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    settle(s, b"")
                    continue
                try:
                    s.send(request)
                except OSError:
                    settle(s, b"")
                    continue
                answers[s] = b""
                sel.modify(s, selectors.EVENT_READ)
                continue
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if data:
                answers[s] += data
            else:
                settle(s, answers[s])
    outcome["hung"] = len(answers)
    for s in list(answers):
        s.close()
    return outcome, opened_s


def timed_completion(url, seed, max_tokens, timeout):
    """(time to first token, whole time) of one streaming completion, or the error's text."""
    try:
        return one_request(url, "Once upon a time", max_tokens, seed, timeout=timeout)[:2]
    except Exception as e:  # noqa: BLE001 - reported
        return str(e)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_server_arguments(ap)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=None, help="default: 4 per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--stalled", type=int, default=500)
    ap.add_argument("--flood", type=int, default=2000)
    ap.add_argument("--hang-seconds", type=float, default=15,
                    help="a flood connection neither answered nor closed by then has hung")
    ap.add_argument("--drip-seconds", type=float, default=40,
                    help="how long the slow drip may stay open before it counts as never closed")
    ap.add_argument("--answer-timeout", type=float, default=120,
                    help="how long a completion may take before it counts as failed")
    ap.add_argument("--rounds", type=int, default=1,
                    help="client runs without and with the stalled connections, alternating")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 on a failed completion, a hung connection, a drip that is never "
                         "closed or a server that dies")
    args = ap.parse_args()
    requests = args.requests or 4 * args.clients
    failures = []

    server = None
    url = args.url
    if not url:
        try:
            server, url = start_server(
                args.tmx, args.model, args.backend,
                ["--parallel", str(args.clients), "--queue", str(max(64, args.clients))],
                args.serve_args)
        except RuntimeError as e:
            sys.exit(f"hostile-traffic: {e}")
    host, port = urlparse(url).hostname, urlparse(url).port
    say = lambda text: print("hostile-traffic: " + text, flush=True)  # noqa: E731

    def completion_times(label, seed):
        runs = [timed_completion(url, seed + k, 8, args.answer_timeout) for k in range(3)]
        errors = [r for r in runs if isinstance(r, str)]
        if errors:
            failures.append(f"{label}: {errors[0]}")
            say(f"{label}: a completion failed: {errors[0]}")
            return None
        ttft = statistics.median(r[0] for r in runs)
        whole = statistics.median(r[1] for r in runs)
        say(f"{label}: a completion of 8 tokens: first token {ttft * 1000:.1f} ms, whole "
            f"{whole * 1000:.1f} ms (median of 3)")
        return whole

    def client_run(label):
        run = ClientRun(url, args.clients, requests, args.max_tokens).run()
        for f in run.failures[:3]:
            failures.append(f"{label}: {f}")
        say(f"{label}: {args.clients} clients, {len(run.ttfts)}/{requests} requests complete, "
            f"{run.tokens_per_second():.1f} tokens/s, time to first token p50 "
            f"{run.ttft_quantile(0.5) * 1000:.1f} ms, p99 {run.ttft_quantile(0.99) * 1000:.1f} ms")
        return run.tokens_per_second()

    # 1. alone, after a warm-up that is not measured (the first requests page the model in)
    ClientRun(url, args.clients, args.clients, 4).run()
    alone = completion_times("alone", 1)
    alone_tps = client_run("alone")
    rss0 = rss_kb(server.pid) if server else 0
    threads0 = thread_count(server.pid) if server else 0

    # 2. stalled connections
    t0 = time.monotonic()
    stalled = StalledConnections(host, port, args.stalled).start()
    say(f"stalled: {stalled.open_count()} connections open in {time.monotonic() - t0:.2f} s "
        f"({stalled.open_failures} could not be opened)")
    time.sleep(0.5)
    if server:
        rss1, threads1 = rss_kb(server.pid), thread_count(server.pid)
        say(f"stalled: server RSS {rss0 / 1024:.1f} MB before, {rss1 / 1024:.1f} MB with them "
            f"({(rss1 - rss0) / max(1, args.stalled):.1f} KiB per connection); threads "
            f"{threads0} before, {threads1} with them")
    with_stalled = completion_times("with stalled", 11)
    if alone is not None and with_stalled is not None:
        say(f"stalled: the completion took {with_stalled - alone:+.3f} s more than alone")
    stalled_tps = client_run("with stalled")
    say(f"stalled: {stalled.closed_by_server} stalled connections were closed by the server "
        f"(and opened again); {stalled.open_count()} open at the end")
    stalled.close()
    ratios = [stalled_tps / alone_tps if alone_tps > 0 else 0.0]
    # More rounds, alternating, so that a busy machine's drift does not read as a cost.
    for r in range(1, args.rounds):
        alone_tps = client_run(f"round {r + 1}, alone")
        stalled = StalledConnections(host, port, args.stalled).start()
        stalled_tps = client_run(f"round {r + 1}, with stalled")
        stalled.close()
        ratios.append(stalled_tps / alone_tps if alone_tps > 0 else 0.0)
    say("stalled: throughput with them / without them: "
        + ", ".join(f"{x:.2f}" for x in ratios)
        + (f" (median {statistics.median(ratios):.2f} of {len(ratios)} rounds)"
           if len(ratios) > 1 else ""))

    # 3. slow drip
    closed_after, answer = slow_drip(host, port, args.drip_seconds)
    if closed_after is None:
        say(f"slow drip: still open after {args.drip_seconds:.0f} s")
        failures.append(f"the slow-drip request was still open after {args.drip_seconds} s")
    else:
        say(f"slow drip: closed by the server after {closed_after:.1f} s"
            + (f", answered '{answer}'" if answer else ", without an answer"))

    # 4. flood
    t0 = time.monotonic()
    outcome, opened_s = flood(host, port, args.flood, args.hang_seconds)
    say(f"flood: {args.flood} connections opened in {opened_s:.2f} s; {outcome['answered']} "
        f"answered, {outcome['refused']} refused ({outcome['503']} of them with 503), "
        f"{outcome['hung']} hung; all settled in {time.monotonic() - t0:.1f} s")
    if outcome["hung"]:
        failures.append(f"{outcome['hung']} flood connections hung (no answer or close within "
                        f"{args.hang_seconds} s)")

    # 5. after it all
    if completion_times("after", 21) is None:
        failures.append("no completion after the flood")
    if server:
        if server.poll() is not None:
            failures.append(f"the server died (exit {server.returncode})")
        else:
            server.send_signal(signal.SIGTERM)
            code = server.wait(timeout=60)
            if code != 0:
                failures.append(f"the server exited {code} after SIGTERM")
            say(f"the server exited {code} after SIGTERM")
    for f in failures[:10]:
        print("hostile-traffic: FAIL " + f, file=sys.stderr)
    sys.exit(1 if failures and args.check else 0)


if __name__ == "__main__":
    main()
