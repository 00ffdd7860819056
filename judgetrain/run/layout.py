"""The names of the files judgetrain writes into a run's output_dir (and into each checkpoint)."""

IDENTITY_FILE = "judgetrain_run.json"  # the run identity (also inside every checkpoint)
LOCK_FILE = ".judgetrain.lock"  # the output_dir lock, held by the run's main process
STATUS_FILE = "judgetrain_status.jsonl"  # one line per launch: how it ended, its exit code
METRICS_FILE = "metrics.jsonl"  # one JSON object per logging event
COMPLETE_MARKER = "judgetrain_complete.json"  # written last: a checkpoint's (or the final model's) files and hashes
