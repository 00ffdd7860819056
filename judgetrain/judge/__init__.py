"""`judgetrain judge`: judges at work. One or many judges (local models with their adapters, OpenAI-compatible
endpoints) over items, resumable and sharded over processes, written as the panel file `judgetrain pairs build` reads.

- `items`: items read and checked before any model loads (JSONL / parquet / hub, JudgeBias-DPO-RefFree rows).
- `judges`: the ``--judge`` / ``--judges_file`` specifications and local model loading.
- `fit`: what a local judge loads (on vLLM, no transformers copy of the weights) and whether its vLLM engine fits
  the GPU, checked before any model loads.
- `output`: per-process shards appended a batch at a time, the done index, the run identity, the merge, the summary.
- `runner`: the loop (chunks, generators, the forced score prefix, SIGTERM, progress).
- `endpoint`: an OpenAI-compatible endpoint as a judge (bounded concurrency, retries with backoff, outcomes counted).

This stage sits above `judgetrain.eval` and below the commands: only `judgetrain.cli` and `judgetrain.bench` import it.
"""
