"""`judgetrain probe` end to end: the items and samples read and paired (before any model loads), the model loaded,
the zero-shot readings and the hidden states, the probes, the figures, ``<output_dir>/probe.json`` and the logged
table.

    options = ProbeOptions(items="perturbed/items.jsonl", source="recipes.jsonl", spec="materials",
                           model="smollm2-135m-instruct", output_dir="probe")
    probe = prepare(options)           # ProbeInputError / DataValidationError / SpecError before any model loads
    result = run_probe(options, probe) # writes probe.json, logs the table
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from judgetrain.eval.stats import N_RESAMPLES
from judgetrain.eval.scoring import ScoringEngine
from judgetrain.eval.suites import check_verdict_tokens
from judgetrain.judge.judges import load_local, parse_judge, preflight_local
from judgetrain.perturb.source import read_samples
from judgetrain.perturb.spec import load_spec
from judgetrain.probe import MODES, linear
from judgetrain.probe.figures import kind_figures, table
from judgetrain.probe.hidden import check_layers, default_layers, response_means
from judgetrain.probe.pairs import KINDS, ProbeInputError, ProbeSet, read_probe_set
from judgetrain.probe.readings import pair_values, read_all, response_sequences
from judgetrain.utils.files import write_json
from judgetrain.utils.numbers import nan_to_none

logger = logging.getLogger(__name__)

RESULT_FILE = "probe.json"


@dataclass
class ProbeOptions:
    items: str
    source: str
    spec: str
    model: str
    output_dir: str
    source_split: str = "train"
    types: list[str] | None = None
    modes: list[str] = field(default_factory=lambda: list(MODES))
    layers: list[int] | None = None  # None: `default_layers`
    l2: float = 1.0
    holdout_fraction: float = 0.25
    verdict_cross: int = 1
    max_samples: int | None = None
    seed: int = 0
    n_resamples: int = N_RESAMPLES
    batch_tokens: int = 8192
    dtype: str = "float32"


def prepare(options: ProbeOptions) -> ProbeSet:
    """The probe set, and the model checked loadable: everything that can refuse the input, before any weights."""
    refused = {"--holdout_fraction": not 0 < options.holdout_fraction < 1, "--l2": options.l2 <= 0,
               "--verdict_cross": options.verdict_cross < 0, "--n_resamples": options.n_resamples < 1,
               "--max_samples": options.max_samples is not None and options.max_samples < 2}
    wants = {"--holdout_fraction": "a share between 0 and 1", "--l2": "a penalty above 0", "--verdict_cross": ">= 0",
             "--n_resamples": ">= 1", "--max_samples": ">= 2 (a probe is fitted on some samples, scored on others)"}
    for flag, bad in refused.items():
        if bad:
            raise ProbeInputError(f"{flag} {getattr(options, flag[2:])}: give {wants[flag]}")
    samples, _ = read_samples(options.source, load_spec(options.spec), split=options.source_split)
    probe = read_probe_set(options.items, samples, types=options.types, max_samples=options.max_samples,
                           seed=options.seed)
    preflight_local([parse_judge(options.model, "--model")], "--model")
    return probe


def _hidden_features(model, tokenizer, probe: ProbeSet, sequences, options: ProbeOptions) -> tuple[np.ndarray, list]:
    """(per pair: better minus worse, the chosen layers side by side; the layers)."""
    n_layers = int(model.config.num_hidden_layers)
    layers = check_layers(options.layers, n_layers) if options.layers else default_layers(n_layers)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    means = response_means(model, sequences, layers, pad_id=int(pad), batch_tokens=options.batch_tokens)
    flat = means.reshape(len(means), -1)
    return np.stack([flat[p.better] - flat[p.worse] for p in probe.pairs]), layers


def probe_values(probe: ProbeSet, features: np.ndarray, options: ProbeOptions) -> tuple[dict[str, dict], list]:
    """{kind: {method: per pair of the whole set}} of the linear probes (`judgetrain.probe.linear`), and the held-out
    samples."""
    held = linear.held_out_samples([p.sample_id for p in probe.pairs], options.holdout_fraction, options.seed)
    folds = max(2, round(1 / options.holdout_fraction))  # each fold a ``holdout_fraction`` of the samples
    out: dict[str, dict[str, np.ndarray]] = {}
    error_probe = None
    for kind in KINDS:
        index = [i for i, p in enumerate(probe.pairs) if p.kind == kind]
        if not index:
            continue
        pairs, feats = [probe.pairs[i] for i in index], features[index]
        values = {"probe_held_out_type": linear.held_out_type(pairs, feats, options.l2, folds=folds,
                                                              seed=options.seed),
                  "probe_held_out_samples": linear.held_out_sample_values(pairs, feats, held, options.l2)}
        if kind == "error":
            error_probe, _ = linear.split_fit(pairs, feats, held, options.l2)
        elif error_probe is not None:
            values["probe_error_transfer"] = linear.transfer_values(error_probe, pairs, feats, held)
        for method, v in values.items():
            whole = np.full(len(probe.pairs), np.nan)
            whole[index] = v
            out.setdefault(kind, {})[method] = whole
    return out, sorted(held, key=str)


def run_probe(options: ProbeOptions, probe: ProbeSet) -> dict[str, Any]:
    """Read, probe, write ``probe.json`` and log the table; returns what was written."""
    clock = {"start": time.perf_counter()}
    torch.manual_seed(options.seed)
    model, tokenizer = load_local(parse_judge(options.model, "--model"), dtype=options.dtype)
    if "verdict" in options.modes:
        check_verdict_tokens(tokenizer)
    clock["load"] = time.perf_counter()
    sequences = response_sequences(tokenizer, probe)
    n_tokens = np.asarray([len(ids) - start for ids, start in sequences], dtype=np.float64)
    engine = ScoringEngine(model, tokenizer, scoring="implicit", batch_tokens=options.batch_tokens)
    readings = read_all(engine, probe, options.modes, n_tokens, verdict_cross=options.verdict_cross,
                        seed=options.seed)
    clock["readings"] = time.perf_counter()
    features, layers = _hidden_features(model, tokenizer, probe, sequences, options)
    clock["hidden"] = time.perf_counter()
    zero_shot = pair_values(probe, readings, options.modes)
    probed, held = probe_values(probe, features, options)
    figures = {kind: kind_figures(probe, kind, {**zero_shot, **probed.get(kind, {})},
                                  n_resamples=options.n_resamples, seed=options.seed)
               for kind in KINDS if probe.of(kind)}
    clock["probe"] = time.perf_counter()
    result = {"model": options.model, "items": str(options.items), "source": str(options.source),
              "options": {k: v for k, v in asdict(options).items() if k not in ("items", "source", "model")},
              "layers": layers, "samples": probe.samples, "texts": len(probe.texts),
              "pairs": {k: len(probe.of(k)) for k in KINDS}, "verdict_pairs": len(readings.verdicts),
              "skipped": dict(probe.skipped), "held_out_samples": [str(s) for s in held],
              "seconds": {"load": clock["load"] - clock["start"], "readings": clock["readings"] - clock["load"],
                          "hidden_states": clock["hidden"] - clock["readings"],
                          "probes_and_intervals": clock["probe"] - clock["hidden"],
                          "total": clock["probe"] - clock["start"]},
              "engine": engine.stats.as_dict(), "figures": figures}
    out = Path(options.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / RESULT_FILE, nan_to_none(result))
    logger.info("probe of %s: %d samples, %d texts, layers %s, %.0f s\n%s", options.model, probe.samples,
                len(probe.texts), ",".join(map(str, layers)), result["seconds"]["total"], table(figures))
    logger.info("wrote %s", out / RESULT_FILE)
    return result
