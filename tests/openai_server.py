"""A small OpenAI-compatible chat completions server on localhost (stdlib http.server, real sockets), for what a
served model cannot be made to do on cue: answer 429 / 503 with Retry-After, stall past a timeout, show how many
requests it holds at once.

    with ScriptedServer(model="m", key="k", script=["429", "503"], delay_s=0.1) as server:
        server.base_url          # http://127.0.0.1:PORT/v1
        server.requests          # the decoded request bodies, in arrival order
        server.max_in_flight     # most requests being answered at once

It answers each request with the next entry of ``script`` ("429", "503", "stall": no answer before the client's
timeout), then with a completion: the last user message's content reversed word by word, as many "tokens" as words, cut at
``max_tokens`` (``finish_reason`` "length") or whole ("stop"). A wrong model is a 404, a wrong key a 401, as OpenAI
answers them; ``GET /v1/models`` lists the model. ``requests`` and ``statuses`` are the chat requests'.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ScriptedServer:
    def __init__(self, *, model: str = "judge", key: str | None = None, script=(), delay_s: float = 0.0,
                 retry_after: str | None = None, stall_s: float = 3.0, echo_prefix: bool = False,
                 list_models: bool = True) -> None:
        self.echo_prefix, self.list_models = echo_prefix, list_models
        self.model, self.key, self.delay_s, self.retry_after, self.stall_s = model, key, delay_s, retry_after, stall_s
        self.script = list(script)
        self.requests: list[dict] = []
        self.statuses: list[int] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> "ScriptedServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _answer(self, body: dict, auth: str | None) -> tuple[int, dict, dict]:
        """(status, headers, payload) of one request."""
        with self.lock:
            self.requests.append(body)
            step = self.script.pop(0) if self.script else None
        if self.key is not None and auth != f"Bearer {self.key}":
            return 401, {}, {"error": {"message": f"Incorrect API key provided: {auth}", "code": "invalid_api_key"}}
        if body.get("model") != self.model:
            return 404, {}, {"error": {"message": f"The model `{body.get('model')}` does not exist",
                                       "code": "model_not_found"}}
        if step == "stall":
            time.sleep(self.stall_s)
        elif step is not None:
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return int(step), headers, {"error": {"message": f"scripted {step}"}}
        time.sleep(self.delay_s)
        users = [m for m in body["messages"] if m.get("role") == "user"]
        words = str(users[-1]["content"]).split()
        n = min(len(words), int(body.get("max_tokens") or len(words)))
        text = " ".join(list(reversed(words))[:n])
        last = body["messages"][-1]
        if self.echo_prefix and body.get("continue_final_message") and last.get("role") == "assistant":
            text = last["content"] + text  # a server whose answer repeats the prefix it continued
        return 200, {}, {"id": "x", "object": "chat.completion", "model": self.model,
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": "stop" if n == len(words) else "length"}],
                         "usage": {"prompt_tokens": sum(len(str(m["content"]).split()) for m in body["messages"]),
                                   "completion_tokens": n}}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # the model list, behind the same key
                if self.path.rstrip("/") != "/v1/models" or not server.list_models:
                    return self._send(404, {}, {"error": {"message": f"no route {self.path}"}})
                auth = self.headers.get("Authorization")
                if server.key is not None and auth != f"Bearer {server.key}":
                    return self._send(401, {}, {"error": {"message": f"Incorrect API key provided: {auth}"}})
                self._send(200, {}, {"object": "list", "data": [{"id": server.model, "object": "model"}]})

            def do_POST(self) -> None:
                with server.lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    status, headers, payload = server._answer(body, self.headers.get("Authorization"))
                finally:
                    with server.lock:
                        server.in_flight -= 1
                with server.lock:
                    server.statuses.append(status)
                self._send(status, headers, payload)

            def _send(self, status: int, headers: dict, payload: dict) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (a timeout) and closed the connection
                    pass

        return Handler


def main() -> None:
    """Serve on a given port until killed: ``python tests/openai_server.py --port P --model M [--delay_s S]``."""
    import argparse
    from http.server import ThreadingHTTPServer as Server

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="judge")
    parser.add_argument("--delay_s", type=float, default=0.0)
    args = parser.parse_args()
    server = ScriptedServer(model=args.model, delay_s=args.delay_s)
    server.httpd.server_close()
    Server.allow_reuse_address = True
    server.httpd = Server(("127.0.0.1", args.port), server._handler())
    server.httpd.daemon_threads = True
    print("ready", flush=True)
    server.httpd.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
