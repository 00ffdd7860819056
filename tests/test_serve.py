"""`judgetrain serve`: a real server process on localhost (FastAPI + uvicorn) answering real HTTP clients in OpenRLHF's
remote reward format: rewards equal the in-process reward's, concurrent clients batched together and a request split
over calls of at most --max_batch_texts, bad input answered 4xx with the reason while the requests beside it get their
rewards, every answer counted, /health alive without the key and the card only with it, SIGTERM during a batch
answers it and exits 0, a client that leaves mid-request stops nothing. The clients RL trainers run: OpenRLHF's remote
reward client, verl's compute_score file from several threads and processes at once, a TRL GRPO run whose reward is
an HTTP call."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from families import build_family_model
from helpers import REPO, free_port

from judgetrain.rewards import JudgeReward
from judgetrain.rewards.batcher import RewardBatcher

KEY = "s3cret-test-key-0451"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPTS = [f"Question {i}: what is {i} + {i}?\nAnswer: " for i in range(16)]
QUERIES = [p + f"It is {2 * i}." for i, p in enumerate(PROMPTS)]
SURROGATE = {"query": ["\ud800"]}  # valid JSON ("\\ud800"), not text a tokenizer takes


class Server:
    def __init__(self, judge, *extra: str, key: str | None = KEY):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "JUDGETRAIN_SERVE_API_KEY"}
        if key:
            env["JUDGETRAIN_SERVE_API_KEY"] = key
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

    def health(self) -> dict:
        return requests.get(self.url + "/health", headers=AUTH, timeout=30).json()

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=120)
        return self.proc.returncode, out


@pytest.fixture(scope="module")
def server(trained_judge):
    s = Server(trained_judge, "--max_batch_texts", "4")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def local(trained_judge) -> JudgeReward:
    return JudgeReward.from_folder(str(trained_judge), mode="implicit")


def expected(local: JudgeReward, queries: list[str], prompts: list[str]) -> list[float]:
    return local(prompts, [q[len(p):] for q, p in zip(queries, prompts)])


def same(got, want) -> bool:
    return len(got) == len(want) and all(abs(a - b) <= 1e-3 + 1e-4 * abs(b) for a, b in zip(got, want))


def test_health_without_the_key_says_alive_and_the_card_needs_the_key(server):
    bare = requests.get(server.url + "/health", timeout=30)
    assert bare.status_code == 200 and bare.json()["status"] == "ok", bare.text
    assert set(bare.json()) == {"status", "detail"} and "API key" in bare.json()["detail"]
    wrong = requests.get(server.url + "/health", headers={"Authorization": "Bearer nope"}, timeout=30)
    assert wrong.status_code == 401 and "card" not in wrong.json()
    h = server.health()
    assert h["status"] == "ok" and h["mode"] == "implicit"
    assert h["card"]["base"] == "tiny-judge" and h["card"]["adapter"] is True
    figures = {r["figure"]: r for r in h["card"]["against_base"]["rows"]}
    assert {"ci_low", "ci_high", "delta_ci_low", "delta_ci_high", "p_value"} <= set(figures["judgebias/error/accuracy"])
    assert h["limits"] == {"max_request_bytes": 65536, "max_texts": 16, "max_batch_texts": 4}


def test_openrlhf_request_shape_gets_the_rewards_of_the_reward_function(server, local):
    """What OpenRLHF's remote_rm_fn posts (query = prompt + response, prompts, labels) and reads (rewards)."""
    r = server.post({"query": QUERIES[:4], "prompts": PROMPTS[:4], "labels": ["x"] * 4})
    assert r.status_code == 200, r.text
    got, want = r.json()["rewards"], expected(local, QUERIES[:4], PROMPTS[:4])
    assert same(got, want), (got, want)
    assert server.post({"query": QUERIES[:1]}).json()["rewards"][0] == pytest.approx(local([""], QUERIES[:1])[0],
                                                                                     rel=1e-4, abs=1e-3)


def test_concurrent_clients_are_batched_and_each_gets_its_own_answers(server):
    single = {i: server.post({"query": [QUERIES[i]], "prompts": [PROMPTS[i]]}).json()["rewards"] for i in range(8)}
    before = server.health()["batcher"]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: server.post({"query": [QUERIES[i]] * 2, "prompts": [PROMPTS[i]] * 2}),
                                range(8)))
    after = server.health()["batcher"]
    for i, a in enumerate(answers):
        assert a.status_code == 200 and a.json()["rewards"] == pytest.approx(single[i] * 2, rel=1e-4, abs=1e-3)
    assert after["requests"] - before["requests"] == 8
    assert after["batches"] - before["batches"] < 8 and after["largest_batch_requests"] > 1, (before, after)


