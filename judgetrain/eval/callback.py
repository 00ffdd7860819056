"""Per-epoch judge evaluation inside a transformers / TRL Trainer.

    trainer = DPOTrainer(...)
    trainer.add_callback(JudgeEvalCallback([SuiteSpec("rmbench", max_rows=200), SuiteSpec("judgebias")], trainer=trainer))
    trainer.train()

Like TRL's own evaluation callbacks (``WinRateCallback(judge, trainer)``) it is given its trainer: it logs through
``trainer.log`` and scores ``trainer.model`` with ``trainer.accelerator``.

At each epoch end (and every ``every_n_steps`` optimizer steps, and before the first step with ``on_start``) every
process scores its shard of each suite with the same `ScoringEngine` (reference log-probs cached from the first
eval on), the results are gathered, and the metrics are logged with ``trainer.log`` under ``eval_<suite>/...``
keys: transformers' report_to callbacks (and the run's metrics.jsonl writer) apply ``rewrite_logs``, which turns
them into the names ``eval/<suite>/...`` (a key already spelled ``eval/...`` would become ``train/eval/...``). The
main process writes ``<output_dir>/eval/<step>/``: per-row scores ``<suite>.jsonl`` and ``results.json``, the same
files `judgetrain eval` writes (`judgetrain.eval.runner.evaluate_and_write`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from judgetrain.compat.transformers import log_without_overrides
from judgetrain.eval.runner import evaluate_and_write
from judgetrain.eval.scoring import ScoringEngine
from judgetrain.eval.suites import SuiteSpec
from judgetrain.eval.metrics import to_trainer_log_keys

logger = logging.getLogger(__name__)


class JudgeEvalCallback(TrainerCallback):
    """Score eval suites during training and log them through the trainer.

    Args:
        suites: the suites (`SuiteSpec`), or suite names (bundled sources).
        tokenizer: the tokenizer (default: the trainer's processing_class, read at `attach`).
        scoring: ``implicit`` (DPO implicit reward; reference = adapter disabled, or the trainer's ref_model) or
            ``judge`` (expected overall score).
        every_n_steps: also evaluate every N optimizer steps (0: epoch ends only).
        on_start: evaluate once before the first step (the baseline, logged at step 0).
        max_length, long_inputs, batch_tokens, generate_samples, prefix_sharing: passed to `ScoringEngine`.
        output_dir: where ``eval/<step>/`` goes (default: the trainer's ``args.output_dir``).
        ref_model: explicit reference for implicit scoring of a model without adapter (default: trainer.ref_model).
        trainer: the trainer (or call `attach` once it is built); add the callback with ``trainer.add_callback``.
        log_matrix_images: also log the RM-Bench 3x3 heatmaps as images to the active W&B / TensorBoard callbacks.
    """

    def __init__(
        self,
        suites: list[SuiteSpec | str],
        *,
        tokenizer: Any = None,
        scoring: str = "implicit",
        every_n_steps: int = 0,
        on_start: bool = False,
        max_length: int | None = None,
        long_inputs: str = "truncate_prompt",
        batch_tokens: int = 8192,
        generate_samples: int = 0,
        prefix_sharing: bool = True,
        output_dir: str | None = None,
        ref_model: Any = None,
        trainer: Any = None,
        log_matrix_images: bool = False,
    ) -> None:
        self.suites = [s if isinstance(s, SuiteSpec) else SuiteSpec(s) for s in suites]
        self.tokenizer = tokenizer
        self.scoring = scoring
        self.every_n_steps = int(every_n_steps or 0)
        self.on_start = on_start
        self.engine_kwargs = dict(scoring=scoring, max_length=max_length, long_inputs=long_inputs,
                                  batch_tokens=batch_tokens, generate_samples=generate_samples,
                                  prefix_sharing=prefix_sharing)
        self.output_dir = output_dir
        self.ref_model = ref_model
        self.log_matrix_images = log_matrix_images
        self.trainer = None
        self.engine: ScoringEngine | None = None
        self.last_step: int | None = None
        self.history: list[dict[str, float]] = []  # flat metrics of every eval, in order (handy in tests)
        if trainer is not None:
            self.attach(trainer)

    @classmethod
    def from_recipe(cls, script_args: Any, training_args: Any, tokenizer: Any, *, trainer: Any = None) -> JudgeEvalCallback:
        """Build from judgetrain's recipe dataclasses (JudgeTrainArguments, DPOConfig, ModelConfig)."""
        sources = {
            "rmbench": script_args.eval_rmbench_source,
            "judgebias": script_args.eval_judgebias_source,
            "ideation": script_args.eval_ideation_source,
        }
        ideation_mode = "implicit"
        for comp in getattr(script_args, "train_datasets", None) or []:
            if comp.get("dataset") == "ideation" and comp.get("mode"):
                ideation_mode = comp["mode"]  # evaluate in the format the judge is trained on
        suites = [
            SuiteSpec(name, source=sources[name], max_rows=script_args.eval_max_rows,
                      seed=getattr(training_args, "seed", 0) or 0, mode=ideation_mode if name == "ideation" else "implicit")
            for name in script_args.eval_suites
        ]
        return cls(
            suites,
            tokenizer=tokenizer,
            scoring=script_args.eval_scoring,
            every_n_steps=script_args.eval_every_n_steps,
            on_start=script_args.eval_suites_on_start,
            max_length=getattr(training_args, "max_length", None),
            long_inputs="skip" if getattr(script_args, "long_rows", "") == "skip" else "truncate_prompt",
            batch_tokens=script_args.eval_batch_tokens,
            prefix_sharing=getattr(script_args, "eval_prefix_sharing", True),
            output_dir=training_args.output_dir,
            log_matrix_images=getattr(script_args, "log_matrix_images", False),
            trainer=trainer,
        )

    def attach(self, trainer: Any) -> JudgeEvalCallback:
        """Give the callback its trainer (for trainer.log, the accelerator and the reference model)."""
        self.trainer = trainer
        if self.tokenizer is None:
            self.tokenizer = getattr(trainer, "processing_class", None)
        if self.output_dir is None:
            self.output_dir = trainer.args.output_dir
        return self

    # ---------------------------------------------------------------------------------------------- events
    def on_train_begin(self, args, state, control, **kwargs):
        if self.on_start and state.global_step == 0:
            self.run(state)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.every_n_steps and state.global_step % self.every_n_steps == 0:
            self.run(state)
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        self.run(state)
        return control

    # ---------------------------------------------------------------------------------------------- eval
    def _model(self):
        trainer = self.trainer
        return trainer.accelerator.unwrap_model(trainer.model)

    def _reference(self, model):
        if self.ref_model is not None:
            return self.ref_model
        if hasattr(model, "disable_adapter") and getattr(model, "peft_config", None):
            return None  # same weights, adapter disabled
        ref = getattr(self.trainer, "ref_model", None)
        return self.trainer.accelerator.unwrap_model(ref) if ref is not None else None

    def _log(self, logs: dict[str, float]) -> None:
        # Logging resets control.should_log (CallbackHandler.on_log): an eval run from on_step_end on a logging step
        # would swallow that step's train record (merged into the next one). Keep the flag as the step set it.
        control = getattr(self.trainer, "control", None)
        should_log = getattr(control, "should_log", None)
        # transformers.Trainer.log, not the trainer's override: TRL's DPOTrainer.log merges (and clears) its pending
        # train-mode reward metrics into whatever it logs, which would move them into this eval event.
        log_without_overrides(self.trainer, logs)
        if should_log is not None and getattr(self.trainer, "control", None) is not None:
            self.trainer.control.should_log = should_log

    def run(self, state: Any) -> dict[str, float]:
        """Evaluate now (all processes), log and write the per-row scores. Returns the flat metrics."""
        if self.trainer is None:
            raise RuntimeError("JudgeEvalCallback needs its trainer: JudgeEvalCallback(..., trainer=trainer), or callback.attach(trainer)")
        step = int(state.global_step)
        if self.last_step == step:  # already evaluated at this step (epoch end on an every_n_steps step)
            return self.history[-1] if self.history else {}
        self.last_step = step
        from accelerate import PartialState

        logger.info("Evaluating %s at step %d", ", ".join(s.name for s in self.suites), step)

        model = self._model()
        if self.engine is None:
            self.engine = ScoringEngine(model, self.tokenizer, ref_model=self._reference(model), **self.engine_kwargs)
        else:
            self.engine.set_model(model)
        out = Path(self.output_dir) / "eval" / str(step)
        results, summary = evaluate_and_write(self.engine, self.suites, out, state=PartialState(), step=step,
                                              epoch=state.epoch)
        flat = summary["metrics"]
        self.history.append(flat)
        self._log(to_trainer_log_keys(flat))
        if self.log_matrix_images and "rmbench" in results and self.trainer.is_world_process_zero():
            from judgetrain.eval.metrics import rmbench_matrices
            from judgetrain.report.plots import log_matrix_images

            log_matrix_images(self.trainer, rmbench_matrices(results["rmbench"].records), step)
        return flat
