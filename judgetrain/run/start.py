"""How a run starts in its output_dir: take the lock, pick and verify the checkpoint to resume from, decide
whether this is a resume, a restart or a fresh run (refused with the reason otherwise), and, once the rows are known,
record the identity and the recipe and cut metrics.jsonl back to the resumed step."""

# Late imports: accelerate, judgetrain.run, judgetrain.utils (inside the functions that use them): `judgetrain report`
# and `status` read a run folder without torch: it comes in with the functions that need a process group or a
# checkpoint list.

from __future__ import annotations

import logging
from pathlib import Path

from judgetrain.config.recipe import Recipe, RecipeError, save_recipe
from judgetrain.utils.ranks import decided_on_main

logger = logging.getLogger(__name__)


def prepare_output_dir(recipe: Recipe,
                       revisions: dict | None = None) -> tuple[str | None, dict, dict]:
    """Before anything is written: take the output_dir lock (one run per folder), pick the checkpoint to resume from
    (verified), and decide how this run starts there (`judgetrain.run.state.plan_start`: a resume of the same run, a
    restart, a fresh run; refused with the reason otherwise). Returns (checkpoint or None, identity without the data
    fingerprint yet, plan). ``revisions``: the hub commits pinned at the start (`judgetrain.run.revisions`), part of
    the identity."""
    script_args, training_args, resolved = recipe.script_args, recipe.training_args, recipe.resolved
    from accelerate import PartialState

    from judgetrain.run.checkpoints import resolve_resume_everywhere
    from judgetrain.run.state import clear_run, hold_output_dir, plan_start, run_identity

    out = Path(training_args.output_dir)
    decided_on_main(lambda: hold_output_dir(out))  # held until this process exits, however it exits
    resume_from = resolve_resume_everywhere(script_args.resume, training_args.output_dir)  # on every machine's disk
    identity = run_identity(resolved, num_processes=PartialState().num_processes, data=None, revisions=revisions)

    def decide():
        plan = plan_start(out, identity, checkpoint=resume_from, resume_asked=bool(script_args.resume),
                          force=script_args.resume_force, overwrite=script_args.overwrite_output_dir)
        if plan["clear"]:
            clear_run(out, plan["clear"])
        return plan

    return resume_from, identity, decided_on_main(decide)


def record_run(out: Path, identity: dict, plan: dict, recipe: Recipe, command, resume_from) -> dict:
    """Once the rows are known: compare their fingerprint with the resumed run's, then (main process) write the
    identity, the recipe (recipe.yaml stays the first run's; each resume adds recipe.resume-<step>.yaml) and cut
    metrics.jsonl back to the resumed step."""
    resolved, script_args = recipe.resolved, recipe.script_args
    from judgetrain.run.checkpoints import COMPLETE_MARKER, METRICS_FILE, checkpoint_step, truncate_metrics
    from judgetrain.run.state import IDENTITY_FILE, checkpoint_identity, recipe_path, record_start
    from judgetrain.utils.files import read_json

    step = checkpoint_step(resume_from) if resume_from else 0

    def decide():
        if plan["kind"] != "fresh":
            old = checkpoint_identity(resume_from) if resume_from else (read_json(out / IDENTITY_FILE) or {}).get("current")
            if old and old.get("data") and old["data"] != identity["data"]:
                line = f"data: {old['data']!r} -> {identity['data']!r}"
                if not script_args.resume_force:
                    raise RecipeError(f"--resume: the training rows differ from the resumed run's ({line}); pass "
                                      "--resume_force to continue on the new rows, or start a new run in another output_dir")
                plan["forced"].append(line)
        if plan["forced"]:
            logger.warning("--resume_force: continuing with the new values of: %s", "; ".join(plan["forced"]))
        record_start(out, identity, plan, step=step, checkpoint=resume_from)
        save_recipe(resolved, recipe_path(out, plan, step), command=command)
        (out / COMPLETE_MARKER).unlink(missing_ok=True)  # a final model of an earlier segment is not this run's end
        if plan["kind"] == "resume":
            dropped = truncate_metrics(str(out), step)
            logger.info("Resuming from %s (step %d); %d metrics.jsonl records after it were dropped", resume_from, step, dropped)
        elif (out / METRICS_FILE).exists():
            (out / METRICS_FILE).unlink()  # a restart from step 0 of the same run starts a fresh log
            logger.info("Restarting %s from step 0 (no complete checkpoint to resume)", out)
        return plan

    return decided_on_main(decide)

