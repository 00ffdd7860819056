"""A judge behind an OpenAI-compatible endpoint (a hosted model, or vLLM / llama.cpp / SGLang serving one).

    from judgetrain.judge.endpoint import EndpointGenerator
    gen = EndpointGenerator("https://api.example.com/v1", "judge-model", "JUDGE_API_KEY", max_new_tokens=512)
    outs = gen.generate([messages_1, messages_2])   # list[judgetrain.eval.generate.Generated], input order
    gen.stats                                        # {"ok": 2, "retried_429": 0, ...}
    gen.close()

The command line names such a judge as ``endpoint=BASE_URL,model=NAME,key_env=VAR,name=N``.

- Requests: ``POST {base_url}/chat/completions`` (``base_url`` as OpenAI clients take it, usually ending in ``/v1``)
  with ``model``, ``messages``, ``max_tokens``, ``temperature`` and ``seed`` (when given), no streaming. The text is
  the first choice's message content; ``n_tokens`` and ``prompt_tokens`` are the response's ``usage`` counts (0 where
  the server sends none); ``stopped`` is ``finish_reason == "stop"`` (``"length"``: cut at ``max_new_tokens``).
- The key: read from the environment variable ``api_key_env`` names, when the generator is made (a missing or empty
  variable is an error before any request), and sent only as the ``Authorization: Bearer`` header. It is never
  logged, written or put into an error message: a server's body or header that echoes it is redacted (`redact`)
  before anything is cut to length, in any form (as sent; JSON-escaped, URL-encoded or as HTML entities, in part or
  character by character, `judgetrain.judge.redaction`; any 8 characters of it in a row; a start of it at the end
  of a body cut short). No variable: no header (a local server without a key).
- Concurrency: at most ``concurrency`` requests in flight, from daemon threads (an interrupted run does not wait for
  them to finish). Results come back in input order.
- Redirects: followed only to the same scheme, host and port; a redirect elsewhere is an `EndpointError` naming
  both URLs (urllib would send the ``Authorization`` header on to the other host). A key sent over plain ``http://``
  to a host that is not loopback gets one warning.
- Retries: a 429, a 5xx (and 408), a timeout, a refused, reset or dropped connection, a body cut short, and a 200
  whose body is not a chat completion are retried, up to ``max_retries`` times per prompt and while the prompt has
  waited less than ``wait_budget_s`` in all (default 10 minutes: a vLLM server restarted mid-run is waited for).
  Each wait is ``Retry-After`` seconds when the server sends that header, else an exponential backoff with jitter
  (``backoff_s`` x 2^attempt, capped at ``backoff_max_s``, between half and all of it); the log says what failed,
  how long the judge waits and how long it has waited. ``waits`` records each wait as ``(outcome, seconds)``.
- A prompt the server refuses (400, 413, 422: longer than its context, a content filter) is not retried and stops
  nothing: its result is a `Rejected` (the HTTP status and the server's message, key redacted), written as a row
  with reason ``endpoint_rejected``. But when the first answers of a generator (two or more, nothing answered yet)
  are all refusals with the same status and message, the request is what is refused (an option the server does not
  take: a reasoning model refusing ``max_tokens`` or ``temperature: 0``): `RequestRefused` names that option and
  quotes the message, and no result of the call is kept. A first call of one prompt (one item, ``--chunk_size 1``)
  that is refused asks once more with a prompt of a few words (`PROBE`): refused alike, the request is refused;
  answered, the prompt was, and stays its row.
- Errors: 401 / 403 (the key refused), 404 (no such model, or a wrong base URL) and other 4xx stop the call with an
  `EndpointError` naming the URL, the model and the server's message; so does a prompt whose retries or wait budget
  run out. The other prompts in flight are abandoned; the error's ``partial`` holds every answer received (None for
  the others), so a resumable caller keeps them.
- `preflight` asks ``GET {base_url}/models`` before anything else runs: a refused key, a model the server does not
  list or a server that cannot be reached is an `EndpointError` there; it returns the id the server lists the model
  under (the judge's identity on resume, the URL is not).
- ``stats`` counts every request's outcome over the generator's life: ``ok`` (answered), ``rejected`` (refused
  prompts), ``retried_429``, ``retried_5xx``, ``retried_timeout``, ``retried_connection``, ``retried_bad_answer``
  (one per retried attempt), ``failed`` (a prompt that ended in an error) and ``abandoned`` (prompts given up because
  another one failed).
- ``force_prefix``: the prompt gets a final assistant message holding the prefix and the request asks the server to
  continue it (``continue_final_message: true``, ``add_generation_prompt: false``: vLLM's and SGLang's chat
  options; llama.cpp's ``llama-server`` continues a final assistant message by itself). ``text`` is what the judge
  wrote after the prefix (a server that repeats the prefix has it removed), as the local generator returns it.
  Hosted APIs that do not continue an assistant message (OpenAI's own) answer a new turn instead: use the
  free-writing default with them.
"""

