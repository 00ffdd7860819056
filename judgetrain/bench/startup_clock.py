"""What a start-up bench process runs, by path (``python .../startup_clock.py``, so that no judgetrain module is
imported before the side it times): a clock on every Trainer (wall-clock times of the train loop's begin and of the
first optimizer step's begin and end, with the process's peak resident memory at each, written to CLOCK as JSON),
then one side:

    python startup_clock.py CLOCK MODE judgetrain RECIPE [--key value ...]   # python -m judgetrain.train, as launched
    python startup_clock.py CLOCK MODE trl SPEC                              # a bare TRL DPO script (below)

MODE stop-after-first ends the loop after the first step (its checkpoint is saved: save_steps 1), as a killed run
that a resume picks up; exit-at-first ends the process as the first step begins (a resume's start-up is timed, not
its step). Only the standard library and the libraries each side imports anyway are imported here.
"""

# Late imports: transformers, datasets, peft, trl (inside the functions that use them): each benchmark part loads only
# what it measures, and a timed side's imports are part of what it times.

from __future__ import annotations

import json
import os
import runpy
import sys
import time


def vm_hwm_mb() -> float | None:
    """This process's high-water resident set since its exec (Linux ``VmHWM``), MB; None where /proc has none."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration, ValueError):
        return None


class StepClock:
    """A Trainer callback (duck-typed: transformers is imported by the side being timed, not here): the wall-clock
    times of the train loop's begin and of the first optimizer step's begin and end, with the peak resident memory at
    each, written to ``path``; the other events do nothing."""

    def __init__(self, path: str, stop_after_first: bool, exit_at_first: bool):
        self.path, self.stop_after_first, self.exit_at_first = path, stop_after_first, exit_at_first
        self.times: dict = {}

    def __getattr__(self, name: str):
        if name.startswith("on_"):  # every other Trainer event
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def _mark(self, key: str, state) -> None:
        if key not in self.times and state.is_world_process_zero:
            self.times[key] = time.time()
            self.times[key.replace("_time", "_global_step")] = state.global_step
            self.times[key.replace("_time", "_vm_hwm_mb")] = vm_hwm_mb()
            with open(self.path, "w") as f:
                json.dump(self.times, f)

    def on_train_begin(self, args, state, control, **kwargs):
        self._mark("train_begin_time", state)

    def on_step_begin(self, args, state, control, **kwargs):
        self._mark("first_step_begin_time", state)
        if self.exit_at_first:  # a resume's start-up ends here: the step itself is not what is timed
            os._exit(0)

    def on_step_end(self, args, state, control, **kwargs):
        self._mark("first_step_end_time", state)
        if self.stop_after_first:
            control.should_training_stop = True


def install_clock(path: str, stop_after_first: bool, exit_at_first: bool) -> None:
    """Add a `StepClock` to every Trainer built in this process."""
    import transformers  # the side being timed imports it anyway: here only once the clock goes in

    original = transformers.Trainer.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.add_callback(StepClock(path, stop_after_first, exit_at_first))

    transformers.Trainer.__init__ = init


def bare_trl(spec: dict) -> None:
    """What a user writes from the TRL docs for these parquet rows: read them, decode the JSON message lists,
    DPOTrainer with LoRA (and the validation rows as its eval_dataset, where the spec has them); a resume passes
    resume_from_checkpoint=True."""
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    columns = ("prompt", "chosen", "rejected")
    dataset = load_dataset("parquet", data_files=spec["data"], split="train")
    dataset = dataset.map(lambda b: {c: [json.loads(x) for x in b[c]] for c in columns}, batched=True,
                          num_proc=spec["dpo"].get("dataset_num_proc"),
                          remove_columns=[c for c in dataset.column_names if c not in columns])
    eval_dataset = None
    if spec.get("eval_data"):  # the validation split, as TRL's eval_dataset (tokenised at start like the train rows)
        eval_dataset = load_dataset("parquet", data_files=spec["eval_data"], split="train")
        eval_dataset = eval_dataset.map(lambda b: {c: [json.loads(x) for x in b[c]] for c in columns}, batched=True,
                                        num_proc=spec["dpo"].get("dataset_num_proc"),
                                        remove_columns=[c for c in eval_dataset.column_names if c not in columns])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    args = DPOConfig(**spec["dpo"])
    trainer = DPOTrainer(model=spec["model"], args=args, train_dataset=dataset, eval_dataset=eval_dataset,
                         processing_class=tokenizer,
                         peft_config=LoraConfig(task_type="CAUSAL_LM", **spec["lora"]))
    trainer.train(resume_from_checkpoint=True if spec.get("resume") else None)


def clock_run(argv: list[str]) -> int:
    clock, mode, side, rest = argv[0], argv[1], argv[2], argv[3:]
    install_clock(clock, mode == "stop-after-first", mode == "exit-at-first")
    if side == "trl":
        with open(rest[0]) as f:
            bare_trl(json.load(f))
        return 0
    sys.argv = ["judgetrain.train", *rest]
    try:
        runpy.run_module("judgetrain.train", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # run by path: the bench's own modules (train.py, eval.py, ...) must not shadow anything
    sys.exit(clock_run(sys.argv[1:]))
