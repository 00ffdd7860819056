"""A small OpenAI-compatible chat completions server on localhost (stdlib http.server, real sockets), for what a
served model cannot be made to do on cue: answer 429 / 503 with Retry-After, stall past a timeout, show how many
requests it holds at once.

    with ScriptedServer(model="m", key="k", script=["429", "503"], delay_s=0.1) as server:
        server.base_url          # http://127.0.0.1:PORT/v1
        server.requests          # the decoded request bodies, in arrival order
        server.max_in_flight     # most requests being answered at once

It answers each request with the next entry of ``script`` ("ok": as usual; "429", "503", any status; "stall": no answer
before the client's timeout; "not_json" / "no_choices": a 200 whose body is not a chat completion; "cut": a 200 whose
body stops short of its Content-Length; "reset": the connection closed mid-body; "429_cut": a 429 whose error body
stops short), then with a completion: the last user message's content reversed word by word, as many "tokens" as words, cut at
``max_tokens`` (``finish_reason`` "length") or whole ("stop"). A wrong model is a 404, a wrong key a 401, as OpenAI
answers them; ``GET /v1/models`` lists the model. ``requests`` and ``statuses`` are the chat requests'. A prompt
holding ``reject_word`` is refused with a 400 (a prompt longer than the context, as vLLM words it). ``redirect_to``:
every request is answered with a 307 to that base URL (the same path under it). ``auth_seen`` holds the
``Authorization`` header of every request (GET included), None where there was none. ``refuse``: (option, value): a
chat request sending that value is refused with a 400 in OpenAI's words (a reasoning model refusing ``temperature``
0). ``leak_key``: a server that echoes the key it was sent everywhere it can: in an ``X-Echo-Authorization`` header of
every answer, in a redirect's ``Location`` (URL-encoded), and in the 400 of a prompt holding ``LEAK<n>``, one form
per n (`leak_body`).
"""

from __future__ import annotations

import html.entities
import json
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LEAK_FORMS = 7
NAMED_ENTITIES = {v: k for k, v in html.entities.html5.items() if k.endswith(";") and k.islower() and len(v) == 1}
# each way a character is escaped, by kind: JSON (either case), URL (either case), HTML (decimal, hex, by name)
ESCAPES = {"json": lambda c: "\\u%04x" % ord(c), "JSON": lambda c: "\\U%04X" % ord(c),
           "url": lambda c: "%%%02x" % ord(c), "URL": lambda c: "%%%02X" % ord(c),
           "html": lambda c: "&#%d;" % ord(c), "html_hex": lambda c: "&#x%x;" % ord(c),
           "html_named": lambda c: f"&{NAMED_ENTITIES[c]}" if c in NAMED_ENTITIES else "&#%d;" % ord(c)}


def escaped_key(key: str, kind: str, every: bool) -> str:
    """``key`` with each character that is not a letter or digit (``every``: each character) escaped in ``kind``
    (an `ESCAPES` key): no piece of it between two escapes is longer than the key's longest alphanumeric run."""
    return "".join(ESCAPES[kind](c) if every or not c.isalnum() else c for c in key)


def leak_body(n: int, auth: str) -> tuple[str, bytes]:
    """(content type, body) of the 400 that echoes the ``Authorization`` header ``auth`` in form ``n``: 0 as sent,
    JSON-escaped, \\u-escaped and URL-encoded in one message; 1 at the 500th character of the message (where an
    error is cut); 2 at the 300th; 3 a text body of 70,000 bytes with the key across its 65,536th; 4 a text body with
    ``\\/`` escapes and lowercase %-encoding; 5 a JSON message with the key's every non-alphanumeric character
    escaped, once in each kind of `ESCAPES` (the message then holds the escapes as text); 6 a text body with every
    character of the key escaped, once in each kind."""
    key = auth.removeprefix("Bearer ")
    if n == 5:
        message = "; ".join(f"{kind}: {escaped_key(key, kind, every=False)}" for kind in ESCAPES)
        return "application/json", json.dumps({"error": {"message": f"invalid request; seen {message}"}}).encode()
    if n == 6:
        return "text/plain", "; ".join(f"{kind}: {escaped_key(key, kind, every=True)}" for kind in ESCAPES).encode()
    if n == 0:
        escaped = "".join("\\u%04x" % ord(c) for c in key)
        url = f"https://x.test/?k={urllib.parse.quote(key, safe='')}"
        message = f"invalid request; header seen: {auth}; as a URL: {url}; escaped: {escaped}"
        return "application/json", json.dumps({"error": {"message": message, "seen": key}}).encode()
    if n in (1, 2):
        message = "x" * ((500 if n == 1 else 300) - 10) + auth
        return "application/json", json.dumps({"error": {"message": message}}).encode()
    if n == 3:
        return "text/plain", ("y" * (65536 - 12) + auth + "z" * 4000).encode()
    quoted = re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), urllib.parse.quote(key, safe=""))
    slashed = json.dumps(key).replace("/", "\\/")
    return "text/plain", f"refused {slashed} and {quoted}".encode()


