"""Mixtures of preference datasets, as a recipe names them.

    load_mixture([
        {"dataset": "judgebias", "source": "bundled", "split": "train", "weight": 1.0, "categories": ["error"]},
        {"dataset": "ideation", "source": "bundled", "split": "train", "rows": 40, "mode": "pairwise"},
    ], seed=0)

``weight`` is the fraction of that component's (filtered) rows to use, as alignment-handbook's dataset_mixer
reads it (above 1 repeats whole passes, then a seeded remainder); ``rows`` is an exact row count. Every other key
goes to the adapter (categories, types, mode, on_bad_row, ...). The result keeps prompt / chosen / rejected and
adds ``dataset`` (the component's name, or its ``name`` key when given), ``group`` and ``tie`` (the ``preference``
adapter's column, false for the other adapters), shuffled with the seed.
"""

# Late imports: judgetrain.data (inside the functions that use them): `judgetrain data check` and `pairs build` read
# rows without a model: tokenizer and training libraries come in with the functions that need them.

from __future__ import annotations

import inspect
import logging
import random

import datasets

from judgetrain.config.recipe import MIXTURE_KEYS

from .io import message_feature
from .sampling import deterministic_subset

logger = logging.getLogger(__name__)


def _adapters():
    from .ideation import load_ideation
    from .judgebias import load_judgebias
    from .preference import load_preference

    return {"judgebias": load_judgebias, "ideation": load_ideation, "preference": load_preference}


def component_source(comp: dict) -> str | None:
    """The source a ``train_datasets`` component reads: its ``source``, else its adapter's default; None for an
    unknown dataset (the mixture names it)."""

    adapter = _adapters().get(comp.get("dataset"))
    if adapter is None:
        return None
    return comp.get("source", inspect.signature(adapter).parameters["source"].default)


def component_keys(dataset: str) -> list[str]:
    """The keys a ``dataset`` component takes: the mixture's own and the keyword parameters of its adapter."""

    adapter = _adapters()[dataset]
    return [*MIXTURE_KEYS, *inspect.signature(adapter).parameters]


def mixture_features() -> datasets.Features:
    msgs = message_feature()
    return datasets.Features({"prompt": msgs, "chosen": msgs, "rejected": msgs, "dataset": datasets.Value("string"),
                              "group": datasets.Value("string"), "tie": datasets.Value("bool")})


def load_component(component: dict, seed: int = 0) -> datasets.Dataset:
    comp = dict(component)
    name = comp.pop("dataset", None)
    adapters = _adapters()
    if name not in adapters:
        raise ValueError(f"mixture component needs dataset in {sorted(adapters)}, got {name!r}")
    label = comp.pop("name", name)
    weight, rows = comp.pop("weight", None), comp.pop("rows", None)
    if weight is not None and rows is not None:
        raise ValueError(f"mixture component {label!r} takes weight or rows, not both")
    if weight is None and rows is None:
        weight = 1.0  # the whole component, once
    comp.setdefault("seed", seed)
    ds = adapters[name](**comp)
    n = len(ds)
    if rows is not None:
        if int(rows) != rows or rows < 0:
            raise ValueError(f"rows must be a non-negative integer, got {rows!r}")
        k = int(rows)
    else:
        if not isinstance(weight, (int, float)) or weight < 0:
            raise ValueError(f"weight must be a non-negative number, got {weight!r}")
        k = round(weight * n)
    if n == 0 and k:
        raise ValueError(f"mixture component {label!r} has no rows to draw {k} from")
    if k > n:
        logger.info("mixture component %s: %d rows drawn from %d (rows repeat)", label, k, n)
    idx = deterministic_subset(n, k, seed) if k != n else list(range(n))
    ds = ds.select(idx)
    groups = ([None if g is None else f"{label}|{g}" for g in ds["group"]] if "group" in ds.column_names
              else [None] * len(ds))
    ties = [bool(t) for t in ds["tie"]] if "tie" in ds.column_names else [False] * len(ds)
    ds = ds.select_columns(["prompt", "chosen", "rejected"])
    ds = ds.add_column("dataset", [label] * len(ds)).add_column("group", groups).add_column("tie", ties)
    return ds.cast(mixture_features())


def load_mixture(components: list[dict], *, seed: int = 0, flatten: bool = True,
                 groups: bool = False) -> datasets.Dataset:
    """Concatenate and shuffle (with ``seed``) the components; see the module docstring. ``flatten=False``: the
    shuffled order stays an indices mapping over the components' rows instead of a copy of them in that order,
    for a caller whose next step maps every row anyway (the training rows' length audit writes them in that order:
    one full copy of the rows less at start). ``groups``: the shuffle moves whole groups (`grouped_order`)."""
    if not components:
        raise ValueError("a mixture needs at least one component")
    parts = [load_component(c, seed) for c in components]
    mixed = datasets.concatenate_datasets(parts)
    mixed = mixed.select(grouped_order(mixed["group"], seed)) if groups else mixed.shuffle(seed=seed)
    counts = {}
    for p in parts:
        counts[p[0]["dataset"] if len(p) else "?"] = counts.get(p[0]["dataset"] if len(p) else "?", 0) + len(p)
    logger.info("mixture: %d rows (%s)", len(mixed), ", ".join(f"{k} {v}" for k, v in counts.items()))
    return mixed.flatten_indices() if flatten else mixed


def grouped_order(groups: list[str | None], seed: int) -> list[int]:
    """A seeded shuffle of row indices that keeps the rows of each group together, in their order: the units (a
    group's rows, or one row without a group) are shuffled, then laid end to end."""
    units: dict[object, list[int]] = {}
    for i, g in enumerate(groups):
        units.setdefault(("row", i) if g is None else ("group", g), []).append(i)
    order = list(units.values())
    random.Random(seed).shuffle(order)
    return [i for unit in order for i in unit]


def groups_cut(groups: list[str | None], batch_size: int) -> dict[str, int]:
    """How rows in this order fall into consecutive batches of ``batch_size``: ``groups`` (of two rows or more),
    ``cut`` (those whose rows land in more than one batch) and ``largest`` (rows of the largest group)."""
    batches: dict[str, list[int]] = {}  # per group, the batch of each of its rows
    for i, g in enumerate(groups):
        if g is not None:
            batches.setdefault(g, []).append(i // batch_size)
    multi = [b for b in batches.values() if len(b) > 1]
    return {"groups": len(multi), "cut": sum(b[0] != b[-1] for b in multi),
            "largest": max(map(len, batches.values()), default=0)}
