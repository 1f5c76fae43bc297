"""A stand-in for the vLLM server at the process seam, for fast tests of the worker's plumbing.

It speaks the few endpoints the worker uses, with deterministic answers, and misbehaves on
request (FAKE_MODE): exit at start, hang at start, answer with errors (or an error in the
stream), stall some answers (FAKE_STALL), NaN logprobs or short outputs, spawn a child that leaves the process
group, or one without
the trial's marker (as vLLM's engine core). The real-engine tests use real vLLM.
    python tests/fake_server.py --model M --host H --port P [ignored vLLM flags...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = os.environ.get("FAKE_MODE", "ok")   # memo: a body seen before is answered at once (a cross-request cache)
TOKEN_S = float(os.environ.get("FAKE_TOKEN_S", "0.002"))
# FAKE_SLOTS=k (or --max-num-seqs k): at most k requests decode at once, the others wait in line (their TTFT
# grows with the queue): a server whose latency rises with load, with a known capacity of k / (tokens * FAKE_TOKEN_S).
SLOTS = threading.BoundedSemaphore(int(os.environ.get("FAKE_SLOTS", "0")) or 10_000)
# FAKE_STALL=k:s: every streamed request from the k-th received on (0-based) waits s seconds before its
# first token, as a server that stalls the tail of a phase (or, k=0 with FAKE_STALL_COUNT=n, its first n).
STALL_FROM, _, STALL_S = os.environ.get("FAKE_STALL", "-1:0").partition(":")
STALL_COUNT = int(os.environ.get("FAKE_STALL_COUNT", "0")) or 10**9
VOCAB = 1000
SEEN: set[str] = set()
RECEIVED = [0]
LOCK = threading.Lock()


def token_ids(text: str) -> list[int]:
    return [sum(map(ord, w)) % VOCAB + 3 for w in text.split()]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        print(fmt % args, flush=True)

    def send(self, code: int, body: dict | str, ctype: str = "application/json") -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self.send(200, "")
        elif self.path == "/v1/models":
            self.send(200, {"data": [{"id": "fake-model"}]})
        elif self.path == "/metrics":
            self.send(200, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n"
                           "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{model_name=\"m\"} 0\n",
                      "text/plain")
        else:
            self.send(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if record := os.environ.get("FAKE_RECORD"):   # every request as received, for the tests to read
            with open(record, "a") as f:
                f.write(json.dumps({"path": self.path, "body": body, "at": time.time()}) + "\n")
        if MODE == "errors":
            self.send(500, {"error": {"message": "fake internal error"}})
        elif MODE == "garbage":   # 200 OK with bytes that are not the API's JSON
            self.send(200, "\x00<html>not json\ufffd",
                      "text/event-stream" if body.get("stream") else "application/json")
        elif self.path == "/tokenize":
            ids = ([2] if body.get("add_special_tokens") else []) + token_ids(body["prompt"])
            self.send(200, {"tokens": ids, "count": len(ids)})
        elif self.path in ("/v1/completions", "/v1/chat/completions") and body.get("stream"):
            self.stream(body, chat=self.path.endswith("chat/completions"))
        elif self.path == "/v1/completions":
            self.complete(body)
        else:
            self.send(404, {"error": "not found"})

    def complete(self, body: dict) -> None:
        choice: dict = {"index": 0, "text": " word" * body.get("max_tokens", 1)}
        if body.get("prompt_logprobs") is not None:
            value = float("nan") if MODE == "nan" else -2.0
            choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": value, "rank": 1}} for t in body["prompt"][1:]]
        if body.get("return_token_ids"):
            choice["token_ids"] = [7] * body.get("max_tokens", 1)
        if body.get("logprobs"):
            top = ({"token_id:7": -0.1, "token_id:8": -2.5} if body.get("return_tokens_as_token_ids")
                   else {" word": -0.1, " other": -2.5})
            choice["logprobs"] = {"tokens": [" word"] * body.get("max_tokens", 1),
                                  "top_logprobs": [dict(top) for _ in range(body.get("max_tokens", 1))]}
        self.send(200, {"choices": [choice]})

    def stream(self, body: dict, chat: bool = False) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = body.get("max_tokens", body.get("max_completion_tokens", 1)) - (1 if MODE == "short" else 0)
        key = json.dumps(body, sort_keys=True)
        cached = MODE == "memo" and key in SEEN
        SEEN.add(key)
        with LOCK:
            index, RECEIVED[0] = RECEIVED[0], RECEIVED[0] + 1
        if 0 <= int(STALL_FROM) <= index < int(STALL_FROM) + STALL_COUNT:
            time.sleep(float(STALL_S))
        with SLOTS:
            for i in range(n):
                if not cached:
                    time.sleep(TOKEN_S)
                choice = {"index": 0, **({"delta": {"content": " w"}} if chat else {"text": " w"}),
                          **({"finish_reason": "length"} if i == n - 1 else {})}
                self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                self.wfile.flush()
                if MODE == "stream_error":   # the engine fails mid-answer: vLLM sends an error chunk and ends
                    error = {"error": {"message": "fake engine died", "code": 500}}
                    self.wfile.write(f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode())
                    self.wfile.flush()
                    return
        usage = {"choices": [], "usage": {"completion_tokens": n, "prompt_tokens": 5}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int)
    args, unknown = parser.parse_known_args()
    print(f"fake server: mode {MODE}, flags {unknown}", flush=True)
    if "--max-num-seqs" in unknown and unknown[unknown.index("--max-num-seqs") + 1].startswith("-"):
        print("ValueError: max_num_seqs must be >= 1", flush=True)
        sys.exit(1)
    if "--max-num-seqs" in unknown:   # a batch limit it honours: at most that many decode at once
        global SLOTS
        SLOTS = threading.BoundedSemaphore(int(unknown[unknown.index("--max-num-seqs") + 1]))
    if MODE == "exit_early":
        sys.exit(0)
    if MODE == "hang":
        time.sleep(3600)
    if MODE == "escapee":
        # A grandchild in a session of its own whose parent exits at once: out of the process
        # group and out of the tree, findable only by the trial's marker variable.
        sleeper = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'], "
                   "start_new_session=True)")
        subprocess.run([sys.executable, "-c", sleeper], check=True)
    if MODE == "engine_core":
        # As vLLM's engine core: a child started with an environment of its own (no trial marker), in
        # the server's session; killed with the server alone, it lives on as init's child.
        env = {k: v for k, v in os.environ.items() if k != "AGENT_TRIAL_TOKEN"}
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], env=env)
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