from __future__ import annotations

import email.utils
import ipaddress
import json
import logging
import os
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any

from judgetrain.eval.generate import Generated
from judgetrain.judge.options import check_settings
from judgetrain.judge.output import REJECTED_REASON
from judgetrain.judge.redaction import redact

logger = logging.getLogger(__name__)

OUTCOMES = ("ok", "rejected", "retried_429", "retried_5xx", "retried_timeout", "retried_connection",
            "retried_bad_answer", "failed", "abandoned")
REJECTED_STATUSES = (400, 413, 422)  # the prompt itself refused: too long for the context, a content filter

MAX_RETRY_AFTER_S = 600.0  # a Retry-After past this is read as this (a server asking for hours is waited for 10 min)
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MAX_RETRIES = 30
DEFAULT_WAIT_BUDGET_S = 600.0  # per prompt: longer than a vLLM server takes to start again
PREFLIGHT_TRIES = 3  # GET /models at start: a server that does not answer these is refused
ERROR_BODY_BYTES = 1 << 16  # read of an error body or an unreadable answer, redacted whole before any cut
# the request's options a server may refuse, and the judgetrain option that sets each
REQUEST_OPTIONS = {"max_tokens": "--max_new_tokens", "temperature": "--temperature / --do_sample",
                   "seed": "--seed", "continue_final_message": "--force_score_prefix",
                   "add_generation_prompt": "--force_score_prefix", "stream": None}


# a prompt no server refuses for its content or its length: asked once where a first lone prompt was refused
PROBE = [{"role": "user", "content": "Reply with the word OK."}]


class EndpointError(RuntimeError):
    """An endpoint judge that cannot go on: a refused key, a wrong model or URL, a missing key variable, a redirect
    to another host, retries run out. The message names the URL and the model, never the key; ``status`` is the
    HTTP status where one came; ``partial`` the answers a `EndpointGenerator.generate` call had received (input
    order, None where none came), so that a caller can keep them."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.partial: list | None = None


@dataclass
class Rejected(Generated):
    """A prompt the server refused (`REJECTED_STATUSES`): no text, the status and the server's message."""

    status: int = 0
    message: str = ""


class RequestRefused(EndpointError):
    """The endpoint refused the first prompts of a judge alike (one status, one message): the request is refused (an
    option the server does not take), not a prompt. Nothing of them is kept (``partial`` is None)."""


