"""Statistics of the evaluations, benchmark-free: per-item figures (`Items`), their bootstrap intervals (units
resampled within strata, clusters kept whole), paired differences with the exact sign test or sign-flip test,
McNemar, Holm's correction across several tests, and Spearman. Pure numpy; the benchmarks' figures (`judgetrain.eval.benchmarks`) build on it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def mean_of(values: Sequence[float]) -> float:
    """The mean, NaN for no values."""
    return float(np.mean(values)) if len(values) else math.nan


def finite_mean(values: np.ndarray) -> float:
    """The mean of the finite values (NaN: the item does not count), NaN for none."""
    return mean_of(values[np.isfinite(values)])


def as_score(value: Any) -> float:
    """A score as a float, NaN for None."""
    return math.nan if value is None else float(value)


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their mean rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    uniq, inverse = np.unique(values, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks)
    return sums[inverse] / np.bincount(inverse)[inverse]


def spearman(x: Sequence[Any], y: Sequence[Any]) -> float:
    """Spearman rank correlation of the pairs where both values are finite numbers (None / NaN dropped); NaN with
    fewer than 2 such pairs or when one side is constant (no ranking to agree with)."""
    a = np.asarray([math.nan if v is None else v for v in x], dtype=np.float64)
    b = np.asarray([math.nan if v is None else v for v in y], dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if len(a) < 2:
        return math.nan
    ra, rb = _ranks(a) - (len(a) + 1) / 2, _ranks(b) - (len(b) + 1) / 2
    den = math.sqrt(float(np.sum(ra * ra) * np.sum(rb * rb)))
    return float(np.sum(ra * rb) / den) if den > 0 else math.nan



# --------------------------------------------------------------------------------- intervals and paired deltas
N_RESAMPLES = 1000
CONFIDENCE = 0.95
RESOLUTION = 1e-9  # relative: a difference this small against its figures is float rounding, never a change
_CHUNK = 250  # resamples drawn and reduced together (memory: _CHUNK x units counts)


@dataclass
class Items:
    """A suite's per-item figures, what its intervals and paired deltas are computed from.

    ``keys``: each item's identity (pairs two evaluations of the same rows). ``values``: {metric: (n,) floats}, the
    headline figure being the mean of the finite values (NaN: the item does not count in that metric, e.g. a row of
    another category). ``groups``: {metric: (n,) labels} for a figure that is the unweighted mean of its groups' means
    (RM-Bench's domains); ``strata``: labels items are resampled within (each stratum keeps its size); ``clusters``:
    labels of items resampled together (a prompt's block); ``binary``: the metrics whose items are right / wrong
    (1.0 / 0.0), where the exact sign test over units (`sign_test_p`) applies to a paired delta."""

    keys: list
    values: dict[str, np.ndarray]
    groups: dict[str, np.ndarray] = field(default_factory=dict)
    strata: np.ndarray | None = None
    clusters: np.ndarray | None = None
    binary: tuple[str, ...] = ()

    def take(self, index: np.ndarray) -> Items:
        """The items at ``index`` (in that order)."""
        pick = (lambda a: None if a is None else np.asarray(a, dtype=object)[index])
        return Items([self.keys[i] for i in index], {k: v[index] for k, v in self.values.items()},
                     {k: np.asarray(g, dtype=object)[index] for k, g in self.groups.items()}, pick(self.strata),
                     pick(self.clusters), self.binary)


def _codes(labels: Any, n: int) -> np.ndarray:
    """Integer codes of ``labels`` in the sorted order of their text (0 for all when None)."""
    if labels is None:
        return np.zeros(n, dtype=np.int64)
    return np.unique(np.asarray([str(x) for x in labels], dtype=object), return_inverse=True)[1].reshape(-1)


def _weights(values: np.ndarray, groups: Any) -> np.ndarray:
    """Per-item weights of one metric: 0 where the value is not finite; else 1, or 1 / (finite items of its group)
    so that the weighted mean is the mean of the group means."""
    finite = np.isfinite(values)
    if groups is None:
        return finite.astype(np.float64)
    codes = _codes(groups, len(values))
    sizes = np.bincount(codes[finite], minlength=codes.max() + 1 if len(codes) else 0)
    return np.where(finite, 1.0 / np.maximum(sizes[codes], 1), 0.0)


def _unit_sums(values: np.ndarray, weights: np.ndarray, strata: Any, clusters: Any):
    """Per resampling unit (an item, or a cluster of items): the weighted sums (num) and weights (den) of each column,
    and its stratum. Units are in a canonical order (clusters by label; items by their values, weights and stratum),
    so the same items in any row order give the same resamples."""
    n = len(values)
    strata_codes = _codes(strata, n)
    num, den = np.where(weights > 0, values, 0.0) * weights, weights
    if clusters is None:
        order = np.lexsort([*num.T, *den.T, strata_codes][::-1]) if n else np.arange(0)
        return num[order], den[order], strata_codes[order]
    unit = _codes(clusters, n)
    n_units = unit.max() + 1 if n else 0
    unit_num, unit_den = np.zeros((n_units, num.shape[1])), np.zeros((n_units, num.shape[1]))
    np.add.at(unit_num, unit, num)
    np.add.at(unit_den, unit, den)
    unit_strata = np.zeros(n_units, dtype=np.int64)
    unit_strata[unit] = strata_codes
    if np.any(unit_strata[unit] != strata_codes):
        raise ValueError("a cluster's items lie in different strata: resampling within strata cannot keep it whole")
    return unit_num, unit_den, unit_strata


def _resampled(num: np.ndarray, den: np.ndarray, strata: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, columns) weighted means of the bootstrap resamples: each draws, within each stratum, as many units
    as the stratum holds, with replacement (numpy's PCG64 seeded with ``seed``)."""
    rng = np.random.default_rng(seed)
    n_units = len(num)
    members = [np.flatnonzero(strata == s) for s in np.unique(strata)]
    out = np.empty((n_resamples, num.shape[1]))
    for start in range(0, n_resamples, _CHUNK):
        b = min(_CHUNK, n_resamples - start)
        drawn = np.concatenate([m[rng.integers(0, len(m), size=(b, len(m)))] for m in members], axis=1)
        flat = (drawn + np.arange(b)[:, None] * n_units).ravel()
        counts = np.bincount(flat, minlength=b * n_units).reshape(b, n_units).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[start:start + b] = (counts @ num) / (counts @ den)
    return out


def _bootstrap(values: np.ndarray, weights: np.ndarray, strata: Any, clusters: Any, n_resamples: int,
               seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(point estimates (columns,), resampled estimates (n_resamples, columns)) of weighted means."""
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    num, den, unit_strata = _unit_sums(values, weights, strata, clusters)
    with np.errstate(invalid="ignore", divide="ignore"):
        point = num.sum(axis=0) / den.sum(axis=0)
    if not len(num):
        return point, np.full((n_resamples, values.shape[1]), np.nan)
    return point, _resampled(num, den, unit_strata, n_resamples, seed)


def _interval(stats: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of each column (NaN where no resample gave a finite figure)."""
    tail = (1 - confidence) / 2
    low, high = np.full(stats.shape[1], np.nan), np.full(stats.shape[1], np.nan)
    ok = np.isfinite(stats).any(axis=0)
    if ok.any():
        low[ok], high[ok] = np.nanquantile(stats[:, ok], [tail, 1 - tail], axis=0)
    return low, high


def bootstrap_ci(values: Any, *, groups: Any = None, strata: Any = None, clusters: Any = None,
                 n_resamples: int = N_RESAMPLES, seed: int = 0, confidence: float = CONFIDENCE) -> dict[str, float]:
    """The mean of per-item ``values`` (NaN items left out; with ``groups``, the mean of the group means) and its
    percentile bootstrap interval: ``{value, ci_low, ci_high, n}``. ``strata``: resample within each (its size kept);
    ``clusters``: items drawn together. Seeded and vectorised; the same items in any order give the same interval."""
    v = np.asarray(values, dtype=np.float64).reshape(-1, 1)
    point, stats = _bootstrap(v, _weights(v[:, 0], groups)[:, None], strata, clusters, n_resamples, seed)
    low, high = _interval(stats, confidence)
    units = n_units(v[:, 0], clusters)
    if units < 2:  # one unit resampled gives back the same figure: no interval, not a zero-width one
        low[0] = high[0] = math.nan
    return {"value": float(point[0]), "ci_low": float(low[0]), "ci_high": float(high[0]),
            "n": int(np.isfinite(v).sum()), "n_units": units}


def n_units(values: np.ndarray, clusters: Any = None) -> int:
    """How many units of independence hold a finite value: clusters (a source sample's items), else items. A figure
    of fewer than 2 has no interval: every resample draws its one unit, and gives back the same figure."""
    finite = np.isfinite(np.asarray(values, dtype=np.float64))
    if clusters is None:
        return int(finite.sum())
    return len({str(c) for c, held in zip(clusters, finite) if held})


def _two_sided_binomial(k: int, n: int) -> float:
    """Exact two-sided p of k successes in n draws of Binomial(n, 1/2): min(1, 2 P(X <= min(k, n - k))); 1.0 when
    n = 0. Integer arithmetic (no normal approximation)."""
    if n == 0:
        return 1.0
    term = tail = 1  # C(n, 0); C(n, j) = C(n, j - 1) (n - j + 1) / j, exact in integers
    for j in range(1, min(k, n - k) + 1):
        term = term * (n - j + 1) // j
        tail += term
    return min(1.0, 2 * tail / 2**n)


def mcnemar_p(correct_trained: Any, correct_base: Any) -> float:
    """Exact two-sided McNemar p-value of two judges right / wrong on the same items, each item its own unit: over
    the items whose correctness changed (b gained, c lost), P = min(1, 2 * P(X <= min(b, c))) with
    X ~ Binomial(b + c, 1/2); 1.0 when none changed. Items that are not independent (two orders of one pair) need
    `sign_test_p` with their clusters."""
    t, b = np.asarray(correct_trained, dtype=bool), np.asarray(correct_base, dtype=bool)
    if t.shape != b.shape:
        raise ValueError(f"mcnemar_p needs the same items twice, got {t.shape} and {b.shape}")
    gained, lost = int(np.sum(t & ~b)), int(np.sum(~t & b))
    return _two_sided_binomial(gained, gained + lost)


def _unit_differences(trained: Any, base: Any, weights: Any, clusters: Any) -> tuple[np.ndarray, np.ndarray]:
    """(per unit and column: the weighted sum of trained - base over its items, in a canonical order; per unit and
    column: whether it holds an item finite on both sides). A unit is a cluster, or an item without clusters."""
    t = np.asarray(trained, dtype=np.float64)
    b = np.asarray(base, dtype=np.float64)
    t, b = (t[:, None], b[:, None]) if t.ndim == 1 else (t, b)
    both = np.isfinite(t) & np.isfinite(b)
    w = np.ones_like(t) if weights is None else np.asarray(weights, dtype=np.float64).reshape(t.shape)
    diff = np.where(both, (t - b) * w, 0.0)
    present = both.astype(np.float64)
    if clusters is not None:
        unit = _codes(clusters, len(diff))
        n_units = unit.max() + 1 if len(unit) else 0
        summed, held = np.zeros((n_units, diff.shape[1])), np.zeros((n_units, diff.shape[1]))
        np.add.at(summed, unit, diff)
        np.add.at(held, unit, present)
        diff, present = summed, held
    order = np.lexsort(diff.T[::-1]) if len(diff) else np.arange(0)
    return diff[order], present[order] > 0  # the same items in any order: the same units


def sign_test_p(trained: Any, base: Any, *, weights: Any = None, clusters: Any = None) -> np.ndarray:
    """Exact two-sided sign test of each column of ``trained`` - ``base`` (n,) or (n, m), one count per unit of
    independence (a cluster, else an item): each unit's weighted difference summed over its items; under no
    difference a unit that changed is as likely to have gained as lost, so the p-value is `_two_sided_binomial` of the
    units that gained among those that changed (Dixon and Mood, 1946). Units that did not change carry no
    information. With one item per unit and right / wrong items it is `mcnemar_p` exactly. Items NaN on either side
    are left out. Ten pairs in both orders, the trained judge right on 4 pairs in both orders where the base is
    always wrong: 4 units gained, none lost, p = 2 / 2**4 = 0.125 (McNemar over the 20 rows: 0.0078)."""
    diff, _ = _unit_differences(trained, base, weights, clusters)
    scale = np.abs(diff).max(axis=0, initial=0.0)
    eps = 1e-9 * np.maximum(scale, 1e-300)  # a unit's float sum of +x and -x is no change
    gained, lost = (diff > eps).sum(axis=0), (diff < -eps).sum(axis=0)
    return np.asarray([_two_sided_binomial(int(g), int(g + l)) for g, l in zip(gained, lost)])


def smallest_p(n_units: int) -> float:
    """The smallest two-sided p-value a paired test on ``n_units`` units can give: every unit changed, all the same
    way, 2 / 2**n_units (1.0 without units). A category whose smallest p is not under the threshold cannot be shown
    to have changed, whatever its figures."""
    return 1.0 if n_units < 1 else min(1.0, 2.0 ** (1 - n_units))


def items_intervals(items: Items, *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                    confidence: float = CONFIDENCE) -> dict[str, dict[str, float]]:
    """{metric: {value, ci_low, ci_high, n, n_units}} of every metric of ``items``, all from the same resamples; a
    metric whose items lie in fewer than 2 units (`n_units`) has no interval (its bounds NaN)."""
    names = list(items.values)
    values = np.column_stack([items.values[k] for k in names]) if names else np.zeros((len(items.keys), 0))
    weights = np.column_stack([_weights(items.values[k], items.groups.get(k)) for k in names]) if names else values
    point, stats = _bootstrap(values, weights, items.strata, items.clusters, n_resamples, seed)
    low, high = _interval(stats, confidence)
    units = [n_units(values[:, j], items.clusters) for j in range(len(names))]
    for j, held in enumerate(units):
        if held < 2:  # one unit (a single source sample): no interval, not a zero-width one (`n_units`)
            low[j] = high[j] = math.nan
    return {k: {"value": float(point[j]), "ci_low": float(low[j]), "ci_high": float(high[j]),
                "n": int(np.isfinite(values[:, j]).sum()), "n_units": units[j]} for j, k in enumerate(names)}


def paired_difference(trained: Items, base: Items, *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                      confidence: float = CONFIDENCE,
                      centres: Mapping[str, float] | None = None) -> dict[str, dict[str, float]]:
    """Trained against base on the items both hold (paired by key), for each metric both have.

    Per metric: ``trained``, ``base`` and ``delta`` (trained - base) with their percentile intervals
    (``<name>_ci_low``, ``<name>_ci_high``), all three from the same resamples of the paired units (a resample draws
    a unit, a cluster of items or an item, for both judges at once), ``p_value`` and ``p_method``: ``sign_test``
    (`sign_test_p`, exact, one count per unit: McNemar's test when each unit is one item) for right / wrong items,
    else ``sign_flip`` (`sign_flip_p`: the paired randomization test over units, as many flips as resamples), ``n``
    (the items counted) and ``n_units`` (the units they lie in: what the test counts). An item is counted in a metric only where both values are finite. Also ``n_only_trained`` /
    ``n_only_base``: items of one side alone, left out. A metric no item holds on both sides (nothing measured it)
    is left out. ``centres``: {metric: the value it is best at}; such a metric also gets ``distance_delta`` (how much
    further from its centre the trained figure is than the base's) with its interval (``distance_delta_ci_low``,
    ``distance_delta_ci_high``) from the same resamples and its own paired test's ``distance_p_value``
    (`distance_flip_p`: the raw difference's p-value says nothing of the distance)."""
    where = {k: i for i, k in enumerate(base.keys)}
    if len(where) != len(base.keys) or len(set(trained.keys)) != len(trained.keys):
        raise ValueError("paired_difference needs unique item keys on both sides")
    t_idx = np.asarray([i for i, k in enumerate(trained.keys) if k in where], dtype=np.int64)
    b_idx = np.asarray([where[trained.keys[i]] for i in t_idx], dtype=np.int64)
    t, b = trained.take(t_idx), base.take(b_idx)
    names = [k for k in t.values if k in b.values]
    out: dict[str, dict[str, float]] = {}
    if names:
        tv = np.column_stack([t.values[k] for k in names])
        bv = np.column_stack([b.values[k] for k in names])
        both = np.isfinite(tv) & np.isfinite(bv)
        tv, bv = np.where(both, tv, np.nan), np.where(both, bv, np.nan)
        weights = np.column_stack([_weights(col, t.groups.get(k)) for k, col in zip(names, tv.T)])
        point, stats = _bootstrap(np.hstack([tv, bv]), np.hstack([weights, weights]), t.strata, t.clusters,
                                  n_resamples, seed)
        m = len(names)
        delta_point, delta_stats = point[:m] - point[m:], stats[:, :m] - stats[:, m:]
        (t_low, b_low), (t_high, b_high) = (np.split(x, 2) for x in _interval(stats, confidence))
        d_low, d_high = _interval(delta_stats, confidence)
        flipped = sign_flip_p(tv, bv, weights=weights, clusters=t.clusters, n_flips=n_resamples, seed=seed)
        signs = sign_test_p(tv, bv, weights=weights, clusters=t.clusters)
        _, held = _unit_differences(tv, bv, weights, t.clusters)
        distance = _distance_deltas(names, point, stats, centres or {}, confidence)
        for j, k in enumerate(names):  # a figure best at a value: its distance's own paired test
            if k in distance:
                distance[k]["distance_p_value"] = distance_flip_p(tv[:, j], bv[:, j], centres[k], weights=weights[:, j],
                                                                  clusters=t.clusters, n_flips=n_resamples, seed=seed)
        for j, k in enumerate(names):
            if not both[:, j].any():
                continue  # no item measured on both sides: no figure
            binary = k in t.binary and k in b.binary
            out[k] = {**distance.get(k, {}), "trained": float(point[j]), "trained_ci_low": float(t_low[j]),
                      "trained_ci_high": float(t_high[j]), "base": float(point[m + j]),
                      "base_ci_low": float(b_low[j]), "base_ci_high": float(b_high[j]),
                      "delta": float(delta_point[j]), "delta_ci_low": float(d_low[j]),
                      "delta_ci_high": float(d_high[j]),
                      "p_value": float(signs[j] if binary else flipped[j]),
                      "p_method": "sign_test" if binary else "sign_flip",
                      "n": int(both[:, j].sum()), "n_units": int(held[:, j].sum())}
    extra = {"n_only_trained": len(trained.keys) - len(t_idx), "n_only_base": len(base.keys) - len(b_idx)}
    return {k: {**v, **extra} for k, v in out.items()} if out else {}


def _distance_deltas(names: list[str], point: np.ndarray, stats: np.ndarray, centres: Mapping[str, float],
                     confidence: float) -> dict[str, dict[str, float]]:
    """For each metric with a centre: |trained - c| - |base - c| at the point and its percentile interval over the
    resamples (``point`` and ``stats`` hold the trained columns, then the base's)."""
    m, out = len(names), {}
    for j, k in enumerate(names):
        if k in centres:
            c = centres[k]
            resampled = (np.abs(stats[:, j] - c) - np.abs(stats[:, m + j] - c))[:, None]
            low, high = _interval(resampled, confidence)
            out[k] = {"distance_delta": float(abs(point[j] - c) - abs(point[m + j] - c)),
                      "distance_delta_ci_low": float(low[0]), "distance_delta_ci_high": float(high[0])}
    return out


def distance_flip_p(trained: Any, base: Any, centre: float, *, weights: Any = None, clusters: Any = None,
                    n_flips: int = N_RESAMPLES, seed: int = 0) -> float:
    """Two-sided p-value of the paired randomization test of a change of distance from ``centre``: the statistic is
    |trained figure - centre| - |base figure - centre| (each figure the weighted mean of its items); under no
    difference each unit's (cluster's, else item's) trained and base sides are exchangeable, so each flip swaps them
    unit by unit. p = (1 + flips whose |statistic| reaches the observed one) / (n_flips + 1). A lean of 0.3 against 0.7
    around 0.5 (the same distance on the other side) gives a statistic of 0 under every flip: p = 1, whatever the
    float path makes of 0.2 - 0.2. NaN without an item finite on both sides."""
    t = np.asarray(trained, dtype=np.float64).reshape(-1)
    b = np.asarray(base, dtype=np.float64).reshape(-1)
    both = np.isfinite(t) & np.isfinite(b)
    w = np.where(both, 1.0 if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1), 0.0)
    sides = np.column_stack([np.where(both, t, 0.0) * w, np.where(both, b, 0.0) * w])
    total = float(w.sum())
    if total <= 0:
        return math.nan
    if clusters is not None:
        unit = _codes(clusters, len(sides))
        summed = np.zeros((unit.max() + 1, 2))
        np.add.at(summed, unit, sides)
        sides = summed
    sides = sides[np.lexsort(sides.T[::-1])]  # canonical unit order: the same items in any order, the same flips
    middle = float(sides.sum()) / (2 * total) - centre  # the mean of both sides' figures, from the centre
    half = (sides[:, 0] - sides[:, 1]) / (2 * total)  # each unit's pull of the trained figure away from the middle
    statistic = (lambda x: np.abs(np.abs(middle + x) - np.abs(middle - x)))
    observed = float(statistic(half.sum()))
    reach = observed * (1 - 1e-9) - RESOLUTION * max(1.0, abs(middle) + abs(centre))  # equal sums count (floats)
    rng, hits = np.random.default_rng(seed), 0
    for start in range(0, n_flips, _CHUNK):
        signs = rng.integers(0, 2, size=(min(_CHUNK, n_flips - start), len(half))) * 2.0 - 1.0
        hits += int((statistic(signs @ half) >= reach).sum())
    return (1 + hits) / (n_flips + 1)


def resolution(*values: Any) -> float:
    """A figure's own resolution: the smallest difference that is a change and not float rounding, `RESOLUTION`
    relative to the largest of the finite ``values`` (at least 1: figures between 0 and 1 get 1e-9)."""
    finite = [abs(float(v)) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return RESOLUTION * max([1.0, *finite])


def sign_flip_p(trained: Any, base: Any, *, weights: Any = None, clusters: Any = None, n_flips: int = N_RESAMPLES,
                seed: int = 0) -> np.ndarray:
    """Two-sided p-value of the paired randomization (sign-flip) test of each column of ``trained`` - ``base`` (n,) or
    (n, m): under no difference each item's (or cluster's) weighted difference is as likely negative as positive;
    p = (1 + flips whose |sum| reaches the observed |sum|) / (n_flips + 1), so never below 1 / (n_flips + 1). Items
    NaN on either side are left out. On right / wrong items `sign_test_p` computes the exact p-value instead."""
    diff, _ = _unit_differences(trained, base, weights, clusters)
    observed = np.abs(diff.sum(axis=0))
    reach = observed * (1 - 1e-9) - 1e-12  # a flip whose sum equals the observed one counts (float sums)
    rng, hits = np.random.default_rng(seed), np.zeros(diff.shape[1])
    for start in range(0, n_flips, _CHUNK):
        signs = rng.integers(0, 2, size=(min(_CHUNK, n_flips - start), len(diff))) * 2.0 - 1.0
        hits += (np.abs(signs @ diff) >= reach).sum(axis=0)
    return (1 + hits) / (n_flips + 1)


def holm(p_values: Mapping[str, float], alpha: float) -> list[str]:
    """The names whose p-value stays under ``alpha`` after Holm's step-down correction across all of them (Holm,
    1979): sorted p_(1) <= ... <= p_(m), the i-th is significant while p_(j) < alpha / (m - j + 1) for every j <= i.
    In ascending order of p-value (ties by name)."""
    tested = sorted((float(p), name) for name, p in p_values.items())
    out: list[str] = []
    for i, (p, name) in enumerate(tested):
        if p >= alpha / (len(tested) - i):
            break  # this and every larger p-value stand
        out.append(name)
    return out
