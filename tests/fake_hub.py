"""A local Hugging Face Hub endpoint (HF_ENDPOINT) serving one tiny repository, one gated one,
and nothing else: enough of the Hub's HTTP API for huggingface_hub's snapshot_download."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

SHA = "0123456789abcdef0123456789abcdef01234567"
TINY = {
    "config.json": json.dumps({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}).encode(),
    "tokenizer_config.json": b'{"add_bos_token": true}',
    "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ",
    "pytorch_model.bin": b"a duplicate that must not be fetched",
}


class Handler(BaseHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args):   # quiet
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(code)
        for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _route(self, head: bool):
        path = unquote(urlparse(self.path).path)
        Handler.requests.append(f"{self.command} {path}")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"]:
            repo, rest = "/".join(parts[2:4]), parts[4:]
        else:
            repo, rest = "/".join(parts[0:2]), parts[2:]
        if repo == "org/gated":
            return self._send(401, b'{"error": "gated"}',
                              {"X-Error-Code": "GatedRepo",
                               "X-Error-Message": "Access to model org/gated is restricted"}, head)
        if repo != "org/tiny":
            return self._send(404, b'{"error": "not found"}', {"X-Error-Code": "RepoNotFound",
                                                               "X-Error-Message": "Repository not found"}, head)
        if parts[:2] == ["api", "models"] and rest[:1] == ["revision"]:
            body = {"id": repo, "sha": SHA, "siblings": [{"rfilename": f} for f in TINY]}
            return self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
        if parts[:2] == ["api", "models"] and rest[:1] == ["tree"]:
            body = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                    for f, b in TINY.items()]
            return self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
        if rest[:1] == ["resolve"] and "/".join(rest[2:]) in TINY:
            body = TINY["/".join(rest[2:])]
            etag = hashlib.sha1(body).hexdigest()
            return self._send(200, body, {"X-Repo-Commit": SHA, "ETag": f'"{etag}"'}, head)
        return self._send(404, b"{}", {"X-Error-Code": "EntryNotFound"}, head)

    def do_GET(self):
        self._route(head=False)

    def do_HEAD(self):
        self._route(head=True)


class FakeHub:
    def __init__(self):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def requests(self) -> list[str]:
        return Handler.requests

    def close(self):
        self.server.shutdown()
        self.server.server_close()
