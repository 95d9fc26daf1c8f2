"""What scripts/load-test.py and scripts/hostile-traffic.py share (standard library only): starting
`tmx serve` on a free port, one streaming completion checked end to end, a run of concurrent
clients, and the server process's memory, threads and CPU time from /proc."""
import json
import os
import re
import shlex
import subprocess
import threading
import time
import urllib.request


def rss_kb(pid):
    """Resident memory of a process in KiB."""
    return proc_status(pid, "VmRSS")


def thread_count(pid):
    return proc_status(pid, "Threads")


def proc_status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid):
    """User + system CPU time of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def add_server_arguments(ap):
    """The flags that say which server to load: one to start (--tmx, --model, --backend,
    --serve-args) or a running one (--url)."""
    ap.add_argument("--tmx", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "..", "build", "tmx"))
    ap.add_argument("--model", default="assets/demo")
    ap.add_argument("--url", help="a running server instead of starting one")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--serve-args", default="",
                    help="more flags for the server, e.g. '--prefill-budget 64'")


def start_server(tmx, model, backend="cpu", flags=(), extra=""):
    """Starts `tmx serve` on a free port; returns (process, url). Its stderr is drained by a
    thread (kept in process.log) so that the server never blocks writing to it."""
    server = subprocess.Popen([tmx, "serve", "--model", model, "--backend", backend,
                               "--port", "0", *flags] + shlex.split(extra),
                              stderr=subprocess.PIPE, text=True)
    server.log = []
    url = None
    for line in server.stderr:
        server.log.append(line)
        m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
        if m:
            url = m.group(1)
            break
    if not url:
        server.kill()
        raise RuntimeError("the server did not start:\n" + "".join(server.log))
    threading.Thread(target=lambda: [server.log.append(l) for l in server.stderr],
                     daemon=True).start()
    return server, url


def one_request(url, prompt, max_tokens, seed, temperature=None, timeout=300,
                response_format=None):
    """One streaming completion, every event checked: of exactly max_tokens tokens
    (ignore_eos), or with a response_format ({"type": "json_object"}, ...) until its value is
    complete (then its text must parse as JSON) or max_tokens. Returns (time to first token,
    whole time, tokens generated)."""
    fields = {"prompt": prompt, "max_tokens": max_tokens, "seed": seed, "stream": True,
              "ignore_eos": True, "stream_options": {"include_usage": True}}
    if temperature is not None:
        fields["temperature"] = temperature
    if response_format is not None:
        fields["response_format"] = response_format
    body = json.dumps(fields).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft = None
    done = False
    finish = None
    text = ""
    tokens = None
    with urllib.request.urlopen(req, timeout=timeout) as res:
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
            if not event["choices"]:  # the usage chunk
                tokens = event["usage"]["completion_tokens"]
                continue
            choice = event["choices"][0]
            if choice["text"] and ttft is None:
                ttft = time.monotonic() - t0
            text += choice["text"]
            if choice["finish_reason"] is not None:
                finish = choice["finish_reason"]
    finishes = ("length",) if response_format is None else ("length", "stop")
    if not done or finish not in finishes or tokens is None:
        raise RuntimeError(f"incomplete answer (done {done}, finish_reason {finish}, "
                           f"usage {tokens})")
    if response_format is not None and finish == "stop":
        json.loads(text)  # a complete value must parse
    elif tokens != max_tokens:
        raise RuntimeError(f"{tokens} tokens, not max_tokens {max_tokens}")
    return ttft if ttft is not None else time.monotonic() - t0, time.monotonic() - t0, tokens


class ClientRun:
    """`clients` threads issuing `requests` streaming completions in all; on_request(i) is called
    (under the lock) before request i is issued. After run(): ttfts, tokens, failures, wall."""

    def __init__(self, url, clients, requests, max_tokens, temperature=None, on_request=None,
                 response_format=None):
        self.url, self.clients, self.requests = url, clients, requests
        self.max_tokens, self.temperature, self.on_request = max_tokens, temperature, on_request
        self.response_format = response_format
        self.ttfts, self.tokens, self.failures, self.wall = [], 0, [], 0.0

    def run(self):
        lock = threading.Lock()
        issued = [0]

        def client():
            while True:
                with lock:
                    if issued[0] >= self.requests:
                        return
                    i = issued[0]
                    issued[0] += 1
                    if self.on_request:
                        self.on_request(i)
                try:
                    ttft, _, tokens = one_request(self.url, f"Once upon a time {i % 7}",
                                                  self.max_tokens, i, self.temperature,
                                                  response_format=self.response_format)
                    with lock:
                        self.ttfts.append(ttft)
                        self.tokens += tokens
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    with lock:
                        self.failures.append(f"request {i}: {e}")

        t0 = time.monotonic()
        threads = [threading.Thread(target=client) for _ in range(self.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.wall = time.monotonic() - t0
        self.ttfts.sort()
        return self

    def tokens_per_second(self):
        return self.tokens / self.wall if self.wall > 0 else 0.0

    def ttft_quantile(self, q):
        t = self.ttfts
        return t[min(len(t) - 1, int(q * len(t)))] if t else float("nan")
