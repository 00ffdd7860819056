"""A hub that answers is not an offline hub: a mistyped id is refused by the dry run with the hub's own error, and only a
hub that cannot be asked (offline mode, nothing listening) makes the dry run audit the bundled samples in its place.
The hub here is a real HTTP server on localhost answering as the Hugging Face hub does (status, X-Error-Code)."""

from __future__ import annotations

import http.server
import json
import sys
import threading

import pytest

from helpers import REPO, free_port, run

# repository name -> (status, X-Error-Code) the stand-in hub answers for every file of it
ANSWERS = {"gated": (403, "GatedRepo"), "revision": (404, "RevisionNotFound")}


class _Hub(http.server.BaseHTTPRequestHandler):
    requests: list = []

    def _answer(self):
        type(self).requests.append(self.path)
        status, code = next((a for name, a in ANSWERS.items() if f"/{name}" in self.path), (404, "RepoNotFound"))
        body = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Hub.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _online_env(tmp_path, endpoint: str) -> dict:
    online = {name: "0" for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return {**online, "HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}


def _recipe(tmp_path, source: str):
    path = tmp_path / "recipe.yaml"
    path.write_text("model_name_or_path: tiny-judge\nbf16: false\nreport_to: none\neval_suites: [judgebias]\n"
                    "train_datasets:\n"
                    f"  - {{dataset: judgebias, source: {source}, split: train}}\n"
                    "  - {dataset: ideation, source: bundled, split: train, mode: pairwise}\n")
    return path


def _dry_run(tmp_path, source: str, env: dict):
    return run([sys.executable, "-m", "judgetrain.cli", "train", _recipe(tmp_path, source), "--dry-run",
                "--output_dir", tmp_path / "out", "--audit_rows", "4"], env=env, check=False, timeout=600,
               cwd=REPO)


@pytest.mark.slow  # a dry run in a fresh process, online (the hub's settings are read when it is imported): ~15 s CPU
def test_a_mistyped_hub_id_is_refused_with_the_hubs_error(tmp_path, hub):
    proc = _dry_run(tmp_path, "iknow-lab/JudgeBias-DPO-RefFre", _online_env(tmp_path, hub))
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert any("iknow-lab/JudgeBias-DPO-RefFre" in path for path in _Hub.requests)  # the hub was asked
    assert ("train_datasets[0].source iknow-lab/JudgeBias-DPO-RefFre: the hub refused it (DatasetNotFoundError: "
            "Dataset 'iknow-lab/JudgeBias-DPO-RefFre' doesn't exist on the Hub") in proc.stderr, proc.stderr[-3000:]
    assert "audited the bundled samples" not in proc.stdout + proc.stderr


def test_an_offline_hub_still_falls_back_to_the_bundled_samples(tmp_path, monkeypatch):
    from judgetrain.train import run as train_run
    from judgetrain.utils.hub import hub_offline

    assert hub_offline()  # this process runs offline (conftest), as a compute node without network does
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    report = train_run([str(_recipe(tmp_path, "iknow-lab/JudgeBias-DPO-RefFree")), "--dry_run", "--output_dir",
                        str(tmp_path / "out"), "--audit_rows", "4"])
    assert report["rows_audited"] == 12  # judgebias 4 + ideation 4 pairs in both orders, from the bundled samples
    assert report["notes"] == ["a hub source is unreachable (ConnectionError); audited the bundled samples instead"]


@pytest.mark.slow  # huggingface_hub retries a refused connection 5 times with backoff (about 25 s)
def test_an_unreachable_hub_endpoint_still_falls_back(tmp_path):
    proc = _dry_run(tmp_path, "iknow-lab/JudgeBias-DPO-RefFree", _online_env(tmp_path, f"http://127.0.0.1:{free_port()}"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert report["notes"] == ["a hub source is unreachable (ConnectionError); audited the bundled samples instead"]
    assert "iknow-lab/JudgeBias-DPO-RefFree" in proc.stderr


CLASSIFY = """
import json, sys
from huggingface_hub import hf_hub_download
from judgetrain.utils.hub import hub_refusal, hub_unreachable
out = {}
for repo in sys.argv[1:]:
    try:
        hf_hub_download(repo, "config.json", revision="v1" if "revision" in repo else None)
    except Exception as e:
        out[repo] = [type(e).__name__, hub_unreachable(e), type(hub_refusal(e)).__name__]
print(json.dumps(out))
"""


def test_the_hubs_answers_are_refusals_and_its_failures_unreachable(tmp_path, hub):
    repos = ["owner/typo", "owner/gated", "owner/revision"]
    proc = run([sys.executable, "-c", CLASSIFY, *repos], env=_online_env(tmp_path, hub), timeout=300)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"owner/typo": ["RepositoryNotFoundError", False, "RepositoryNotFoundError"],
                   "owner/gated": ["GatedRepoError", False, "GatedRepoError"],
                   "owner/revision": ["RevisionNotFoundError", False, "RevisionNotFoundError"]}, got
    offline = run([sys.executable, "-c", CLASSIFY, "owner/typo"], env={"HF_HUB_OFFLINE": "1",
                                                                      "HF_HOME": str(tmp_path / "hf")})
    assert json.loads(offline.stdout.strip().splitlines()[-1]) == {
        "owner/typo": ["LocalEntryNotFoundError", True, "NoneType"]}


def test_offline_mode_is_read_by_the_hubs_own_rule():
    from judgetrain.utils.hub import hub_offline

    assert hub_offline({"HF_HUB_OFFLINE": "ON"}) and hub_offline({"TRANSFORMERS_OFFLINE": "1"})
    assert not hub_offline({}) and not hub_offline({"HF_HUB_OFFLINE": "0"})
    assert hub_offline() is True  # the test session runs offline (conftest)
