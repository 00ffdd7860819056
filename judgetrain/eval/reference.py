"""The reference of implicit scoring when the trainer has none: the untrained policy, scored once and kept.

A full fine-tune with ``precompute_ref_log_probs`` has no reference model (TRL sets ``ref_model = None``: the
training rows' reference log-probs are computed before the first step), and no adapter to disable. Its implicit
eval scores would then be plain log-likelihood. The weights before the first optimizer step are the reference, so
`score_reference` scores every eval sequence with them once (each process its shard, in the same order as an eval),
every process gets the whole cache, and the main process writes it to ``<output_dir>/eval_reference.json``
(``{"namespace": ..., "values": {key: log-prob}}``, keys as `ScoringEngine` makes them: token ids + reference
name). The engine then reads only that cache (`ScoringEngine.freeze_reference`); a resumed run loads the file
instead of scoring a trained policy as its reference (a torn file is scored again with the base model's weights,
loaded again: they are the weights before step 1), and a row that was not in the eval set at the start has no
reference: left unscored and counted (``n_no_reference``), never scored against 0. Until the first optimizer step
the policy is that reference (``ScoringEngine.policy_is_reference``): the start eval (``eval_on_start``) takes each
cached sequence's reference log-prob as its policy log-prob, so it scores exactly 0 without a second forward
(counted as ``policy_from_reference``).

The same file, written by an evaluation of a base model alone (`save_base_reference`: no adapter, no reference of its
own, every likelihood sequence's log-prob from the forward its likelihood modes share), is the reference of any
adapter trained on that base: `judgetrain eval --reference_logprobs FILE` (the loop passes round 0's to every later
round) seeds implicit scoring's reference cache with it (`read_base_reference`), so the base is not scored a second
time; a sequence the file lacks is scored as before. The file names the base (its ``namespace``) and the dtype it was
scored in; another base or dtype is refused.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

import torch
from accelerate.utils import broadcast_object_list, gather_object
from transformers import AutoModelForCausalLM

from judgetrain.config.recipe import RecipeError
from judgetrain.eval.scoring import ScoringEngine, shard_indices
from judgetrain.eval.suites import SuiteSpec, build_request
from judgetrain.run.layout import EVAL_REFERENCE_FILE
from judgetrain.utils.errors import BadInputError
from judgetrain.utils.files import write_json

logger = logging.getLogger(__name__)


def needs_policy_reference(engine: ScoringEngine) -> bool:
    """Neither a reference model nor an adapter to disable (asked when implicit is among the run's modes)."""
    return engine.ref_model is None and not engine.has_adapter_reference


def score_reference(engine: ScoringEngine, specs: list[SuiteSpec], state: Any) -> int:
    """Score every implicit eval sequence of ``specs`` with the engine's current weights as the reference (all
    processes together) and freeze the engine's reference cache on the result. Returns the sequences scored."""
    t0 = time.perf_counter()
    world, rank = getattr(state, "num_processes", 1), getattr(state, "process_index", 0)
    model = engine.model
    was_training = model.training
    model.eval()
    n = 0
    try:
        with engine.computing_reference(), torch.no_grad():  # the live training model: no inference tensors (ZeRO-3 gathers params here)
            for spec in specs:
                spec.load_rows()
                mine = shard_indices(len(spec.rows), rank, world)
                requests = []
                for i in mine:
                    req = build_request(spec.name, spec.rows[i], "implicit")
                    req.cache_key = f"{spec.key}:{i}"  # as runner.evaluate names it: the ids are reused there
                    requests.append(req)
                seqs, _ = engine.sequences.build(requests)
                implicit = [s for s in seqs if requests[s.row].kind == "implicit"]
                engine._reference_logps(implicit, world > 1)
                n += len(implicit)
    finally:
        if was_training:
            model.train()
    if world > 1:
        for part in gather_object([dict(engine.reference_values)]):
            engine.freeze_reference(part)
    logger.info("eval reference: %d sequences scored with the weights before the first step (%.1fs); implicit "
                "scores are against them from now on", len(engine.reference_values), time.perf_counter() - t0)
    return n


def save_reference(engine: ScoringEngine, output_dir: str | Path) -> Path:
    """Write the engine's reference cache (main process only)."""

    path = Path(output_dir) / EVAL_REFERENCE_FILE
    write_json(path, {"namespace": engine._reference_namespace(), "values": engine.reference_values})
    logger.info("eval reference: %d log-probs written to %s (a resume reads them)", len(engine.reference_values), path)
    return path


def initial_weights(model: torch.nn.Module, init_kwargs: dict | None) -> torch.nn.Module:
    """The weights before step 1 of a full fine-tune, loaded again: the base model ``model`` was loaded from (its
    ``name_or_path``), with the run's ``model_init_kwargs``, in ``model``'s dtype and on its device."""

    first = next(model.parameters())
    kwargs = {k: v for k, v in (init_kwargs or {}).items() if k not in ("device_map", "dtype", "torch_dtype")}
    fresh = AutoModelForCausalLM.from_pretrained(model.name_or_path, dtype=first.dtype, **kwargs)
    return fresh.to(first.device).eval()


def rescore_initial_weights(engine: ScoringEngine, specs: list[SuiteSpec], state: Any,
                            init_kwargs: dict | None) -> int:
    """`score_reference` with the weights before step 1 loaded again (`initial_weights`) in place of the engine's
    trained model, which is put back after. The keys are the same as the start's: the same base model name."""
    live = engine.model
    engine.set_model(initial_weights(live, init_kwargs))
    try:
        return score_reference(engine, specs, state)
    finally:
        engine.set_model(live)


def _reference_problem(path: Path, engine: ScoringEngine) -> tuple[dict | None, str | None]:
    """The reference file's document, or why it cannot be one ("missing" when absent; a torn one's reason)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError) as e:  # cut short, zero-filled, not UTF-8, not JSON
        return None, f"unreadable: {type(e).__name__}: {str(e)[:120]}"
    values = doc.get("values") if isinstance(doc, dict) else None
    if not isinstance(values, dict):
        return None, "not a {namespace, values} object"
    bad = next((k for k, v in values.items() if isinstance(v, bool) or not isinstance(v, (int, float))), None)
    if bad is not None:
        return None, f"value {bad!r} is not a number"
    if doc.get("namespace") != engine._reference_namespace():
        return None, f"its namespace {doc.get('namespace')!r} is not this model's {engine._reference_namespace()!r}"
    return doc, None


def load_reference(engine: ScoringEngine, output_dir: str | Path, state: Any, resumed_from: str,
                   rebuild: Callable[[], Any] | None = None) -> None:
    """A resumed run's reference: the file its start wrote (read by the main process, sent to the others).
    A torn one (cut short, zero-filled, not JSON, the wrong shape) is named in one warning and scored again with
    ``rebuild`` (`rescore_initial_weights`: the weights before step 1, loaded again; on every process), then
    written whole. A missing one, or a torn one without ``rebuild``, refuses the run: its weights are trained, so
    they cannot stand in for the reference."""
    path = Path(output_dir) / EVAL_REFERENCE_FILE
    box: list[Any] = [None, None]
    if getattr(state, "is_main_process", True):
        box = list(_reference_problem(path, engine))
    if getattr(state, "num_processes", 1) > 1:
        broadcast_object_list(box)
    doc, problem = box
    if problem is not None and problem != "missing" and rebuild is not None:
        logger.warning("eval reference %s is torn or stale (%s): scoring the weights before step 1 again (loaded from the "
                       "base model) and writing it whole", path, problem)
        rebuild()
        if getattr(state, "is_main_process", True):
            save_reference(engine, output_dir)
        return
    if problem is not None:
        why = f"{path} is missing" if problem == "missing" else f"{path} is torn ({problem})"
        raise RecipeError(
            f"implicit eval of a resumed full fine-tune without a reference model: {why}, so there is no reference "
            f"(the weights before step 1, scored at the run's start) and {resumed_from}'s trained weights cannot "
            "stand in for it. Resume with eval_scoring: judge, or eval_suites: none, or start the run again "
            "(a start writes the file)")
    engine.freeze_reference({k: float(v) for k, v in doc["values"].items()})
    logger.info("eval reference: %d log-probs of the weights before step 1 read from %s", len(doc["values"]), path)


def _engine_dtype(engine: ScoringEngine) -> str:
    return str(next(engine.model.parameters()).dtype).removeprefix("torch.")


def save_base_reference(values: dict[str, float], engine: ScoringEngine, directory: str | Path) -> Path:
    """Write a base model's own log-probs (`ScoringEngine.policy_values_as_reference`, every process's share) as the
    reference file of adapters trained on it (main process only)."""
    path = Path(directory) / EVAL_REFERENCE_FILE
    write_json(path, {"namespace": engine._reference_namespace(), "dtype": _engine_dtype(engine), "values": values})
    logger.info("eval reference: the base's %d log-probs written to %s (`judgetrain eval --reference_logprobs` of an "
                "adapter on it reads them instead of scoring the base again)", len(values), path)
    return path


def read_base_reference(path: str | Path, engine: ScoringEngine) -> dict[str, float]:
    """A base evaluation's reference file (`save_base_reference`) for this engine's base and dtype; `BadInputError`
    naming the file otherwise."""
    doc, problem = _reference_problem(Path(path), engine)
    if problem is None and doc.get("dtype") != _engine_dtype(engine):
        problem = f"scored in {doc.get('dtype')}, this evaluation in {_engine_dtype(engine)}"
    if problem is not None:
        raise BadInputError(f"--reference_logprobs {path}: {problem}; give the file of the base model's own "
                            "evaluation in the same dtype, or leave the option out (the base is then scored again)")
    values = {k: float(v) for k, v in doc["values"].items()}
    logger.info("eval reference: %d log-probs of the base read from %s: implicit scoring subtracts them instead of "
                "scoring the base again", len(values), path)
    return values
