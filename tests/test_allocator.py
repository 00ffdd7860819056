"""The CPU allocator setting (`judgetrain.utils.allocator`, recipe key ``cpu_allocator``), read from glibc's own
counters (mallinfo2): with ``keep`` a large tensor comes from the heap and its memory stays there when freed, and the
guard gives a heap grown past what was in use back to the kernel; with ``system`` (the default) it is a mapping of its
own, unmapped on free. Each case in a fresh process (mallopt's settings last for the process)."""

from __future__ import annotations

import json
import platform
import sys

import pytest

from helpers import run

PROBE = r"""
import json, sys
import torch
from judgetrain.utils.allocator import apply_cpu_allocator, glibc

libc = glibc()
held = apply_cpu_allocator(sys.argv[1], on_cpu=sys.argv[2] == "cpu")
n = 256 << 20  # bytes: far above glibc's largest mmap threshold (32 MiB)
t = torch.empty(n // 4, dtype=torch.float32).fill_(1.0)
alive = libc.mallinfo2()
del t
freed = libc.mallinfo2()
print(json.dumps({"held": held, "mapped_alive": alive.hblkhd, "heap_alive": alive.arena,
                  "mapped_freed": freed.hblkhd, "heap_freed": freed.arena}))
"""

MB = 1 << 20


def _probe(choice: str, device: str = "cpu") -> dict:
    return json.loads(run([sys.executable, "-c", PROBE, choice, device]).stdout.strip().splitlines()[-1])


needs_glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt and mallinfo2")


@needs_glibc
def test_keep_serves_a_large_tensor_from_the_heap_and_keeps_it_there_when_freed():
    keep, system = _probe("keep"), _probe("system")
    assert keep["held"] == "keep" and system["held"] == "system"
    # system: the 256 MB tensor is a mapping of its own, given back to the kernel on free (and faulted in afresh by
    # the next step); keep: it comes from the heap, and the heap keeps it for the next step
    assert system["mapped_alive"] >= 256 * MB and system["mapped_freed"] < 16 * MB
    assert keep["mapped_alive"] < 16 * MB and keep["heap_alive"] >= 256 * MB
    assert keep["heap_freed"] >= 256 * MB


@needs_glibc
def test_a_gpu_process_is_left_as_it_is():
    got = _probe("keep", device="cuda")
    assert got["held"] == "not_cpu"
    assert got["mapped_alive"] >= 256 * MB  # glibc's default: a mapping of its own


def test_the_recipe_key_and_the_eval_flag_refuse_other_values(tmp_path):
    from judgetrain.config.recipe import RecipeError, parse_recipe
    from judgetrain.utils.allocator import apply_cpu_allocator

    with pytest.raises(ValueError, match="cpu_allocator: one of keep, system, got 'fast'"):
        apply_cpu_allocator("fast", on_cpu=True)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model_name_or_path: tiny-judge\noutput_dir: out\ncpu_allocator: fast\n")
    with pytest.raises(RecipeError, match=r"cpu_allocator: 'fast' is not one of \['keep', 'system'\]"):
        parse_recipe([str(recipe)])
    recipe.write_text("model_name_or_path: tiny-judge\noutput_dir: out\n")
    assert parse_recipe([str(recipe)]).script_args.cpu_allocator == "system"
    assert parse_recipe([str(recipe), "--cpu_allocator", "keep"]).script_args.cpu_allocator == "keep"


TRIM_PROBE = r"""
import json, sys, threading
import torch
from judgetrain.utils import allocator

allocator.GUARD_PERIOD_S = 3600  # the guard thread starts but does not sample: the calls below see only what they see
held = allocator.apply_cpu_allocator(sys.argv[1], on_cpu=True)
big = torch.empty((1 << 30) // 4, dtype=torch.float32).fill_(1.0)  # 1 GiB, every page touched
pin = torch.empty((32 << 20) // 4, dtype=torch.float32).fill_(1.0)  # allocated after it, alive
del big  # under keep: a free GiB in the heap, still resident
before = allocator.anonymous_resident_bytes()
kept = allocator.trim_if_grown(free_bytes=2 << 30)  # a GiB free is within 2 GiB of free heap: kept
trimmed = allocator.trim_if_grown(free_bytes=256 << 20)
print(json.dumps({"held": held, "before": before, "kept": kept, "trimmed": trimmed,
                  "after": allocator.anonymous_resident_bytes(), "trims": allocator.heap_trims(),
                  "guard": any(t.name == "judgetrain-heap-guard" for t in threading.enumerate())}))
"""


def _trim_probe(choice: str) -> dict:
    return json.loads(run([sys.executable, "-c", TRIM_PROBE, choice]).stdout.strip().splitlines()[-1])


@needs_glibc
def test_keeps_guard_gives_a_heap_grown_past_what_is_in_use_back_to_the_kernel():
    keep = _trim_probe("keep")
    assert keep["held"] == "keep" and keep["guard"]
    # the freed GiB stayed resident in the heap; a free GiB within the allowance is kept, beyond it it goes back
    assert keep["before"] >= 1024 * MB and not keep["kept"]
    assert keep["trimmed"] and keep["trims"] == 1 and keep["after"] < keep["before"] - 900 * MB
    system = _trim_probe("system")  # the GiB was a mapping of its own, unmapped on free: nothing to give back
    assert system["held"] == "system" and not system["guard"]
    assert system["before"] < 900 * MB and not system["trimmed"] and system["trims"] == 0


def test_the_heaps_limit_keeps_a_steps_peak_and_refuses_what_grew_past_it():
    from judgetrain.utils.allocator import heap_limit

    GB = 10**9
    # a loop's training run with long rows: 14.5 GB at its peak under glibc's default; under keep alone its heap grew
    # to 23 GB and the kernel killed it. The bench's run: 7.6 GB at its peak, 9.0 GB under keep.
    assert 14.5 * GB < heap_limit(14.5 * GB) == 18.125 * GB < 23 * GB
    assert heap_limit(7.6 * GB) == 9.5 * GB > 9.0 * GB
    assert heap_limit(1 * GB) == 1 * GB + 2**30  # a small process keeps a GiB of free heap