def test_max_batch_texts_is_a_ceiling_a_request_is_split_over_calls(server, local):
    """--max_batch_texts 4: one request of 10 texts is three calls of the judge (4, 4, 2), answered as one."""
    before = server.health()["batcher"]
    r = server.post({"query": QUERIES[:10], "prompts": PROMPTS[:10]})
    after = server.health()["batcher"]
    assert r.status_code == 200 and same(r.json()["rewards"], expected(local, QUERIES[:10], PROMPTS[:10])), r.text
    assert after["batches"] - before["batches"] == 3 and after["texts"] - before["texts"] == 10, (before, after)
    assert after["requests"] - before["requests"] == 1 and after["largest_batch_texts"] == 4


def test_one_bad_request_among_good_ones_fails_alone(server, local):
    """A lone surrogate (valid JSON, no text a tokenizer takes) sent together with 8 good requests, 3 times: it gets a
    400 saying why, each good one its own rewards."""
    want = {i: expected(local, QUERIES[i:i + 2], PROMPTS[i:i + 2]) for i in range(8)}
    for _ in range(3):
        with ThreadPoolExecutor(9) as pool:
            bad = pool.submit(server.post, SURROGATE)
            good = {i: pool.submit(server.post, {"query": QUERIES[i:i + 2], "prompts": PROMPTS[i:i + 2]})
                    for i in range(8)}
        assert bad.result().status_code == 400, bad.result().text
        assert bad.result().json()["error"] == '"query" 0: not valid Unicode text (a lone surrogate \'\\ud800\' at ' \
                                               'character 0)'
        for i, answer in good.items():
            assert answer.result().status_code == 200, answer.result().text
            assert same(answer.result().json()["rewards"], want[i])


def test_a_failed_batch_is_scored_again_request_by_request(local, monkeypatch):
    """Were a text the judge cannot take to get past the checks (taken out here), the batch it is in fails in the
    tokenizer: its requests are scored again one by one, so only that request gets the error, and it is counted
    among the requests answered."""
    import judgetrain.rewards.batcher as batcher_module
    import judgetrain.rewards.reward as reward_module

    for module in (batcher_module, reward_module):
        monkeypatch.setattr(module, "check_inputs", lambda *a: None)
    prompts = [PROMPTS[i:i + 2] for i in range(4)]
    completions = [[q[len(p):] for q, p in zip(QUERIES[i:i + 2], prompts[i])] for i in range(4)]

    async def clients():
        batcher = RewardBatcher(local, max_batch_texts=64, gather_s=0.05)
        await batcher.start()
        jobs = [batcher.score(p, c) for p, c in zip(prompts, completions)]
        got = await asyncio.gather(*jobs[:2], batcher.score([""], ["\ud800"]), *jobs[2:], return_exceptions=True)
        await batcher.stop()
        return got, batcher.stats

    got, stats = asyncio.run(clients())
    assert isinstance(got[2], TypeError), got
    for answer, p, c in zip(got[:2] + got[3:], prompts, completions):
        assert same(answer, local(p, c)), (answer, local(p, c))
    assert stats.failed_batches == 2 and stats.batches == 4, stats  # the batch of 5, then the bad one alone
    assert (stats.requests, stats.failed_requests, stats.pending) == (5, 1, 0), stats


def test_every_answer_is_counted(server):
    """/health counts each answer of the reward routes by status, refused ones included; the batcher counts the
    requests it scored."""
    before = server.health()
    assert server.post({"query": QUERIES[:1]}).status_code == 200
    assert server.post(SURROGATE).status_code == 400
    assert server.post({"query": "one"}).status_code == 400
    assert server.post({"query": QUERIES[:1]}, key=None).status_code == 401
    assert server.post({"query": ["a"] * 17}).status_code == 413
    after = server.health()
    grew = {k: after["answers"].get(k, 0) - before["answers"].get(k, 0) for k in after["answers"]}
    assert {k: v for k, v in grew.items() if v} == {"200": 1, "400": 2, "401": 1, "413": 1}, (before, after)
    assert after["batcher"]["requests"] - before["batcher"]["requests"] == 1


