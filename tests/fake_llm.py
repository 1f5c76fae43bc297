"""A local HTTP endpoint speaking OpenAI's chat-completions API with scripted replies.

The LLM planner's tests go through litellm and real HTTP to this server, so the request shape,
the response parsing and the error mapping are all exercised; only the model is scripted.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeLLM:
    def __init__(self):
        self.replies: list[tuple[int, str]] = []   # (HTTP status, assistant content or error body)
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append({"body": body, "auth": self.headers.get("Authorization")})
                status, content = owner.replies.pop(0) if owner.replies else (500, "no scripted reply")
                if status == 200:
                    payload = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": content}}],
                               "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}}
                else:
                    payload = {"error": {"message": content, "type": "server_error"}}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
