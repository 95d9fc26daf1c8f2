#!/usr/bin/env python3
"""A bounded load test of `tmx serve` on loopback (standard library only).

Starts the server on a free port (or uses --url), runs --clients concurrent streaming clients
until --requests requests are done, checks that every answer is complete and well formed
(SSE events of valid JSON ending with [DONE], usage-consistent token counts), and reports the
aggregate generated tokens/s, time to first token (p50/p99) and the server's resident memory
after the first tenth of the requests and at the end. Exits non-zero on any malformed or failed
answer, or when memory grew by more than --max-growth-mb.

  scripts/load-test.py --model assets/demo --clients 16 --requests 400 --max-tokens 64
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.request


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid):
    """User + system CPU time of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_request(url, prompt, max_tokens, seed, temperature=None):
    fields = {"prompt": prompt, "max_tokens": max_tokens, "seed": seed, "stream": True,
              "ignore_eos": True}
    if temperature is not None:
        fields["temperature"] = temperature
    body = json.dumps(fields).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft = None
    text = ""
    done = False
    finish = None
    with urllib.request.urlopen(req, timeout=300) as res:
        if res.status != 200:
            raise RuntimeError(f"status {res.status}")
        for raw in res:
            line = raw.decode("utf-8").rstrip("\n")
            if not line:
                continue
            if not line.startswith("data: "):
                raise RuntimeError(f"not an SSE data line: {line!r}")
            data = line[6:]
            if data == "[DONE]":
                done = True
                continue
            if done:
                raise RuntimeError("an event after [DONE]")
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"error event: {event}")
            choice = event["choices"][0]
            if choice["text"] and ttft is None:
                ttft = time.monotonic() - t0
            text += choice["text"]
            if choice["finish_reason"] is not None:
                finish = choice["finish_reason"]
    if not done or finish != "length":
        raise RuntimeError(f"incomplete answer (done {done}, finish_reason {finish})")
    return ttft if ttft is not None else time.monotonic() - t0, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tmx", default=os.path.join(os.path.dirname(__file__), "..", "build", "tmx"))
    ap.add_argument("--model", default="assets/demo")
    ap.add_argument("--url", help="a running server instead of starting one")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--parallel", type=int, default=None, help="server slots (default: --clients)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=None,
                    help="sampling temperature of every request (default: the API's, 1); 0 is "
                         "greedy, as tmx bench's batched decode")
    ap.add_argument("--max-growth-mb", type=float, default=64)
    ap.add_argument("--rss-after", type=int, default=None,
                    help="requests after which the server's first RSS is read (default: a tenth)")
    ap.add_argument("--serve-args", default="",
                    help="more flags for the server, e.g. '--prefill-budget 64 --stream-interval 10'")
    args = ap.parse_args()

    server = None
    url = args.url
    if not url:
        parallel = args.parallel or args.clients
        server = subprocess.Popen(
            [args.tmx, "serve", "--model", args.model, "--backend", args.backend, "--port", "0",
             "--parallel", str(parallel), "--queue", str(max(64, args.clients)),
             "--max-tokens-limit", str(max(2048, args.max_tokens))]
            + shlex.split(args.serve_args),
            stderr=subprocess.PIPE, text=True)
        for line in server.stderr:
            m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
            if m:
                url = m.group(1)
                break
        if not url:
            sys.exit("load-test: the server did not start")
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()

    rss_after = args.rss_after if args.rss_after is not None else args.requests // 10
    lock = threading.Lock()
    issued = [0]
    ttfts, tokens, failures = [], [0], []
    rss = {}

    def client(k):
        while True:
            with lock:
                if issued[0] >= args.requests:
                    return
                i = issued[0]
                issued[0] += 1
                if server and i == rss_after:
                    rss["early"] = rss_kb(server.pid)
            try:
                ttft, _ = one_request(url, f"Once upon a time {i % 7}", args.max_tokens, i,
                                       args.temperature)
                with lock:
                    ttfts.append(ttft)
                    tokens[0] += args.max_tokens
            except Exception as e:  # noqa: BLE001 - every failure is reported
                with lock:
                    failures.append(f"request {i}: {e}")

    t0 = time.monotonic()
    server_cpu0 = cpu_seconds(server.pid) if server else 0.0
    client_cpu0 = sum(os.times()[:2])
    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    client_cpu = sum(os.times()[:2]) - client_cpu0
    if server:
        server_cpu = cpu_seconds(server.pid) - server_cpu0
        rss["end"] = rss_kb(server.pid)
        server.terminate()
        code = server.wait(timeout=60)
        if code != 0:
            failures.append(f"the server exited {code} after SIGTERM")

    ttfts.sort()
    p = lambda q: ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] if ttfts else float("nan")
    print(f"load-test: {args.clients} clients, {len(ttfts)}/{args.requests} requests complete, "
          f"{tokens[0]} tokens in {wall:.1f} s: {tokens[0] / wall:.1f} tokens/s; "
          f"time to first token p50 {p(0.5) * 1000:.2f} ms, p99 {p(0.99) * 1000:.2f} ms")
    if server:
        print(f"load-test: CPU time over the run: server {server_cpu:.1f} s "
              f"({server_cpu / wall:.2f} cores), these clients {client_cpu:.1f} s "
              f"({client_cpu / wall:.2f} cores), of {os.cpu_count()} cores")
    if "early" in rss:
        growth = (rss["end"] - rss["early"]) / 1024
        print(f"load-test: server RSS {rss['early'] / 1024:.1f} MB after {rss_after} "
              f"requests, {rss['end'] / 1024:.1f} MB at the end ({growth:+.1f} MB)")
        if growth > args.max_growth_mb:
            failures.append(f"memory grew by {growth:.1f} MB (limit {args.max_growth_mb})")
    for f in failures[:10]:
        print("load-test: FAIL " + f, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
