"""A linear probe of the frozen model's hidden states: does a direction of them tell the better text of a pair from
the worse one, on pairs of a kind it was not fitted on?

A pair's feature is the better text's mean hidden state minus the worse text's, the chosen layers side by side
(`judgetrain.probe.hidden`). The probe is a logistic regression with an L2 penalty and no intercept, fitted on both
signs of each training pair as the two classes (``f`` labelled 1, ``-f`` labelled 0), the features scaled by their
root mean square over the training pairs; it is fitted by L-BFGS in float64 from zero weights, so the same pairs give
the same probe. A test pair counts as ranked right when its ``w . f`` is positive.

Two held-out readings per kind of pair (`judgetrain.probe.pairs.KINDS`):

- ``probe_held_out_type``: for each type, a probe fitted on the pairs of the other types of the other samples, scored
  on that type's pairs: the samples are dealt into seeded folds (`sample_folds`) and each fold's pairs of the type are
  scored by the probe fitted on the other folds' pairs of the other types. A pair's better text (the source, or the
  rewrite of a cross pair) is in every pair of its sample, so a probe fitted on the same samples would recognise the
  text rather than the edit. A pair whose copy holds an edit of an operator of the held-out type (a combined set that
  mixes operators) is left out of the fit: the probe never sees the held-out kind of edit. A type with nothing left
  to fit on is NaN;
- ``probe_held_out_samples``: a probe fitted on the pairs of the samples outside a seeded held-out share, scored on the
  held-out samples' pairs.

``probe_error_transfer`` reads the probe fitted on the error pairs of the fitting samples on the held-out samples'
represent and cross pairs: what a judge that learnt "source above error copy" would make of a rewrite.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from judgetrain.probe.pairs import Pair


def fit_probe(features: np.ndarray, l2: float, max_iter: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """(weights, feature scale) of the probe fitted on ``features`` (pairs x dims, better minus worse)."""
    scale = np.sqrt(np.mean(np.square(features, dtype=np.float64), axis=0)) + 1e-12
    x = torch.from_numpy(np.concatenate([features, -features]) / scale)
    y = torch.cat([torch.ones(len(features)), torch.zeros(len(features))]).double()
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=max_iter, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        value = torch.nn.functional.binary_cross_entropy_with_logits(x @ w, y, reduction="sum") + l2 / 2 * w @ w
        value.backward()
        return value

    opt.step(loss)
    return w.detach().numpy(), scale


def ranked_right(weights: np.ndarray, scale: np.ndarray, features: np.ndarray) -> np.ndarray:
    """1.0 where the probe's ``w . f`` of a pair is positive (the better text ranked first), else 0.0."""
    return ((features / scale) @ weights > 0).astype(np.float64)


def held_out_samples(sample_ids: Sequence[Any], fraction: float, seed: int) -> set:
    """The samples held out of the fit: ``fraction`` of the distinct ids (at least one, and one fewer than all),
    drawn with ``seed``."""
    ids = sorted(set(sample_ids), key=str)
    n = min(len(ids) - 1, max(1, round(fraction * len(ids))))
    return set(random.Random(seed).sample(ids, n)) if n > 0 else set()


def held_out_type(pairs: list[Pair], features: np.ndarray, l2: float, *, folds: int = 4,
                  seed: int = 0) -> np.ndarray:
    """Per pair: ranked right by a probe fitted on the other types' pairs of the other samples (NaN where nothing
    was left to fit on). The samples are dealt into ``folds`` seeded folds; a type's pairs of one fold are scored by
    the probe fitted on the other folds' pairs of the other types: no text of a scored pair's sample is in its fit."""
    out = np.full(len(pairs), np.nan)
    fold_of = sample_folds([p.sample_id for p in pairs], folds, seed)
    for ptype in dict.fromkeys(p.perturbation_type for p in pairs):
        of_type = [i for i, p in enumerate(pairs) if p.perturbation_type == ptype]
        seen = set().union(*(pairs[i].operators for i in of_type))
        for fold in sorted({fold_of[pairs[i].sample_id] for i in of_type}):
            test = [i for i in of_type if fold_of[pairs[i].sample_id] == fold]
            fit = [i for i, p in enumerate(pairs) if p.perturbation_type != ptype and not (p.operators & seen)
                   and fold_of[p.sample_id] != fold]
            if fit:
                w, s = fit_probe(features[fit], l2)
                out[test] = ranked_right(w, s, features[test])
    return out


def sample_folds(sample_ids: Sequence[Any], folds: int, seed: int) -> dict:
    """{sample id: its fold, 0 to ``folds`` - 1}: the distinct ids shuffled with ``seed`` and dealt in turn (as many
    folds as samples where there are fewer)."""
    ids = sorted(set(sample_ids), key=str)
    random.Random(seed).shuffle(ids)
    return {sid: k % max(1, min(folds, len(ids))) for k, sid in enumerate(ids)}


def split_fit(pairs: list[Pair], features: np.ndarray, held: set, l2: float):
    """(the probe fitted on the pairs of samples outside ``held``, or None; the held-out pairs' indices)."""
    fit = [i for i, p in enumerate(pairs) if p.sample_id not in held]
    test = [i for i, p in enumerate(pairs) if p.sample_id in held]
    return (fit_probe(features[fit], l2) if fit else None), test


def held_out_sample_values(pairs: list[Pair], features: np.ndarray, held: set, l2: float) -> np.ndarray:
    """Per pair: ranked right by the probe fitted on the other samples (NaN for the pairs it was fitted on)."""
    out = np.full(len(pairs), np.nan)
    probe, test = split_fit(pairs, features, held, l2)
    if probe is not None and test:
        out[test] = ranked_right(*probe, features[test])
    return out


def transfer_values(probe, pairs: list[Pair], features: np.ndarray, held: set) -> np.ndarray:
    """Per pair of held-out samples: ranked right by ``probe`` (weights, scale) fitted elsewhere; NaN otherwise."""
    out = np.full(len(pairs), np.nan)
    test = [i for i, p in enumerate(pairs) if p.sample_id in held]
    if probe is not None and test:
        out[test] = ranked_right(*probe, features[test])
    return out
