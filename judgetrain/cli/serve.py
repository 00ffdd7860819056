"""`judgetrain serve`: a trained judge as a reward over HTTP, in OpenRLHF's remote reward format.

    judgetrain serve runs/quickstart --mode implicit --port 8000
    curl -s localhost:8000/reward -d '{"query": ["Q: 2+2?\\nA: 4"], "prompts": ["Q: 2+2?\\nA: "]}'
    # -> {"rewards": [1.73]}
    curl -s localhost:8000/health             # alive; with the API key: the judge's card, the limits, the counts

``POST /reward`` (also ``/`` and ``/get_reward``, the paths OpenRLHF's ``--remote_rm_url`` examples use) takes
``{"query": [...], "prompts": [...], "labels": [...]}``: ``query`` the texts (OpenRLHF sends prompt + response),
``prompts`` optional (each query must start with its prompt: the rest is the completion scored; without them a query
is scored whole as the completion of an empty prompt), ``labels`` the reference answers, needed in ``--mode verdict``.
It answers ``{"rewards": [...]}``, one number per query (null: left unscored, over the length limit with the recipe's
``long_rows: skip``). The reward is `judgetrain.rewards.JudgeReward` (its modes, lengths and counts), and requests
of concurrent clients are scored together, at most ``--max_batch_texts`` texts a call (`judgetrain.rewards.batcher`).

Bad input is answered, never a crash, and harms no other request: 400 with the reason (not JSON or nested too deep, a
field of the wrong shape, text that is not valid Unicode, a query that does not start with its prompt, verdict mode
without labels), 401 without the API key when one is set, 413 over ``--max_request_bytes`` or ``--max_texts``; 500
only when the judge fails on texts that passed the checks (that request alone: a failed batch is scored again request
by request). The API key is read from the environment variable ``--api_key_env`` names (default
``JUDGETRAIN_SERVE_API_KEY``; unset or empty: no key asked) and sent as ``Authorization: Bearer KEY``; it is never
logged. ``GET /health`` without a key answers that the server is up; with it, the card, the limits and the counts.
SIGTERM (or Ctrl-C) stops it gracefully: requests in flight are answered, then it exits 0.
"""

# Late imports: fastapi, starlette, uvicorn, judgetrain.rewards (inside `openrlhf_texts`, `build_app`, `RewardRoutes`,
# `_refuse` and `main`): `judgetrain --help` and a refused option answer without the server stack or torch.

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import signal
import sys
from collections import Counter
from typing import Any

from judgetrain.cli.args import ConventionParser
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.logging import setup_logging

logger = logging.getLogger(__name__)

API_KEY_ENV = "JUDGETRAIN_SERVE_API_KEY"
REWARD_PATHS = ("/reward", "/get_reward", "/")
CLIENT_GONE = 499  # counted, never sent: the client closed its connection before its body arrived


