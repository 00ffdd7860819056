"""The one door every command starts through (judgetrain.run.launch): the command table, two-word names first, and
the child argv a stage's command gets: `accelerate launch` of the command's module with the processes and the
accelerate config asked for, or the console script as a user types it."""

from __future__ import annotations

import importlib
import sys

import pytest

from judgetrain.run.launch import COMMANDS, SEVERAL_PROCESSES, Launch, accelerate_argv, command_argv, find_command


def test_every_command_names_a_module_with_a_main():
    for name, command in COMMANDS.items():
        assert callable(importlib.import_module(command.module).main), name
    assert set(SEVERAL_PROCESSES) <= set(COMMANDS)


@pytest.mark.parametrize("argv, found", [
    (["pairs", "known", "--items", "x"], ("pairs known", ["--items", "x"])),
    (["data", "check"], ("data check", [])),
    (["eval", "--model", "m"], ("eval", ["--model", "m"])),
    (["pairs"], None),
    (["nope", "x"], None),
])
def test_a_command_is_found_by_its_one_or_two_words(argv, found):
    assert find_command(argv) == found


def test_a_stage_on_several_processes_is_launched_with_its_config_and_processes():
    cmd = command_argv(["judge", "--items", "i"], Launch(num_processes=2, accelerate_config="cpu.yaml"))
    assert cmd == [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "cpu.yaml",
                   "--num_processes", "2", "-m", "judgetrain.cli.judge", "--items", "i"]
    # an accelerate config alone (one process) still goes through accelerate launch
    assert command_argv(["eval", "--model", "m"], Launch(accelerate_config="c.yaml"))[-5:] == [
        "c.yaml", "-m", "judgetrain.cli.eval", "--model", "m"]
    # one process, no config, or a command that runs in one process: the console script as a user types it
    assert command_argv(["judge", "--items", "i"], Launch(num_processes=1)) == [
        sys.executable, "-m", "judgetrain.cli", "judge", "--items", "i"]
    assert command_argv(["pairs", "known", "--items", "i"], Launch(num_processes=4))[:4] == [
        sys.executable, "-m", "judgetrain.cli", "pairs"]
    assert accelerate_argv("judgetrain.train", ["r.yaml"], Launch())[-3:] == ["-m", "judgetrain.train", "r.yaml"]
    with pytest.raises(ValueError, match="not a judgetrain command: 'nope'"):
        command_argv(["nope"])
