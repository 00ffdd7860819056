"""Judge evaluation inside a transformers / TRL Trainer: the eval suites are what the trainer evaluates.

    trainer = DPOTrainer(...)
    trainer.add_callback(JudgeEvalCallback([SuiteSpec("rmbench", max_rows=200), SuiteSpec("judgebias")], trainer=trainer))
    # or with the options of a recipe's eval keys: JudgeEvalCallback(suites, Evaluation(EvalArguments(...)), ...)
    trainer.train()

Like TRL's own evaluation callbacks (``WinRateCallback(judge, trainer)``) it is given its trainer: it logs through
``trainer.log`` and scores ``trainer.model`` with ``trainer.accelerator``. It answers the trainer's ``evaluate()``
(for this trainer instance): each evaluation Trainer runs scores the suites and returns their metrics, so Trainer's
own schedule and checkpoint selection apply as they would to an eval_dataset: ``eval_strategy`` (steps / epoch),
``eval_steps``, ``eval_on_start``, ``metric_for_best_model`` (``eval_rmbench/total_avg_acc``), ``greater_is_better``,
``load_best_model_at_end``, ``save_strategy="best"``, EarlyStoppingCallback. Trainer refuses an eval_strategy without
an eval_dataset when it is built: build it inside ``with JudgeEvalCallback.building(args):``. With
``eval_strategy="no"`` (any Trainer) the callback keeps a schedule of its own: each epoch end, every
``every_n_steps`` optimizer steps and, with ``on_start``, before the first step (``own_schedule=False``: none).

Each evaluation, every process scores its shard of each suite with the same `ScoringEngine` (reference log-probs
cached from the first eval on) and, in generate mode, writes its shard of the generations with the same `Generator`
(built at the first eval, pointed at the trainer's model each time), the results are gathered, and the metrics are
logged once with ``trainer.log`` under
``eval_<suite>/...`` keys: transformers' report_to callbacks (and the run's metrics.jsonl writer) apply
``rewrite_logs``, which turns them into the names ``eval/<suite>/...`` (a key already spelled ``eval/...`` would
become ``train/eval/...``); a second proxy mode's under ``eval/<suite>/<mode>/...``, generate's under
``eval/<suite>/generate/...``. The main process writes ``<output_dir>/eval/<step>/``: per-row scores ``<suite>.jsonl``
and ``results.json``, the same files `judgetrain eval` writes (`judgetrain.eval.runner.evaluate_and_write`).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
from pathlib import Path
from typing import Any

from accelerate import PartialState
from transformers import TrainerCallback

from judgetrain.compat.transformers import log_without_overrides, save_checkpoint_now
from judgetrain.config.recipe import Recipe
from judgetrain.eval import reference
from judgetrain.eval.compare import worse_rule
from judgetrain.eval.evidence import NO_BASELINE_MODES, read_baseline
from judgetrain.eval.benchmarks import get_suite
from judgetrain.eval.metrics import Items, split_interval_keys, to_trainer_log_keys
from judgetrain.eval.plots import log_matrix_images
from judgetrain.eval.runner import current_items, evaluate_and_write
from judgetrain.run.checkpoints import checkpoint_dir, finish_markers
from judgetrain.eval.scoring import EvalStopped, ScoringEngine
from judgetrain.eval.session import Evaluation
from judgetrain.eval.suites import SuiteSpec
from judgetrain.trainer.callbacks import GracefulStop, RunStopped

logger = logging.getLogger(__name__)


class JudgeEvalCallback(TrainerCallback):
    """Score eval suites during training and log them through the trainer.

    Args:
        suites: the suites (`SuiteSpec`), or suite names (bundled sources).
        evaluation: what is evaluated and how (`judgetrain.eval.session.Evaluation`: the scoring modes, the engine's
            and the generator's options, the regression guard's); default: ``Evaluation()``, implicit scoring.
            Modes: ``implicit`` (DPO implicit reward; reference = adapter disabled, or the trainer's ref_model),
            ``loglik_sum`` / ``loglik_mean`` (the judge's own likelihood of a response, summed / per token: the
            step-0 evaluation is then the base under the same reading, a baseline), ``judge`` (expected overall score), ``generate`` (the judge writes its evaluation;
            `judgetrain.eval.generate.Generator`). The first of `PROXY_MODES` listed gives the bare keys.
        tokenizer: the tokenizer (default: the trainer's processing_class, read at `attach`).
        own_schedule: with ``eval_strategy="no"``, evaluate at each epoch end (and every ``every_n_steps``); False:
            only when the trainer evaluates (``eval_on_start``, ``trainer.evaluate()``).
        every_n_steps: with the own schedule, also evaluate every N optimizer steps (0: epoch ends only).
        on_start: evaluate once before the first step (the baseline, logged at step 0), as ``eval_on_start`` does.
        output_dir: where ``eval/<step>/`` goes (default: the trainer's ``args.output_dir``).
        ref_model: explicit reference for implicit scoring of a model without adapter (default: trainer.ref_model).
        trainer: the trainer (or call `attach` once it is built); add the callback with ``trainer.add_callback``.
        log_matrix_images: also log the 3x3 style heatmaps of the suites that have them as images to the active W&B / TensorBoard callbacks.

    The regression guard (``eval_regression_action``, ``_margin``, ``_alpha`` of the evaluation's arguments): after
    an eval with a baseline (the eval at step 0, for every mode but implicit: see `judgetrain.eval.evidence`), the
    categories whose figure got worse with an interval excluding 0 (and beyond the margin, in the figures' units)
    are named in one WARNING line and kept in ``regressions``; ``"stop"`` also saves a checkpoint of this step and
    ends the run (`RunStopped` with reason "regression").
    """

    def __init__(
        self,
        suites: list[SuiteSpec | str],
        evaluation: Evaluation | None = None,
        *,
        tokenizer: Any = None,
        own_schedule: bool = True,
        every_n_steps: int = 0,
        on_start: bool = False,
        output_dir: str | None = None,
        ref_model: Any = None,
        trainer: Any = None,
        log_matrix_images: bool = False,
    ) -> None:
        self.suites = [s if isinstance(s, SuiteSpec) else SuiteSpec(s) for s in suites]
        self.evaluation = evaluation if evaluation is not None else Evaluation()
        self.tokenizer = tokenizer
        self.modes = self.evaluation.modes
        self.own_schedule = own_schedule
        self.every_n_steps = int(every_n_steps or 0)
        self.on_start = on_start
        self.output_dir = output_dir
        self.ref_model = ref_model
        self.log_matrix_images = log_matrix_images
        self.trainer = None
        self.engine: ScoringEngine | None = None
        self.generator: Any = None  # generate mode: one Generator, reused every eval
        self.last_step: int | None = None
        self.history: list[dict[str, float]] = []  # flat metrics of every eval, in order (handy in tests)
        self.baseline: dict[tuple[str, str], Items] | None = None  # per-item figures of the eval at step 0
        self.regressions: list[dict[str, Any]] = []  # {step, categories} of each eval that found some
        if trainer is not None:
            self.attach(trainer)

    @classmethod
    def from_recipe(cls, recipe: Recipe, suites: list[SuiteSpec], tokenizer: Any, *,
                    trainer: Any = None) -> JudgeEvalCallback:
        """Build from a `Recipe` (`Evaluation.from_recipe`) and its suites (`judgetrain.eval.rows.recipe_specs`, their
        rows already read by `prepare_eval_rows`); the schedule is the DPOConfig's (eval_strategy, eval_steps,
        eval_on_start). A vLLM engine loads the base model at the run's pinned ``model_revision``."""
        return cls(suites, Evaluation.from_recipe(recipe), tokenizer=tokenizer, own_schedule=False,
                   output_dir=recipe.training_args.output_dir,
                   log_matrix_images=recipe.script_args.log_matrix_images, trainer=trainer)

    @staticmethod
    @contextlib.contextmanager
    def building(args: Any):
        """Build a Trainer without an eval_dataset whose ``args`` set an eval_strategy: Trainer's constructor
        refuses that (it would have nothing to evaluate); once this callback is attached, the suites are what it
        evaluates. The strategy is "no" during the ``with`` block only (TrainingArguments checked it when built)."""
        strategy, args.eval_strategy = args.eval_strategy, "no"
        try:
            yield
        finally:
            args.eval_strategy = strategy

    def attach(self, trainer: Any) -> JudgeEvalCallback:
        """Give the callback its trainer (for trainer.log, the accelerator and the reference model), and make the
        suites what ``trainer.evaluate()`` scores: judgetrain's trainer (`JudgeDPOTrainer.evaluate`) asks this callback;
        another Trainer (the callback used on its own) gets its ``evaluate`` wrapped on the instance."""
        self.trainer = trainer
        if self.tokenizer is None:
            self.tokenizer = getattr(trainer, "processing_class", None)
        if self.output_dir is None:
            self.output_dir = trainer.args.output_dir
        if hasattr(type(trainer), "judge_eval"):  # JudgeDPOTrainer: its evaluate() override asks this callback
            trainer.judge_eval = self
        elif getattr(trainer.evaluate, "judge_eval", None) is not self:
            trainer_evaluate = trainer.evaluate

            def evaluate(eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
                if eval_dataset is not None:  # a dataset of the caller's: the Trainer's own evaluation only
                    return trainer_evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
                metrics = {}
                if trainer.eval_dataset is not None:
                    metrics.update(trainer_evaluate(ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix))
                metrics.update(self.evaluate())
                return metrics

            evaluate.judge_eval = self
            trainer.evaluate = evaluate
        return self

    # ---------------------------------------------------------------------------------------------- events
    def on_train_begin(self, args, state, control, **kwargs):
        self._policy_reference(state)
        if state.global_step > 0:  # resumed: the checkpoint's step was evaluated (or not) by the run that saved it
            self.last_step = state.global_step
            self.baseline = read_baseline(Path(self.output_dir) / "eval" / "0", self._baseline_modes()) or None
        elif self.on_start:
            self.run(state)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.generator is not None:  # a vLLM engine goes before the trainer's end takes the process group down
            self.generator.close()
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        if self.engine is not None:  # an optimizer step follows: the policy is no longer its reference
            self.engine.policy_updated()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self._scheduling(args) and self.every_n_steps and state.global_step % self.every_n_steps == 0:
            control.should_evaluate = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self._scheduling(args):
            control.should_evaluate = True
        return control

    def _scheduling(self, args) -> bool:
        return self.own_schedule and args.eval_strategy == "no"

    # ---------------------------------------------------------------------------------------------- eval
    def _engine(self) -> ScoringEngine:
        """The one engine of the run (its reference and token-id caches live across evals), on the present model;
        a stop request (SIGTERM) is checked before each of its forwards, agreed over the processes."""
        model = self._model()
        if self.engine is None:
            stopper = self._stopper()
            self.engine = self.evaluation.engine(model, self.tokenizer, ref_model=self._reference(model),
                                                 stop_check=stopper.any_requested if stopper is not None else None)
        else:
            self.engine.set_model(model)
        return self.engine

    def _stopper(self):

        handler = getattr(self.trainer, "callback_handler", None)
        return next((cb for cb in getattr(handler, "callbacks", []) if isinstance(cb, GracefulStop)), None)

    def _policy_reference(self, state) -> None:
        """No reference model and no adapter (a full fine-tune with precompute_ref_log_probs): the weights before
        the first step are the reference, scored once and written to output_dir; a resume reads them back
        (`judgetrain.eval.reference`)."""

        if self.trainer is None or "implicit" not in self.modes:
            return
        engine = self._engine()
        if not reference.needs_policy_reference(engine):
            return
        if state.global_step > 0:
            reference.load_reference(engine, self.output_dir, PartialState(), f"the checkpoint at step {state.global_step}",
                                     rebuild=self._reference_rebuild(engine))
            return
        try:
            reference.score_reference(engine, self.suites, PartialState())
        except EvalStopped as stop:
            self._abandon(state, stop, "the eval reference")
        engine.freeze_reference(policy_is_reference=True)  # until the first step: the start eval's implicit scores
        # are 0, not run again
        if self.trainer.is_world_process_zero():
            reference.save_reference(engine, self.output_dir)

    def _reference_rebuild(self, engine: ScoringEngine):
        """How a torn eval_reference.json is scored again: the base model's weights loaded again, as the trainer
        loaded them (not under ZeRO-3, whose loading would partition the copy: there the resume is refused)."""

        if any(hasattr(p, "ds_id") for p in self._model().parameters()):
            return None
        init_kwargs = getattr(self.trainer.args, "model_init_kwargs", None)
        return lambda: reference.rescore_initial_weights(engine, self.suites, PartialState(), init_kwargs)

    def _abandon(self, state, stop: EvalStopped, what: str) -> None:
        """A stop request came during an eval: nothing of it is logged or written; the stop checkpoint is saved now
        (`GracefulStop` then ends the run with it); before the first step there is nothing to save."""

        step = int(state.global_step)
        stopper = self._stopper()
        logger.warning("%s at step %d abandoned (%s): no metrics logged for it; %s", what, step, stop,
                       "saving the stop checkpoint now" if step and stopper else "stopping")
        if stopper is None or step == 0:
            raise RunStopped("signal", step, f"Stopped by a stop request during {what} at step {step}, before any "
                             "checkpoint; start again (--resume auto starts from scratch)")
        trainer = self.trainer
        stopper.on_step_end(trainer.args, state, trainer.control)  # the stop flags, the old marker of this step gone
        save_checkpoint_now(trainer)  # GracefulStop.on_save raises RunStopped once the checkpoint is complete
        raise RunStopped("signal", step, f"stopped during {what} at step {step}")

    def _baseline_modes(self) -> list[str]:
        """The modes whose step-0 figures are a baseline (implicit's are 0 for every response: none)."""
        return [m for m in self.modes if m not in NO_BASELINE_MODES]

    def _regressed(self, state, worse: list[str]) -> None:
        """Categories got worse than at step 0: one WARNING line naming them, kept in ``regressions``; with
        ``eval_regression_action: stop`` a checkpoint of this step is saved and the run ends (every process: the
        figures are the same on each)."""
        step = int(state.global_step)
        self.regressions.append({"step": step, "categories": list(worse)})
        stop = self.evaluation.args.eval_regression_action == "stop"
        if self.trainer.is_world_process_zero():
            logger.warning("eval at step %d: %d categor%s worse than the baseline (the eval before the first step; %s): "
                           "%s%s", step, len(worse), "y" if len(worse) == 1 else "ies",
                           worse_rule(self.evaluation.args.eval_regression_margin,
                                      self.evaluation.args.eval_regression_alpha), ", ".join(worse),
                           "; stopping (eval_regression_action: stop)" if stop else "")
        if not stop:
            return
        trainer = self.trainer
        save_checkpoint_now(trainer)
        finish_markers()  # the checkpoint's marker written before the run ends
        ckpt = checkpoint_dir(trainer.args.output_dir, step)
        raise RunStopped("regression", step, f"Stopped at step {step}: {len(worse)} categories got worse than the "
                         f"baseline ({', '.join(worse)}); checkpoint saved to {ckpt}", checkpoint=str(ckpt))

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
        handler = getattr(self.trainer, "callback_handler", None)
        jsonl = next((cb for cb in getattr(handler, "callbacks", ()) if hasattr(cb, "hold_for_next_log")), None)
        if jsonl is not None:  # interval bounds to metrics.jsonl only: the trackers get the figures, deltas, p-values
            logs, bounds = split_interval_keys(logs)
            jsonl.hold_for_next_log(bounds)
        log_without_overrides(self.trainer, logs)
        if should_log is not None and getattr(self.trainer, "control", None) is not None:
            self.trainer.control.should_log = should_log

    def evaluate(self) -> dict[str, float]:
        """What ``trainer.evaluate()`` returns: the suites' metrics under the names Trainer looks up
        (``eval_rmbench/total_avg_acc``; ``metric_for_best_model`` may name one), after ``on_evaluate``."""
        trainer = self.trainer
        fresh = self.last_step != trainer.state.global_step
        metrics = to_trainer_log_keys(self.run(trainer.state))
        if not fresh:  # already scored at this step: nothing is logged or announced twice
            return metrics
        wanted = trainer.args.metric_for_best_model
        key = "eval_" + wanted.removeprefix("eval_") if wanted else None  # as Trainer prefixes it
        if key and trainer.eval_dataset is None and key not in metrics:
            near = difflib.get_close_matches(key, sorted(metrics), n=1)
            raise ValueError(f"metric_for_best_model: {wanted!r} is not among the figures the eval suites logged"
                             + (f"; did you mean {near[0]!r}?" if near else f" ({', '.join(sorted(metrics))})"))
        trainer.control = trainer.callback_handler.on_evaluate(trainer.args, trainer.state, trainer.control, metrics)
        return metrics

    def run(self, state: Any) -> dict[str, float]:
        """Evaluate now (all processes), log and write the per-row scores. Returns the flat metrics."""
        if self.trainer is None:
            raise RuntimeError("JudgeEvalCallback needs its trainer: JudgeEvalCallback(..., trainer=trainer), or callback.attach(trainer)")
        step = int(state.global_step)
        if self.last_step == step:  # already evaluated at this step (or the resumed checkpoint's step)
            if not self.history:
                logger.info("Step %d is the resumed checkpoint's: not evaluated again", step)
            return self.history[-1] if self.history else {}
        self.last_step = step

        logger.info("Evaluating %s at step %d", ", ".join(s.name for s in self.suites), step)

        model = self._engine().model
        if "generate" in self.modes:
            if self.generator is None:  # a SIGTERM stops generation between its calls too
                self.generator = self.evaluation.generator(model, self.tokenizer, stop_check=self.engine.stop_check)
            self.generator.set_model(model, self.trainer.accelerator)  # ZeRO-3: gathered once per generate call
        out = Path(self.output_dir) / "eval" / str(step)
        try:
            results, summary = evaluate_and_write(self.engine, self.suites, out, state=PartialState(), modes=self.modes,
                                                  generator=self.generator, step=step, epoch=state.epoch,
                                                  baseline=self.baseline if step > 0 else None,
                                                  **self.evaluation.regression)
        except EvalStopped as stop:
            self._abandon(state, stop, "the eval")
        finally:
            if self.generator is not None:  # a vLLM engine in sleep mode gives its GPU memory back to training
                self.generator.release()
        flat = summary["metrics"]
        self.history.append(flat)
        if step == 0:  # the judge before its first step: the baseline of every later eval
            modes = self._baseline_modes()
            self.baseline = {k: v for k, v in current_items(results, self.modes).items() if k[1] in modes} or None
        self._log(to_trainer_log_keys(flat))
        if summary.get("regressions"):
            self._regressed(state, summary["regressions"])
        if self.log_matrix_images and self.trainer.is_world_process_zero():
            self._log_matrices(results, step)
        return flat

    def _log_matrices(self, results: dict[str, Any], step: int) -> None:
        """The style matrices of each suite that has them (`Suite.matrices`) as images, tagged under its name."""
        for name, result in results.items():
            suite = get_suite(name)
            if suite.matrices and result.records:
                log_matrix_images(self.trainer, suite.style_matrices(result.records), step, prefix=f"eval/{name}",
                                  title=suite.title)
