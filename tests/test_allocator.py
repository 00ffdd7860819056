"""The CPU allocator setting (`judgetrain.utils.allocator`, recipe key ``cpu_allocator``), read from glibc's own
counters (mallinfo2): with ``keep`` a large tensor comes from the heap and its memory stays there when freed; with
``system`` it is a mapping of its own, unmapped on free. Each case in a fresh process (mallopt's settings last for the
process)."""

from __future__ import annotations

import json
import platform
import sys

import pytest

from helpers import run

PROBE = r"""
import ctypes, json, sys
import torch
from judgetrain.utils.allocator import apply_cpu_allocator


class Mallinfo2(ctypes.Structure):  # glibc >= 2.33
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Mallinfo2
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
    assert parse_recipe([str(recipe)]).script_args.cpu_allocator == "keep"
    assert parse_recipe([str(recipe), "--cpu_allocator", "system"]).script_args.cpu_allocator == "system"