class ScriptedServer:
    def __init__(self, *, model: str = "judge", key: str | None = None, script=(), delay_s: float = 0.0,
                 retry_after: str | None = None, stall_s: float = 3.0, echo_prefix: bool = False,
                 list_models: bool = True, reject_word: str | None = None, redirect_to: str | None = None,
                 refuse: tuple | None = None, leak_key: bool = False) -> None:
        self.echo_prefix, self.list_models, self.refuse, self.leak_key = echo_prefix, list_models, refuse, leak_key
        self.reject_word, self.redirect_to = reject_word, redirect_to
        self.auth_seen: list[str | None] = []
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
        if self.refuse and body.get(self.refuse[0]) == self.refuse[1]:
            option, value = self.refuse
            return 400, {}, {"error": {"message": f"Unsupported value: '{option}' does not support {value} with this "
                                                  "model. Only the default (1) value is supported.",
                                       "type": "invalid_request_error", "param": option}}
        leak = re.search(r"LEAK(\d)", json.dumps(body["messages"])) if self.leak_key else None
        if leak:
            return 400, {"X-Leak": leak.group(1)}, {}
        if self.reject_word and self.reject_word in json.dumps(body["messages"]):
            return 400, {}, {"error": {"message": "This model's maximum context length is 32 tokens; the prompt is "
                                                  f"longer (key seen: {auth})", "code": "context_length_exceeded"}}
        if step == "stall":
            time.sleep(self.stall_s)
        elif step in ("not_json", "no_choices", "cut", "reset", "429_cut"):
            return 200, {"X-Step": step}, {}
        elif step not in (None, "ok"):
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

            def _redirected(self) -> bool:
                with server.lock:
                    server.auth_seen.append(self.headers.get("Authorization"))
                if server.redirect_to is None:
                    return False
                self.send_response(307)
                leak = f"?token={urllib.parse.quote(self.headers.get('Authorization') or '', safe='')}" \
                    if server.leak_key else ""
                self.send_header("Location", server.redirect_to + self.path.removeprefix("/v1") + leak)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return True

            def do_GET(self) -> None:  # the model list, behind the same key
                if self._redirected():
                    return None
                if self.path.rstrip("/") != "/v1/models" or not server.list_models:
                    return self._send(404, {}, {"error": {"message": f"no route {self.path}"}})
                auth = self.headers.get("Authorization")
                if server.key is not None and auth != f"Bearer {server.key}":
                    return self._send(401, {}, {"error": {"message": f"Incorrect API key provided: {auth}"}})
                self._send(200, {}, {"object": "list", "data": [{"id": server.model, "object": "model"}]})

            def do_POST(self) -> None:
                if self._redirected():
                    return None
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
                step = headers.pop("X-Step", None)
                data = json.dumps(payload).encode()
                if server.leak_key:
                    auth = self.headers.get("Authorization") or ""
                    headers = {**headers, "X-Echo-Authorization": auth}
                    if "X-Leak" in headers:
                        headers["Content-Type"], data = leak_body(int(headers.pop("X-Leak")), auth)
                length = len(data)
                if step == "not_json":
                    data = b"<html>502 Bad Gateway</html>"
                    length = len(data)
                elif step == "no_choices":
                    data = json.dumps({"object": "chat.completion", "choices": []}).encode()
                    length = len(data)
                elif step in ("cut", "reset", "429_cut"):
                    status = 429 if step == "429_cut" else 200
                    data = b'{"error": {"message": "cut sh'
                    length = len(data) + 100  # the body stops short of what the header announced
                try:
                    self.send_response(status)
                    for k, v in {"Content-Type": "application/json", "Content-Length": str(length), **headers}.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                    if step in ("cut", "reset", "429_cut"):
                        self.wfile.flush()
                        if step == "reset":  # RST instead of FIN: the client's read fails with a reset
                            import socket
                            import struct

                            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        self.close_connection = True
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
