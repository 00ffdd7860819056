"""Which machine a process is on: one helper (`judgetrain.utils.machines.machine_placement`) for the rows folders,
the checkpoint markers and the parallelism report, gathered once per process and remembered."""

import subprocess
import sys

from helpers import REPO

ONCE = """
import sys, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
from accelerate import PartialState
from judgetrain.data.prepare import machine_folder
from judgetrain.run.checkpoints import _world
from judgetrain.utils.machines import machine_placement
first = machine_placement(rank, 2, rank)  # both ranks on one machine (local rank = rank): a collective, once
if rank == 0:  # rank 1 asks nothing more: a second collective here would wait for it forever
    again = [machine_placement(0, 2, 0) for _ in range(3)]
    print(first, again[-1], _world()[3], machine_folder(PartialState()), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def test_the_machine_is_gathered_once_and_every_user_reads_the_same_answer(tmp_path):
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, "-c", ONCE, str(r), str(store)], stdout=subprocess.PIPE, cwd=REPO,
                              env={**__import__("os").environ, "LOCAL_RANK": str(r), "RANK": str(r),
                                   "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
             for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0].decode().strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs[0].splitlines()[-1] == "(0, 0, 1) (0, 0, 1) 0 node-0"


DISK = """
import sys, torch.distributed as dist
from pathlib import Path
rank, root = int(sys.argv[1]), Path(sys.argv[2])
dist.init_process_group("gloo", init_method="file://" + str(root / "store"), rank=rank, world_size=2)
from judgetrain.run.checkpoints import sees_main_folder


class Counting:  # torch.distributed, counting the collectives made through it
    def __init__(self, d):
        self.d, self.calls = d, 0

    def __getattr__(self, name):
        attr = getattr(self.d, name)
        if name not in ("barrier", "all_gather_object", "all_gather", "broadcast_object_list", "all_reduce", "broadcast"):
            return attr
        def counted(*a, **k):
            self.calls += 1
            return attr(*a, **k)
        return counted


dist = Counting(dist)
shared = sees_main_folder(root / "one", dist, rank)  # one output_dir for both
own = root / f"own-{rank}"  # each its own (two machine-local disks)
own.mkdir()
local = sees_main_folder(own, dist, rank)
first = dist.calls
again = [sees_main_folder(root / "one", dist, rank), sees_main_folder(own, dist, rank)]  # remembered: no collective
remembered = first > 0 and dist.calls == first  # no collective the second time
dist.barrier()  # the main process has removed its probes
print(shared, local, again, remembered, sorted(p.name for p in root.rglob(".judgetrain-probe-*")))
dist.destroy_process_group()
"""


def test_the_shared_disk_is_decided_once_per_folder_and_remembered(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", DISK, str(r), str(tmp_path)], stdout=subprocess.PIPE, cwd=REPO)
             for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0].decode().strip().splitlines()[-1] for p in procs]
    assert outs == ["True True [True, True] True []", "True False [True, False] True []"]
