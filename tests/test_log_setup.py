"""One logging set-up (judgetrain.utils.logging.setup_logging) for every entry point: judgetrain's messages at INFO
on the main process and WARNING elsewhere, transformers' errors only and no progress bars off the main process, a
root logger configured by someone else left alone unless forced."""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import judgetrain
from helpers import REPO

PACKAGE = Path(judgetrain.__file__).resolve().parent

PROBE = """
import json, logging, sys
main, quiet, force, handler = (a == "1" for a in sys.argv[1:5])
if handler:
    logging.getLogger().addHandler(logging.NullHandler())
from judgetrain.utils.logging import setup_logging
setup_logging(main, quiet=quiet, force=force)
import datasets, transformers
from huggingface_hub.utils import are_progress_bars_disabled
root = logging.getLogger()
print(json.dumps({"root": root.level, "handlers": [type(h).__name__ for h in root.handlers],
                  "transformers": transformers.utils.logging.get_verbosity(),
                  "bars": [datasets.utils.logging.is_progress_bar_enabled(),
                           transformers.utils.logging.is_progress_bar_enabled(), not are_progress_bars_disabled()]}))
"""

# (main, quiet, force, a handler set up before) -> root level, root handlers, transformers level, progress bars
CASES = {
    "main process": ((1, 0, 0, 0), logging.INFO, ["BarSafeHandler"], logging.WARNING, [True] * 3),
    "other process": ((0, 0, 0, 0), logging.WARNING, ["BarSafeHandler"], logging.ERROR, [False] * 3),
    "bench worker": ((1, 1, 1, 0), logging.WARNING, ["BarSafeHandler"], logging.ERROR, [False] * 3),
    "embedded": ((1, 0, 0, 1), logging.WARNING, ["NullHandler"], logging.WARNING, [True] * 3),
    "training process": ((1, 0, 1, 1), logging.INFO, ["BarSafeHandler"], logging.WARNING, [True] * 3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_setup_logging_levels_bars_and_handlers(case):
    args, root, handlers, transformers_level, bars = CASES[case]
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")}
    out = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    assert json.loads(out.splitlines()[-1]) == {"root": root, "handlers": handlers,
                                                "transformers": transformers_level, "bars": bars}


ENTRY_POINTS = ("judgetrain.train", "judgetrain.cli.train", "judgetrain.cli.eval", "judgetrain.cli.report",
                "judgetrain.cli.data", "judgetrain.cli.pairs", "judgetrain.cli.bench", "judgetrain.bench.workers")
SETTERS = {"basicConfig", "set_verbosity", "set_verbosity_error", "set_verbosity_warning", "set_verbosity_info",
           "disable_progress_bar", "disable_progress_bars"}


def test_every_entry_point_calls_the_one_set_up_and_nothing_else_configures_logging():
    calls: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                calls.setdefault(module, set()).add(name)
    configuring = sorted(m for m, names in calls.items() if names & SETTERS)
    assert configuring == ["judgetrain.utils.logging"]
    assert [m for m in ENTRY_POINTS if "setup_logging" not in calls.get(m, set())] == []