@pytest.mark.parametrize("send, status, says", [
    (dict(data=b"{not json", headers=AUTH), 400, "not JSON"),
    (dict(data=b"[" * 30000 + b"]" * 30000, headers=AUTH), 400, "nested too deep"),
    (dict(json={"query": "one text"}), 400, '"query": a list of strings'),
    (dict(json={"queries": ["a"]}), 400, '"query": a list of strings'),
    (dict(json={"query": ["a", "b"], "prompts": ["a"]}), 400, '"prompts": a list of 2 strings'),
    (dict(json={"query": ["hello"], "prompts": ["bye"]}), 400, "query 0 does not start with prompts[0]"),
    (dict(json={"query": ["a", "b\udfff"], "prompts": ["", "b"]}), 400, '"query" 1: not valid Unicode text'),
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


def raw_request(port: int, body: bytes, *, send: int) -> None:
    """A client that sends the headers and ``send`` bytes of ``body``, then closes the connection unread."""
    head = (f"POST /reward HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + body[:send])


def test_a_client_that_leaves_mid_request_stops_nothing(server, local):
    """One client closes its connection after sending its request, another halfway through its body: both are
    counted (200 scored for no one, 499 for the body that never came), nothing is left pending, and the next client
    gets its rewards."""
    before = server.health()["answers"]
    body = json.dumps({"query": QUERIES[:16], "prompts": PROMPTS[:16]}).encode()
    raw_request(server.port, body, send=len(body))
    raw_request(server.port, body, send=len(body) // 2)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        h = server.health()
        if sum(h["answers"].values()) - sum(before.values()) == 2 and h["batcher"]["pending"] == 0:
            break
        time.sleep(0.1)
    assert h["answers"].get("499", 0) - before.get("499", 0) == 1, (before, h["answers"])
    assert h["answers"]["200"] - before["200"] == 1 and h["batcher"]["pending"] == 0, h
    r = server.post({"query": QUERIES[:2], "prompts": PROMPTS[:2]})
    assert r.status_code == 200 and same(r.json()["rewards"], expected(local, QUERIES[:2], PROMPTS[:2]))


def openrlhf_remote_rm_fn(api_url, queries, prompts=None, labels=None, score_key="rewards", try_max_times=5):
    """OpenRLHF's remote reward client (openrlhf/utils/remote_rm_utils.py: request_api_wrapper + remote_rm_fn) as it
    is written there: requests, no API key, a failed request retried after a second, the answer must hold the key."""
    import torch

    data = {"query": queries, "prompts": prompts, "labels": labels}
    headers = {"Content-Type": "application/json"}
    for _ in range(try_max_times):
        try:
            response = requests.post(url=api_url, json=data, headers=headers, timeout=180)
            response.raise_for_status()
            response = response.json()
            assert score_key in response, f"{score_key} not in {response}"
            return torch.tensor(response.get(score_key))
        except requests.RequestException:
            pass
        time.sleep(1)
    raise Exception(f"Request error for {try_max_times} times, returning None. Please check the API server.")


def test_openrlhfs_remote_reward_client(trained_judge, local):
    """OpenRLHF's client (it sends no key: a server without one, as docs/reward.md says) gets the rewards as a
    tensor; a request refused is retried by the client, each try answered 400, and the server goes on."""
    s = Server(trained_judge, key=None)
    try:
        got = openrlhf_remote_rm_fn(s.url + "/reward", QUERIES[:6], PROMPTS[:6])
        assert got.shape == (6,) and same(got.tolist(), expected(local, QUERIES[:6], PROMPTS[:6])), got
        labelled = openrlhf_remote_rm_fn(s.url + "/get_reward", QUERIES[:2], PROMPTS[:2], labels=["4", "2"])
        assert same(labelled.tolist(), got[:2].tolist())
        with pytest.raises(Exception, match="Request error for 2 times"):
            openrlhf_remote_rm_fn(s.url + "/reward", ["hello"], ["bye"], try_max_times=2)
        assert s.health()["answers"] == {"200": 2, "400": 2}
        assert openrlhf_remote_rm_fn(s.url + "/", QUERIES[:1]).shape == (1,)
    finally:
        code, out = s.stop()
    assert code == 0 and "stopped after 5 requests (200: 3, 400: 2)" in out, out


def verl_reward_file(tmp_path) -> str:
    """The compute_score file docs/reward.md gives for verl, as written there."""
    doc = (REPO / "docs" / "reward.md").read_text(encoding="utf-8")
    code = next(block for block in re.findall(r"```python\n(.*?)```", doc, re.S) if "def compute_score" in block)
    path = tmp_path / "judge_reward.py"
    path.write_text(code, encoding="utf-8")
    return str(path)


def test_verls_compute_score_file_from_threads_and_processes_at_once(server, local, tmp_path, monkeypatch):
    """The docs' verl file, loaded as verl loads a custom_reward_function (a module from its path), called from 8
    threads at once and from 3 worker processes at once: each gets the reward of its own text."""
    monkeypatch.setenv("JUDGETRAIN_SERVE_URL", server.url + "/reward")
    monkeypatch.setenv("JUDGETRAIN_SERVE_API_KEY", KEY)
    path = verl_reward_file(tmp_path)
    spec = importlib.util.spec_from_file_location("custom_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    answers = [q[len(p):] for q, p in zip(QUERIES, PROMPTS)]
    want = local(PROMPTS[:8], answers[:8])
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: module.compute_score("math", answers[i], "x", {"question": PROMPTS[i]}),
                            range(8)))
    assert all(isinstance(g, float) for g in got) and same(got, want), (got, want)
    worker = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('custom_module', sys.argv[1]);"
              " m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m);"
              " print(m.compute_score('math', sys.argv[3], 'x', {'question': sys.argv[2]}))")
    procs = [subprocess.Popen([sys.executable, "-c", worker, path, PROMPTS[i], answers[i]], stdout=subprocess.PIPE,
                              text=True, env=os.environ.copy()) for i in range(3)]
    outs = [float(p.communicate(timeout=300)[0]) for p in procs]
    assert same(outs, want[:3]), (outs, want[:3])


@pytest.mark.slow  # two steps of a real trainer
def test_a_grpo_run_whose_reward_is_an_http_call(server, local, tiny_judge, tmp_path):
    """TRL's GRPOTrainer with one reward function, a POST to `judgetrain serve`: the rewards it logs are the in-process
    reward's of the same texts, one request per generation batch."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def served_judge(prompts, completions, **kwargs):
        r = requests.post(server.url + "/reward", headers=AUTH, timeout=300,
                          json={"query": [p + c for p, c in zip(prompts, completions)], "prompts": prompts})
        r.raise_for_status()
        return r.json()["rewards"]

    policy = build_family_model("qwen3", tiny_judge, tmp_path / "policy")
    data = Dataset.from_list([{"prompt": f"Question: {q}\nAnswer:"} for q in ("How do I boil an egg?",
                                                                              "Name a prime above 10.")])
    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=12, max_steps=2, logging_steps=1, report_to="none", beta=0.0,
                      learning_rate=1e-4, save_strategy="no", seed=0, use_cpu=True)
    before = server.health()["answers"].get("200", 0)
    trainer = GRPOTrainer(model=policy, reward_funcs=served_judge, args=args, train_dataset=data)
    trainer.train()
    assert server.health()["answers"]["200"] - before == 2
    prompts, completions = list(trainer._logs["prompt"]), list(trainer._logs["completion"])
    logged = list(trainer._logs["rewards"]["served_judge"])
    assert len(logged) == 8 and same(logged, local(prompts, completions)), logged
    assert len(set(round(x, 3) for x in logged)) > 1
    history = [h for h in trainer.state.log_history if "rewards/served_judge/mean" in h]
    assert len(history) == 2 and history[-1]["rewards/served_judge/mean"] == pytest.approx(sum(logged) / 8, abs=1e-3)


def test_verdict_mode_needs_labels_and_sigterm_during_a_batch_answers_it_and_exits_0(trained_judge):
    """SIGTERM while a request of 16 verdict texts is taken and not answered: it is answered in full, the server
    exits 0, its last line counts every request, and the key is never shown."""
    s = Server(trained_judge, "--mode", "verdict")
    try:
        r = s.post({"query": QUERIES[:2], "prompts": PROMPTS[:2]})
        assert r.status_code == 400 and '"labels"' in r.json()["error"]
        r = s.post({"query": QUERIES[:2], "prompts": PROMPTS[:2], "labels": ["It is 0.", "It is 3."]})
        assert r.status_code == 200 and len(r.json()["rewards"]) == 2
        answered: list = []
        for _ in range(5):  # until the signal meets the request in flight (it may be answered before a look)
            labels = [f"It is {j} and a long explanation follows. " * 40 for j in range(16)]
            client = threading.Thread(target=lambda: answered.append(
                s.post({"query": QUERIES[:16], "prompts": PROMPTS[:16], "labels": labels})))
            client.start()
            while client.is_alive() and s.health()["batcher"]["pending"] == 0:
                pass
            if client.is_alive():
                s.proc.send_signal(signal.SIGTERM)
                client.join()
                break
            client.join()
        assert s.proc.wait(timeout=120) == 0
        assert answered[-1].status_code == 200 and len(answered[-1].json()["rewards"]) == 16
    finally:
        code, out = s.stop()
    assert code == 0, out
    n = 2 + len(answered)
    assert KEY not in out and f"stopped after {n} requests (200: {n - 1}, 400: 1)" in out, out


def test_a_folder_without_a_model_is_refused_in_one_line(tmp_path, capsys):
    from judgetrain.cli import main

    (tmp_path / "empty").mkdir()
    assert main(["serve", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a folder without a model" in err[0]
