"""The names of the files judgetrain writes into a run's output_dir (and into each checkpoint), and into a loop's."""

IDENTITY_FILE = "judgetrain_run.json"  # the run identity (also inside every checkpoint)
LOCK_FILE = ".judgetrain.lock"  # the output_dir lock, held by the run's main process
STATUS_FILE = "judgetrain_status.jsonl"  # one line per launch: how it ended, its exit code
METRICS_FILE = "metrics.jsonl"  # one JSON object per logging event
COMPLETE_MARKER = "judgetrain_complete.json"  # written last: a checkpoint's (or the final model's) files and hashes

# a `judgetrain loop` output_dir (judgetrain.loop): its state, its log, the held-out pairs and the round table
LOOP_STATE_FILE = "loop_state.json"  # the stages done, with their wall time and CPU-seconds
LOOP_LOG_FILE = "stages.jsonl"  # one line per stage's start and end
HELDOUT_PAIRS = "heldout/pairwise.jsonl"  # the held-out pairs every round is scored on
HELDOUT_REWRITES = "heldout/rewrites.jsonl"  # the held-out rewrites against their source and an error copy
HELDOUT_FILES = {"pairwise": HELDOUT_PAIRS, "rewrites": HELDOUT_REWRITES}  # the suite each held-out file is scored by
ROUND_TABLE = "rounds.json"  # the round table's keys and rows; beside it rounds.csv and rounds.md
ROUND_TABLE_CSV = "rounds.csv"
ROUND_TABLE_MD = "rounds.md"
EVAL_REFERENCE_FILE = "eval_reference.json"  # reference log-probs (`judgetrain.eval.reference`): a run's, a base's
ROUND_COMPARE_FILE = "compare.json"  # in a round's eval folder: `judgetrain compare` of the round against the base


def round_folder(k: int) -> str:
    """Round ``k``'s folder in a loop's output_dir (round 0: the base's evaluation)."""
    return f"round-{k}"