def build_parser() -> ConventionParser:
    p = ConventionParser(prog="judgetrain serve", description=__doc__.split("\n\n")[0],
                         epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("judge", help="the judge: a run's output_dir, an adapter or model folder, an alias, or a hub id")
    p.add_argument("--mode", choices=("implicit", "judge", "verdict"), default="implicit",
                   help="implicit: DPO implicit reward against the base; judge: expected score of the rubric prompt; "
                        "verdict: against the labels, both orders averaged")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api_key_env", default=API_KEY_ENV,
                   help=f"environment variable holding the API key (default {API_KEY_ENV}; unset: no key asked)")
    p.add_argument("--max_request_bytes", type=int, default=8 << 20, help="largest request body (default 8 MiB)")
    p.add_argument("--max_texts", type=int, default=1024, help="most queries in one request (default 1024)")
    p.add_argument("--max_batch_texts", type=int, default=256,
                   help="most queries scored in one call, across the requests of concurrent clients (default 256)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
    p.add_argument("--device", default=None, help="where the judge runs (default: where it loads)")
    p.add_argument("--batch_tokens", type=int, default=8192, help="padded-token budget of one scoring forward")
    p.add_argument("--trust_remote_code", action="store_true",
                   help="allow the model's own Python code (off by default)")
    return p


def openrlhf_texts(body: Any, mode: str) -> tuple[list[str], list[str], list[str] | None]:
    """(prompts, completions, references) of an OpenRLHF request body; BadInputError naming the field otherwise."""
    from judgetrain.rewards.reward import unencodable

    if not isinstance(body, dict):
        raise BadInputError('the body: a JSON object {"query": [...]} (optional "prompts", "labels")')
    query = body.get("query")
    if not isinstance(query, list) or not all(isinstance(q, str) for q in query):
        raise BadInputError('"query": a list of strings')
    lists = {"query": query}
    for name in ("prompts", "labels"):
        value = body.get(name)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)
                                  or len(value) != len(query)):
            raise BadInputError(f'"{name}": a list of {len(query)} strings, one per query')
        lists[name] = value
    for name, values in lists.items():
        for i, why in enumerate(map(unencodable, values or [])):
            if why:
                raise BadInputError(f'"{name}" {i}: {why}')
    prompts = lists["prompts"] or [""] * len(query)
    for i, (q, p) in enumerate(zip(query, prompts)):
        if not q.startswith(p):
            raise BadInputError(f'query {i} does not start with prompts[{i}]: send the prompt + response as the query')
    completions = [q[len(p):] for q, p in zip(query, prompts)]
    if mode == "verdict" and lists["labels"] is None:
        raise BadInputError('--mode verdict: "labels" (the reference answers, one per query) is needed')
    return prompts, completions, lists["labels"] if mode == "verdict" else None


def _key_refused(request: Any, api_key: str | None) -> bool:
    if not api_key:
        return False
    sent = request.headers.get("authorization", "")
    token = sent[7:] if sent.lower().startswith("bearer ") else ""
    return not hmac.compare_digest(token.encode(), api_key.encode())


