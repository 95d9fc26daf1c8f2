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
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from serve_client import (ClientRun, add_server_arguments, cpu_seconds, rss_kb,  # noqa: E402
                          start_server)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_server_arguments(ap)
    ap.add_argument("--parallel", type=int, default=None, help="server slots (default: --clients)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=None,
                    help="sampling temperature of every request (default: the API's, 1); 0 is "
                         "greedy, as tmx bench's batched decode")
    structured = ap.add_mutually_exclusive_group()
    structured.add_argument("--json-object", action="store_true",
                            help="every request asks for response_format json_object (structured "
                                 "output): an answer ends when its object is complete, and must "
                                 "parse")
    structured.add_argument("--json-schema", metavar="FILE",
                            help="every request asks for response_format json_schema with this "
                                 "schema")
    ap.add_argument("--max-growth-mb", type=float, default=64)
    ap.add_argument("--rss-after", type=int, default=None,
                    help="requests after which the server's first RSS is read (default: a tenth)")
    args = ap.parse_args()

    server = None
    url = args.url
    if not url:
        parallel = args.parallel or args.clients
        try:
            server, url = start_server(
                args.tmx, args.model, args.backend,
                ["--parallel", str(parallel), "--queue", str(max(64, args.clients)),
                 "--max-tokens-limit", str(max(2048, args.max_tokens))], args.serve_args)
        except RuntimeError as e:
            sys.exit(f"load-test: {e}")

    rss_after = args.rss_after if args.rss_after is not None else args.requests // 10
    rss = {}

    def note_request(i):
        if server and i == rss_after:
            rss["early"] = rss_kb(server.pid)

    server_cpu0 = cpu_seconds(server.pid) if server else 0.0
    client_cpu0 = sum(os.times()[:2])
    response_format = None
    if args.json_object:
        response_format = {"type": "json_object"}
    elif args.json_schema:
        with open(args.json_schema) as f:
            response_format = {"type": "json_schema",
                               "json_schema": {"name": "load_test", "schema": json.load(f)}}
    run = ClientRun(url, args.clients, args.requests, args.max_tokens, args.temperature,
                    note_request, response_format).run()
    wall = run.wall
    client_cpu = sum(os.times()[:2]) - client_cpu0
    failures = run.failures
    if server:
        server_cpu = cpu_seconds(server.pid) - server_cpu0
        rss["end"] = rss_kb(server.pid)
        server.terminate()
        code = server.wait(timeout=60)
        if code != 0:
            failures.append(f"the server exited {code} after SIGTERM")

    print(f"load-test: {args.clients} clients, {len(run.ttfts)}/{args.requests} requests "
          f"complete, {run.tokens} tokens in {wall:.1f} s: {run.tokens_per_second():.1f} "
          f"tokens/s; time to first token p50 {run.ttft_quantile(0.5) * 1000:.2f} ms, "
          f"p99 {run.ttft_quantile(0.99) * 1000:.2f} ms")
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