class _Retry(Exception):
    """A retryable outcome: its kind (an ``OUTCOMES`` retried_* key), what happened, the server's Retry-After."""

    def __init__(self, kind: str, what: str, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.kind, self.what, self.retry_after = kind, what, retry_after


class _Abandoned(Exception):
    """Another prompt failed: this one is given up."""


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """The wait a ``Retry-After`` header asks for: delay seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect to the same scheme, host and port only: urllib copies every header of the request, the
    key's ``Authorization`` included, to whatever URL a redirect names. The ``Location`` named in the error is
    redacted (a server may echo the key in it)."""

    def __init__(self, redact_text) -> None:
        super().__init__()
        self.redact_text = redact_text

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if _origin(newurl) != _origin(req.full_url):
            newurl = self.redact_text(newurl)
            raise EndpointError(f"endpoint {req.full_url} answered HTTP {code}, a redirect to {newurl} (another host "
                                "or scheme): not followed, the request carries the API key; give the URL the "
                                "server redirects to as endpoint=", code)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class EndpointGenerator:
    """Generates judge evaluations through an OpenAI-compatible chat completions endpoint (see the module doc).

    Args:
        base_url: the API's base URL as OpenAI clients take it (``http://127.0.0.1:8000/v1``).
        model: the model name the server knows.
        api_key_env: the environment variable holding the key (None: no key is sent).
        max_new_tokens: ``max_tokens`` of each request.
        temperature, seed: sampling (greedy by default; ``seed`` sent when given).
        concurrency: requests in flight at most.
        max_retries: retries per prompt of a 429, 5xx, timeout, connection error or unreadable answer.
        timeout_s: seconds to wait for one response.
        wait_budget_s: seconds a prompt may spend waiting between its retries in all.
        force_prefix: the start of the judge's answer, which it continues.
        backoff_s, backoff_max_s: the exponential backoff's first and largest wait.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str | None = None, *, max_new_tokens: int,
                 temperature: float = 0.0, seed: int | None = None, concurrency: int = 8,
                 max_retries: int = DEFAULT_MAX_RETRIES, timeout_s: float = DEFAULT_TIMEOUT_S,
                 wait_budget_s: float = DEFAULT_WAIT_BUDGET_S, force_prefix: str | None = None,
                 backoff_s: float = 0.5, backoff_max_s: float = 30.0) -> None:
        parsed = urllib.parse.urlsplit(str(base_url))
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise EndpointError(f"endpoint base URL {base_url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
        if parsed.username or parsed.password or parsed.query or parsed.fragment:
            raise EndpointError(f"endpoint base URL {parsed.scheme}://{parsed.hostname}{parsed.path}: give it without "
                                "user, password, query or fragment (the key goes in key_env=VAR)")
        if not model:
            raise EndpointError(f"endpoint {base_url}: no model name given (model=NAME)")
        check_settings(max_new_tokens=max_new_tokens, concurrency=concurrency, max_retries=max_retries,
                       timeout_s=timeout_s, wait_budget_s=wait_budget_s)
        if float(temperature) < 0 or float(backoff_s) < 0:
            raise ValueError(f"temperature and backoff_s must be >= 0 (got {temperature}, {backoff_s})")
        self.base_url = str(base_url).rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.model = str(model)
        self.api_key_env = api_key_env
        self._key = self._read_key(api_key_env)
        self.max_new_tokens = int(max_new_tokens)
        self.temperature = float(temperature)
        self.seed = None if seed is None else int(seed)
        self.concurrency = int(concurrency)
        self.max_retries = int(max_retries)
        self.timeout_s = float(timeout_s)
        self.wait_budget_s = float(wait_budget_s)
        self.force_prefix = force_prefix or None
        self.backoff_s = float(backoff_s)
        self.backoff_max_s = float(backoff_max_s)
        self.stats: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.waits: list[tuple[str, float]] = []  # every wait before a retry: (outcome, seconds), in order
        self.served_model: str | None = None  # the id GET /models lists the model under (`preflight`)
        self._lock = threading.Lock()
        self._random = random.Random()
        self._closed = False
        self._checked = False  # the model list is asked for once, at the first generate
        self._probed = False  # a lone refused first prompt is checked against `PROBE` once
        loopback = _is_loopback(parsed.hostname)
        if self._key and parsed.scheme == "http" and not loopback:
            logger.warning("endpoint %s: the API key in $%s goes over plain http to a host that is not this machine "
                           "(anyone on the path can read it); use https://", self.base_url, api_key_env)
        handlers: list = [_SameOriginRedirects(self._redact)]
        if loopback:
            handlers.append(urllib.request.ProxyHandler({}))
        self._opener = urllib.request.build_opener(*handlers)

    def _read_key(self, var: str | None) -> str | None:
        if var is None:
            return None
        key = os.environ.get(var)
        if not key:
            raise EndpointError(f"environment variable {var} is {'empty' if key == '' else 'not set'}: it holds the "
                                f"API key of endpoint {self.base_url} (model {self.model!r}); export it before the run")
        return key

    def __repr__(self) -> str:  # the key stays out of any printed object
        return f"EndpointGenerator({self.base_url!r}, model={self.model!r}, api_key_env={self.api_key_env!r})"

    # ------------------------------------------------------------------------------------------------ requests
    def _body(self, messages: list[dict]) -> dict[str, Any]:
        messages = [dict(m) for m in messages]
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_new_tokens,
                                "temperature": self.temperature, "stream": False}
        if self.seed is not None:
            body["seed"] = self.seed
        if self.force_prefix:
            messages.append({"role": "assistant", "content": self.force_prefix})
            body.update(continue_final_message=True, add_generation_prompt=False)
        return body

    def _redact(self, text: str, cut: bool = False) -> str:
        return redact(text, self._key, cut=cut)

    def _shown(self, raw: bytes, limit: int) -> str:
        """At most ``limit`` characters of a response body, the key redacted from the whole read before the cut."""
        text = self._redact(raw[:ERROR_BODY_BYTES].decode("utf-8", "replace"), cut=len(raw) > ERROR_BODY_BYTES)
        return text[:limit]

    def _send(self, url: str, body: dict[str, Any] | None = None) -> bytes:
        """One request (POST with a JSON body, GET without). Returns the response's bytes; raises `_Retry`,
        `EndpointError` or `Rejected` (as `_Rejection`)."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as e:
            raise self._http_error(e, url) from None
        except (TimeoutError, socket.timeout) as e:
            raise _Retry("retried_timeout", f"no response in {self.timeout_s:g}s ({e})") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, (TimeoutError, socket.timeout)):
                raise _Retry("retried_timeout", f"no response in {self.timeout_s:g}s") from None
            if isinstance(e.reason, OSError):  # refused, reset, unreachable: the server is down or restarting
                raise _Retry("retried_connection", f"connection failed ({e.reason})") from None
            raise EndpointError(f"endpoint {url} (model {self.model!r}): {self._redact(str(e.reason))}") from None
        except (ConnectionError, HTTPException, OSError) as e:  # dropped mid-response, a body cut short
            raise _Retry("retried_connection", f"connection dropped ({type(e).__name__}: "
                                               f"{self._redact(str(e))[:200]})") from None

    def _post(self, body: dict[str, Any]) -> Generated:
        """One chat completion request. Returns its `Generated`; raises `_Retry`, `_Rejection` or `EndpointError`."""
        raw = self._send(self.url, body)
        try:
            return self._generated(json.loads(raw))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _Retry("retried_bad_answer", "HTTP 200 without a chat completion (is it OpenAI-compatible?): "
                         f"{self._shown(raw, 300)!r}") from None

    def preflight(self) -> str | None:
        """Ask ``GET {base_url}/models`` before anything runs (`PREFLIGHT_TRIES` tries): `EndpointError` for a
        refused key, a model the server does not list, a redirect elsewhere, a server that does not answer. Returns
        the id the server lists the model under; None where the server has no model list (a 404 there)."""
        last = None
        for attempt in range(PREFLIGHT_TRIES):
            try:
                ids = self.check_model(strict=True)
            except _Retry as r:
                last = r.what
                if attempt + 1 < PREFLIGHT_TRIES:
                    time.sleep(min(self.backoff_max_s, self.backoff_s * 2 ** attempt))
                continue
            self._checked = True
            return self.served_model if ids else None
        raise EndpointError(f"endpoint {self.base_url}/models (model {self.model!r}) did not answer in "
                            f"{PREFLIGHT_TRIES} tries: {last}; start the server first (or fix endpoint=)")

    def check_model(self, strict: bool = False) -> list[str] | None:
        """Ask ``GET {base_url}/models``: a refused key fails here, before any prompt is sent, and so does a model
        the server lists no model of that name for (some servers, llama-cpp-python's among them, answer a chat
        request for any name with the model they serve). Returns the listed ids (``served_model`` set to the one
        that matched); None where the server lists none (no such route; not strict: it is down, or its answer is
        unreadable: the requests then find out). ``strict``: `_Retry` where it is down, `EndpointError` for an
        unreadable list."""
        try:
            raw = self._send(self.base_url + "/models")
        except _Retry:
            if strict:
                raise
            return None
        except _Rejection as e:
            if strict:
                raise EndpointError(f"endpoint {self.base_url}/models (model {self.model!r}): HTTP {e.status}: "
                                    f"{e.message}", e.status) from None
            return None
        except EndpointError as e:
            if e.status in (401, 403) or 300 <= (e.status or 0) < 400 or (strict and e.status != 404):
                raise  # a refused key, a redirect elsewhere
            return None
        try:
            ids = [str(m["id"]) for m in json.loads(raw)["data"]]
        except (ValueError, KeyError, TypeError):
            if strict:
                raise EndpointError(f"endpoint {self.base_url}/models (model {self.model!r}) answered 200 without a "
                                    f"model list (is it OpenAI-compatible?): {self._shown(raw, 300)!r}") from None
            return None
        match = [i for i in ids if i == self.model] or [i for i in ids if i.endswith("/" + self.model)]
        if ids and not match:
            shown = ", ".join(ids[:10]) + (f", ... ({len(ids)} in all)" if len(ids) > 10 else "")
            raise EndpointError(f"endpoint {self.base_url}: model {self.model!r} not found (404): the server's model "
                                f"list (GET {self.base_url}/models) has {shown}", 404)
        self.served_model = match[0] if match else None
        return ids

    def _http_error(self, e: urllib.error.HTTPError, url: str) -> Exception:
        detail, raw = "", b""
        try:  # the error body may be unreadable, cut short or not JSON: the status alone is enough
            raw = e.read(ERROR_BODY_BYTES + 1)
            payload = json.loads(raw[:ERROR_BODY_BYTES])
            err = payload.get("error", payload) if isinstance(payload, dict) else payload
            detail = self._redact(str(err.get("message", err) if isinstance(err, dict) else err))
        except Exception:  # noqa: BLE001 - IncompleteRead, a reset, a timeout, bad JSON: keep what was read
            detail = self._shown(raw, ERROR_BODY_BYTES)
        detail = detail.strip()[:500]  # cut after the key is redacted from all of it
        try:
            retry_after = retry_after_seconds(e.headers.get("Retry-After") if e.headers else None)
        except Exception:  # noqa: BLE001 - an unreadable header: the backoff decides
            retry_after = None
        what = f"HTTP {e.code}" + (f": {detail}" if detail else "")
        if e.code == 429:
            return _Retry("retried_429", what, retry_after)
        if e.code >= 500 or e.code == 408:
            return _Retry("retried_5xx" if e.code >= 500 else "retried_timeout", what, retry_after)
        if e.code in REJECTED_STATUSES:
            return _Rejection(e.code, detail)
        where = f"endpoint {url} (model {self.model!r})"
        if e.code in (401, 403):
            key = f"the key in ${self.api_key_env}" if self.api_key_env else "no key (none was given: key_env=VAR)"
            return EndpointError(f"{where}: HTTP {e.code}, {key} was refused: {detail}", e.code)
        if e.code == 404:
            return EndpointError(f"{where}: HTTP 404, no such model or path on this server (check model=NAME, and "
                                 f"that the base URL is what OpenAI clients take, usually ending in /v1): {detail}", 404)
        return EndpointError(f"{where}: HTTP {e.code}: {detail}", e.code)

    def _count(self, outcome: str) -> None:
        with self._lock:
            self.stats[outcome] += 1

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        """The wait before retry ``attempt + 1``: the server's Retry-After, else the jittered backoff."""
        if retry_after is not None:
            return retry_after
        cap = min(self.backoff_max_s, self.backoff_s * 2 ** attempt)
        with self._lock:
            return cap / 2 + self._random.uniform(0, cap / 2)

    def _one(self, index: int, messages: list[dict], abort: threading.Event) -> Generated:
        """One prompt, with its retries."""
        body = self._body(messages)
        waited = 0.0
        for attempt in range(self.max_retries + 1):
            if abort.is_set():
                raise _Abandoned
            try:
                out = self._post(body)
            except _Rejection as r:
                self._count("rejected")
                logger.warning("endpoint %s (model %s): %s refused, HTTP %d: %s%s", self.url, self.model,
                               f"prompt {index}" if index >= 0 else "the probe (a prompt of a few words)", r.status,
                               r.message[:200], f"; written as a row with reason {REJECTED_REASON}" if index >= 0 else "")
                return Rejected(text="", n_tokens=0, prompt_tokens=0, stopped=False, status=r.status,
                                message=r.message)
            except _Retry as r:
                left = self.wait_budget_s - waited
                if attempt == self.max_retries or left <= 0:
                    why = (f"{self.max_retries} retries" if attempt == self.max_retries else
                           f"{waited:.0f}s of waiting (the wait budget is {self.wait_budget_s:g}s)")
                    raise EndpointError(f"endpoint {self.url} (model {self.model!r}): prompt {index} failed after "
                                        f"{why}; last: {r.what}") from None
                self._count(r.kind)
                delay = min(self._delay(attempt, r.retry_after), left)
                with self._lock:
                    self.waits.append((r.kind, delay))
                logger.warning("endpoint %s (model %s): prompt %d: %s; waiting %.1fs for the server (retry %d/%d, "
                               "%.0fs of %gs waited)", self.url, self.model, index, r.what, delay, attempt + 1,
                               self.max_retries, waited, self.wait_budget_s)
                if abort.wait(delay):
                    raise _Abandoned
                waited += delay
                continue
            self._count("ok")
            return out
        raise AssertionError("unreachable")

    def _generated(self, data: dict[str, Any]) -> Generated:
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
        if not isinstance(text, str):
            raise TypeError("content is not text")
        if self.force_prefix and text.startswith(self.force_prefix):
            text = text[len(self.force_prefix):]
        usage = data.get("usage") or {}
        return Generated(text=text, n_tokens=int(usage.get("completion_tokens") or 0),
                         prompt_tokens=int(usage.get("prompt_tokens") or 0),
                         stopped=choice.get("finish_reason") == "stop")

    # ------------------------------------------------------------------------------------------------ the batch
    def generate(self, prompts: list[list[dict]]) -> list[Generated]:
        """Every prompt (a list of chat messages) through the endpoint, ``concurrency`` at a time; input order.
        A refused prompt's result is a `Rejected`; an `EndpointError` carries the answers received (``partial``)."""
        if self._closed:
            raise RuntimeError("EndpointGenerator.generate after close()")
        if not prompts:
            return []
        if not self._checked:
            self.check_model()
            self._checked = True
        prompts = [[{"role": "user", "content": p}] if isinstance(p, str) else list(p) for p in prompts]
        results: list[Generated | None] = [None] * len(prompts)
        errors: list[tuple[int, BaseException]] = []
        abort = threading.Event()
        todo = iter(range(len(prompts)))
        take = threading.Lock()

        def worker() -> None:
            while True:
                with take:
                    index = next(todo, None)
                if index is None:
                    return
                try:
                    results[index] = self._one(index, prompts[index], abort)
                except _Abandoned:
                    self._count("abandoned")
                except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
                    self._count("failed")
                    with take:
                        errors.append((index, e))
                    abort.set()

        threads = [threading.Thread(target=worker, name=f"endpoint-{i}", daemon=True)
                   for i in range(min(self.concurrency, len(prompts)))]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except BaseException:  # interrupted (a signal): requests in flight are left to the daemon threads
            abort.set()
            raise
        if errors:  # the first prompt's error (the others were abandoned or failed the same way)
            error = min(errors, key=lambda e: e[0])[1]
            if not isinstance(error, EndpointError):
                error = EndpointError(f"endpoint {self.url} (model {self.model!r}): "
                                      f"{type(error).__name__}: {self._redact(str(error))[:300]}")
            error.partial = list(results)
            raise error
        refused = self._refused_request(results, prompts[0])
        if refused is not None:
            raise refused
        return results  # type: ignore[return-value]

    def _refused_request(self, results: list, messages: list[dict]) -> RequestRefused | None:
        """A `RequestRefused` when nothing was ever answered and every result here is a refusal with the same status
        and message (two at least, or one and `PROBE` refused alike); it names the request's option the message names
        and the judgetrain option that sets it. None otherwise (a prompt refused among answered ones stays its row)."""
        if self.stats["ok"] or not results or not all(isinstance(r, Rejected) for r in results):
            return None
        if len({(r.status, r.message) for r in results}) != 1:
            return None
        status, message = results[0].status, results[0].message
        if len(results) == 1:  # one prompt cannot tell the request from the prompt: a prompt of a few words can
            if self._probed:
                return None
            self._probed = True
            probe = self._one(-1, PROBE, threading.Event())
            if not isinstance(probe, Rejected) or (probe.status, probe.message) != (status, message):
                return None
        sent = self._body(messages)
        named = [k for k in REQUEST_OPTIONS if k in sent and re.search(rf"\b{k}\b", message)]
        option = (f"; the option it names: {named[0]}={json.dumps(sent[named[0]])}"
                  + (f" (judgetrain's {REQUEST_OPTIONS[named[0]]})" if REQUEST_OPTIONS[named[0]] else "")
                  if named else "; an option of the request it does not take? (sent: "
                  + ", ".join(f"{k}={json.dumps(v)}" for k, v in sent.items() if k not in ("model", "messages")) + ")")
        which = f"all of the first {len(results)} prompts" if len(results) > 1 else \
            "the first prompt and a prompt of a few words"
        return RequestRefused(f"endpoint {self.url} (model {self.model!r}) refused {which} alike, HTTP {status}: "
                              f"{message!r}: the request is refused, not a prompt{option}; nothing was written for them: change that option and run the same command",
                              status)

    def close(self) -> None:
        """No more requests (connections are per request: nothing stays open)."""
        self._closed = True


class _Rejection(Exception):
    """A prompt the server refused (`REJECTED_STATUSES`)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message

