"""A SIGTERM'd launch of several processes gives its workers time to save the stop checkpoint: torchrun's agent
SIGKILLs them TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds after passing the signal on (30 by default), which an 8B step
plus its checkpoint outlasts. `judgetrain train` raises that window (judgetrain.run.launch.launch_and_wait).

The slow save is real: a ``sitecustomize`` on the workers' path makes the fsync of a checkpoint's marker take 40 s,
as slow storage under a large checkpoint does, with no hook in judgetrain itself."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO
from judgetrain.run.state import EXIT_PREEMPTED, read_statuses
from test_runstate import small_recipe

SLOW_MARKER = '''
import os, time
_delay = float(os.environ.get("JUDGETRAIN_TEST_SLOW_MARKER") or 0)
if _delay:
    _fsync = os.fsync

    def _slow_fsync(fd):  # storage that takes its time to flush a checkpoint's marker
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if "/checkpoint-" in path and path.endswith("judgetrain_complete.json.tmp"):
            time.sleep(_delay)
            with open(os.environ["JUDGETRAIN_TEST_SLOW_MARKER_LOG"], "a") as log:  # the event the test reads
                log.write(f"{os.getpid()} {path}\n")
        return _fsync(fd)

    os.fsync = _slow_fsync
'''


@pytest.mark.slow
@pytest.mark.extended(reason="waits out a stop checkpoint slower than 30 s on purpose")
def test_a_two_process_stop_checkpoint_slower_than_30_s_still_ends_143_complete(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SLOW_MARKER)
    recipe = small_recipe(tmp_path / "r.yaml", "max_steps: 40\nsave_steps: 100\n")
    run, log = tmp_path / "run", tmp_path / "term.log"
    import os

    slow_log = tmp_path / "slow_fsyncs.log"
    env = {**os.environ, "JUDGETRAIN_TEST_SLOW_MARKER": "40", "JUDGETRAIN_TEST_SLOW_MARKER_LOG": str(slow_log),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))}
    env.pop("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", None)
    wrapper = subprocess.Popen([sys.executable, "-m", "judgetrain.cli", "train", recipe, "--output_dir", str(run),
                                "--accelerate_config", "accelerate_configs/cpu.yaml"],
                               cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").stat().st_size):
        assert wrapper.poll() is None, log.read_text()[-3000:]
        time.sleep(0.05)
    wrapper.send_signal(signal.SIGTERM)
    rc = wrapper.wait(timeout=600)
    text = log.read_text(errors="replace")
    assert rc == EXIT_PREEMPTED, text[-4000:]
    assert slow_log.is_file(), "the slow marker did not run: the stop checkpoint never took longer than 30 s"
    status = read_statuses(run)[-1]
    assert status["status"] == "preempted" and status["exit_code"] == 143
    assert (Path(run) / f"checkpoint-{status['step']}" / "judgetrain_complete.json").is_file()
    import json

    marker = json.loads((Path(run) / f"checkpoint-{status['step']}" / "judgetrain_complete.json").read_text())
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(marker["files"])  # each rank's own, in one marker
    assert set(marker["hash_seconds"]) == {"0", "1"} and marker["verification"] == "sha256"
