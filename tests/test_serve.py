"""`judgetrain serve`: a real server process on localhost (FastAPI + uvicorn) answering real HTTP clients in OpenRLHF's
remote reward format: rewards equal the in-process reward's, concurrent clients batched together, bad input answered
4xx with the reason (the server goes on), the API key asked and never logged, SIGTERM exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from helpers import REPO, free_port

from judgetrain.rewards import JudgeReward

KEY = "s3cret-test-key-0451"
PROMPTS = [f"Question {i}: what is {i} + {i}?\nAnswer: " for i in range(8)]
QUERIES = [p + f"It is {2 * i}." for i, p in enumerate(PROMPTS)]


class Server:
    def __init__(self, judge, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "JUDGETRAIN_SERVE_API_KEY": KEY}
        self.proc = subprocess.Popen([sys.executable, "-m", "judgetrain.cli", "serve", str(judge), "--port",
                                      str(self.port), "--max_texts", "16", "--max_request_bytes", "65536", *extra],
                                     cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.stdout.read()
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                time.sleep(0.5)
        raise AssertionError("judgetrain serve did not answer /health in time")

    def post(self, body, key: str | None = KEY, path: str = "/reward", **kw):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return requests.post(self.url + path, json=body, headers=headers, timeout=300, **kw)

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=120)
        return self.proc.returncode, out


@pytest.fixture(scope="module")
def server(trained_judge):
    s = Server(trained_judge)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def local(trained_judge) -> JudgeReward:
    return JudgeReward.from_folder(str(trained_judge), mode="implicit")


def test_health_shows_the_judge_card(server):
    h = requests.get(server.url + "/health", timeout=30).json()
    assert h["status"] == "ok" and h["mode"] == "implicit"
    assert h["card"]["base"] == "tiny-judge" and h["card"]["adapter"] is True
    figures = {r["figure"]: r for r in h["card"]["against_base"]["rows"]}
    assert {"ci_low", "ci_high", "delta_ci_low", "delta_ci_high", "p_value"} <= set(figures["judgebias/error/accuracy"])
    assert h["limits"]["max_texts"] == 16


def test_openrlhf_request_shape_gets_the_rewards_of_the_reward_function(server, local):
    """What OpenRLHF's remote_rm_fn posts (query = prompt + response, prompts, labels) and reads (rewards)."""
    r = server.post({"query": QUERIES[:4], "prompts": PROMPTS[:4], "labels": ["x"] * 4})
    assert r.status_code == 200, r.text
    got = r.json()["rewards"]
    expected = local(PROMPTS[:4], [q[len(p):] for q, p in zip(QUERIES[:4], PROMPTS[:4])])
    assert len(got) == 4 and all(abs(a - b) <= 1e-3 + 1e-4 * abs(b) for a, b in zip(got, expected)), (got, expected)
    assert server.post({"query": QUERIES[:1]}).json()["rewards"][0] == pytest.approx(local([""], QUERIES[:1])[0],
                                                                                     rel=1e-4, abs=1e-3)


def test_concurrent_clients_are_batched_and_each_gets_its_own_answers(server):
    single = {i: server.post({"query": [QUERIES[i]], "prompts": [PROMPTS[i]]}).json()["rewards"] for i in range(8)}
    before = requests.get(server.url + "/health", timeout=30).json()["batcher"]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: server.post({"query": [QUERIES[i]] * 2, "prompts": [PROMPTS[i]] * 2}),
                                range(8)))
    after = requests.get(server.url + "/health", timeout=30).json()["batcher"]
    for i, a in enumerate(answers):
        assert a.status_code == 200 and a.json()["rewards"] == pytest.approx(single[i] * 2, rel=1e-4, abs=1e-3)
    assert after["requests"] - before["requests"] == 8
    assert after["batches"] - before["batches"] < 8 and after["largest_batch_requests"] > 1, (before, after)


@pytest.mark.parametrize("send, status, says", [
    (dict(data=b"{not json", headers={"Authorization": f"Bearer {KEY}"}), 400, "not JSON"),
    (dict(json={"query": "one text"}), 400, '"query": a list of strings'),
    (dict(json={"queries": ["a"]}), 400, '"query": a list of strings'),
    (dict(json={"query": ["a", "b"], "prompts": ["a"]}), 400, '"prompts": a list of 2 strings'),
    (dict(json={"query": ["hello"], "prompts": ["bye"]}), 400, "query 0 does not start with prompts[0]"),
    (dict(json={"query": ["a"] * 17}), 413, "at most 16 (--max_texts)"),
    (dict(json={"query": ["a" * 70000]}), 413, "over 65536 bytes"),
    (dict(json={"query": ["a"]}, key=None), 401, "API key"),
    (dict(json={"query": ["a"]}, key="wrong"), 401, "API key"),
])
def test_bad_requests_are_refused_with_the_reason_and_the_server_goes_on(server, send, status, says):
    key = send.pop("key", KEY)
    if "data" in send:
        r = requests.post(server.url + "/reward", timeout=60, **send)
    else:
        r = server.post(send["json"], key=key)
    assert r.status_code == status and says in r.json()["error"], (r.status_code, r.text)
    assert server.post({"query": QUERIES[:1]}).status_code == 200


def test_verdict_mode_needs_labels_and_sigterm_exits_0_without_showing_the_key(trained_judge):
    s = Server(trained_judge, "--mode", "verdict")
    try:
        r = s.post({"query": QUERIES[:2], "prompts": PROMPTS[:2]})
        assert r.status_code == 400 and '"labels"' in r.json()["error"]
        r = s.post({"query": QUERIES[:2], "prompts": PROMPTS[:2], "labels": ["It is 0.", "It is 3."]})
        assert r.status_code == 200 and len(r.json()["rewards"]) == 2
    finally:
        code, out = s.stop()
    assert code == 0, out
    assert KEY not in out and "stopped after" in out


def test_a_folder_without_a_model_is_refused_in_one_line(tmp_path, capsys):
    from judgetrain.cli import main

    (tmp_path / "empty").mkdir()
    assert main(["serve", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a folder without a model" in err[0]
