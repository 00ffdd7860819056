"""judgetrain: fine-tune LLM judges with DPO so they ignore surface form and catch real errors.

The package is built in layers. From the bottom up, each folder (or top-level module) imports only the package root
and the layers listed before it, lazy imports inside functions included (tests/test_layout.py checks it):

    compat       every reach into a library's private state, one module per library
    utils        shared leaves: the recipe error, files and atomic writes, rank decisions, hub ids and commits,
                 fingerprints and code digests, NaN in JSON, logging, devices
    config       the recipe schema (every key, the component table, the parser) and the packaged recipes
    data         sources to validated TRL rows: adapters, mixture, chat text, the length audit, the rows cache,
                 panel pairs and the score parser
    models       aliases, the model cache, the tiny judge, SmolLM2, tokenizer and template handling, attention
    run          one output_dir: identity, lock, exit codes, checkpoints and their markers, hub pinning, the file
                 names; the command table and the launcher every command starts through
    trainer      the one DPOTrainer subclass, prefix sharing, callbacks, parallelism
    eval         the scoring and generation engines, suites, eval rows, the per-epoch callback, metrics, heatmaps
    report       `judgetrain report`
    checks       a piece of every stage run before a launch: the setup sequence, the dry run, the preflight, the
                 memory estimate
    judge        `judgetrain judge`: judges over items into panel rows, resumable and sharded
    perturb      `judgetrain perturb`: the spec and its packs, rule operators, model rewrites on the judge engine,
                 checks, the items `judgetrain judge` reads
    probe        `judgetrain probe`: what a base judge sees before training, zero-shot and by a linear probe
    rewards      a trained judge as a reward: TRL's reward_funcs, the judge's card, the batcher `judgetrain serve` runs
    metrics.py   the metric functions' public home
    train.py     the per-process recipe that `accelerate launch -m judgetrain.train` runs
    loop         `judgetrain loop`: rounds of the debiasing loop, each stage a command, resumable; the round table
    bench        `judgetrain bench`
    cli          every `judgetrain` command; nothing imports it

A helper that two stages need lives in the lower one's layer or below (utils when no stage owns it).
"""

__version__ = "0.1.0"