async def _read_body(request: Any, limit: int) -> bytes | None:
    """The body, or None when it is over ``limit`` bytes (said by its Content-Length or found while reading)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def build_app(reward: Any, batcher: Any, *, api_key: str | None, max_request_bytes: int, max_texts: int):
    """The FastAPI app: the reward routes and /health (`RewardRoutes`), the batcher started and stopped with the app."""
    from fastapi import FastAPI

    routes = RewardRoutes(reward, batcher, api_key=api_key, max_request_bytes=max_request_bytes, max_texts=max_texts)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        yield
        await batcher.stop()
        logger.info("judgetrain serve: stopped after %d requests (%s)", sum(routes.answers.values()),
                    routes.answers_line())

    app = FastAPI(title="judgetrain serve", lifespan=lifespan)
    for path in REWARD_PATHS:
        app.add_route(path, routes.score, methods=["POST"])
    app.add_route("/health", routes.health, methods=["GET"])
    return app


class RewardRoutes:
    """``POST /reward`` and ``GET /health`` as plain Starlette routes: each body read, bounded and checked here, and
    every answer counted by its status (``answers``; ``CLIENT_GONE`` for a client that left before its body came)."""

    def __init__(self, reward: Any, batcher: Any, *, api_key: str | None, max_request_bytes: int,
                 max_texts: int) -> None:
        self.reward, self.batcher, self.api_key = reward, batcher, api_key
        self.limits = {"max_request_bytes": max_request_bytes, "max_texts": max_texts,
                       "max_batch_texts": batcher.max_batch_texts}
        self.answers: Counter[int] = Counter()

    def answers_line(self) -> str:
        return ", ".join(f"{status}: {n}" for status, n in sorted(self.answers.items())) or "none"

    async def score(self, request: Any) -> Any:
        response = await self._score(request)
        self.answers[response.status_code] += 1
        return response

    async def health(self, request: Any) -> Any:
        """Liveness to anyone; the card, the limits and the counts only with the key (when one is set)."""
        from fastapi.responses import JSONResponse

        if self.api_key and "authorization" not in request.headers:
            return JSONResponse({"status": "ok", "detail": "the judge's card, the limits and the counts need the API "
                                                           "key (Authorization: Bearer KEY)"})
        if _key_refused(request, self.api_key):
            return _refuse(401, "wrong API key (Authorization: Bearer KEY)")
        return JSONResponse({"status": "ok", "mode": self.reward.mode, "card": self.reward.card.as_dict(),
                             "limits": self.limits, "answers": {str(k): v for k, v in sorted(self.answers.items())},
                             "batcher": self.batcher.stats.as_dict(), "reward": self.reward.totals.as_dict()})

    async def _score(self, request: Any) -> Any:
        from fastapi.responses import JSONResponse
        from starlette.requests import ClientDisconnect

        if _key_refused(request, self.api_key):
            return _refuse(401, "missing or wrong API key (Authorization: Bearer KEY)")
        limit = self.limits["max_request_bytes"]
        try:
            raw = await _read_body(request, limit)
        except ClientDisconnect:
            logger.info("judgetrain serve: a client left before its request body arrived")
            return _refuse(CLIENT_GONE, "the client closed the connection before its body arrived")
        if raw is None:
            return _refuse(413, f"request body over {limit} bytes (--max_request_bytes)")
        try:
            body = json.loads(raw)
        except RecursionError:
            return _refuse(400, "the body is JSON nested too deep to read (arrays or objects within each other)")
        except ValueError as err:
            return _refuse(400, f"the body is not JSON: {err}")
        try:
            prompts, completions, references = openrlhf_texts(body, self.reward.mode)
            if len(completions) > self.limits["max_texts"]:
                return _refuse(413, f"{len(completions)} queries in one request; at most {self.limits['max_texts']} "
                                    "(--max_texts)")
            rewards = await self.batcher.score(prompts, completions, references)
        except BadInputError as err:
            return _refuse(400, str(err))
        except Exception as err:  # noqa: BLE001 - the judge failed on texts that passed the checks: this request only
            logger.error("judgetrain serve: a request failed in the judge: %s: %s", type(err).__name__, err)
            return _refuse(500, f"the judge failed on these texts: {type(err).__name__}: {err}")
        return JSONResponse({"rewards": rewards})


def _refuse(status: int, reason: str) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": reason}, status_code=status)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    from judgetrain.rewards.batcher import RewardBatcher
    from judgetrain.rewards.loading import judge_source
    from judgetrain.rewards.reward import JudgeReward

    for name in ("port", "max_request_bytes", "max_texts", "max_batch_texts", "batch_tokens"):
        if getattr(args, name) < (0 if name == "port" else 1):
            raise BadInputError(f"--{name} must be positive")
    judge_source(args.judge)  # a bad folder refused before any weights load (BadInputError: the entry's one line)
    reward = JudgeReward.from_folder(args.judge, mode=args.mode, dtype=args.dtype, device=args.device,
                                     trust_remote_code=args.trust_remote_code, batch_tokens=args.batch_tokens)
    import uvicorn

    batcher = RewardBatcher(reward, max_batch_texts=args.max_batch_texts)
    api_key = os.environ.get(args.api_key_env) or None
    app = build_app(reward, batcher, api_key=api_key, max_request_bytes=args.max_request_bytes,
                    max_texts=args.max_texts)
    logger.info("judgetrain serve: %s in %s mode on http://%s:%d (POST /reward, GET /health; API key %s)", args.judge,
                args.mode, args.host, args.port, f"from ${args.api_key_env}" if api_key else "not asked")
    # uvicorn stops gracefully on SIGTERM / SIGINT, then raises the signal again to the handler it found: ours, so
    # a requested stop ends with exit code 0 instead of a death by the signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_requested)
    uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info")).run()
    return 0


def _stop_requested(signum: int, frame: Any) -> None:
    """The handler uvicorn hands a stop signal back to once it has shut down: the stop was asked for, nothing left."""
    logger.debug("judgetrain serve: signal %d after shutdown", signum)


if __name__ == "__main__":
    sys.exit(main())
