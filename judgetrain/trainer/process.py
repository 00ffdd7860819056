"""What every process of an `accelerate launch` does first: join the process group (gloo on a machine without a
GPU) and follow the launcher if it dies."""

from __future__ import annotations

from judgetrain.utils.launcher import die_with_launcher


def init_process_state(argv: list[str] | None = None):
    """Join the launcher's process group before anything reads the device, refusing a parallelism this machine
    would silently downgrade (judgetrain.trainer.parallelism.join_process_group: on a machine without a GPU the processes
    join over gloo; Trainer would otherwise run N independent copies). The group gets the recipe's ``ddp_timeout``
    (read from ``argv`` ahead of the full parse): Accelerate does not create the group again once it exists, so a
    group created without it would keep the backend's default (NCCL's 10 minutes) while rank 0 alone prepares data."""
    from judgetrain.trainer.parallelism import join_process_group

    die_with_launcher()
    state, _ = join_process_group(timeout_s=ddp_timeout_of(argv or []))
    return state


def ddp_timeout_of(argv: list[str]) -> int:
    """The recipe's ``ddp_timeout`` in seconds: the command line's ``--ddp_timeout``, else the recipe file's, else
    TrainingArguments' default."""
    import dataclasses

    from trl import DPOConfig

    from judgetrain.config.recipe import RecipeError, load_recipe_file, split_recipe_argv

    recipe, overrides = split_recipe_argv(argv)
    value = next((f.default for f in dataclasses.fields(DPOConfig) if f.name == "ddp_timeout"), 1800)
    if recipe:
        value = load_recipe_file(recipe).get("ddp_timeout", value)
    for i, token in enumerate(overrides):
        if token == "--ddp_timeout" and i + 1 < len(overrides):
            value = overrides[i + 1]
        elif token.startswith("--ddp_timeout="):
            value = token.split("=", 1)[1]
    try:
        seconds = int(value)
    except (TypeError, ValueError):
        raise RecipeError(f"ddp_timeout: {value!r} is not a whole number of seconds") from None
    if seconds <= 0:
        raise RecipeError(f"ddp_timeout: {seconds} must be a positive number of seconds")
    return seconds
