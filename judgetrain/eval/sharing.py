"""Prefix-shared scoring: each shared prompt runs once and its key/value cache serves every sequence built on it.

Every scored sequence of one engine call is split at two token boundaries into three segments:

- the *suite prefix*: the longest token prefix common to all rows of the call (the chat template's opening, the
  judge rubric every JudgeBias prompt repeats); one forward of batch 1;
- the *row segment*: the rest of the tokens all of a row's sequences share (implicit scoring: the row's prompt, as
  TRL tokenises it); one forward per group of rows, on the suite prefix's cache expanded to the group;
- the *leaf*: what is left of each sequence (a response; in judge mode the end of the judge prompt); forwards in
  token-budget chunks, each on its rows' cache expanded to one entry per leaf.

Padding: every segment is left-padded within its batch and the attention masks are concatenated, so a batch entry
reads ``[suite prefix][pads][row segment][pads][leaf]`` with the pads masked and the position ids counting real
tokens only. Each token sees the same tokens at the same positions as in the unshared sequence, so the scores equal
the unshared engine's up to float summation order. The split is made on the token ids the unshared path builds
(TRL's tokenisation of prompt + response, cut at their common prefix), never by tokenising the prompt alone; a row
sequence whose scored-from prefix differs from its row's other sequences (a prompt that ``truncate_prompt`` cut for
that response alone) is scored unshared.

Where the cache cannot be reused this way, `judgetrain.models.attention.prefix_sharing_problem` (``cache=True``)
names the reason and the engine warns and scores
unshared: a forward without ``cache``/``past_key_values`` or ``position_ids``, an attention implementation other than
``sdpa`` / ``eager`` (flash-attention kernels read padding differently; flex attention untested), and cache layers
other than full attention (sliding-window or chunked attention: the hole left by padding would move the window;
linear / recurrent state and KV-sharing layers cannot be expanded per sequence).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from judgetrain.compat.transformers import cache_keyword, output_cache, select_cache_entries
from judgetrain.eval.batching import MIN_FILL, budget_batches, common_prefix_length

MIN_SUITE_PREFIX = 8  # a shorter common prefix is not worth a forward of its own


@dataclass
class SharedRow:
    """One row's sequences sharing ``prefix`` (token ids); ``leaves[i]`` is sequence ``seqs[i]`` after it.

    ``mode`` ``logps``: each leaf is scored from ``first_scored`` (= len(prefix): the leaf's first token, predicted from
    the prefix's last). ``judge``: the score is read after a leaf's last token; a row with one sequence has no leaf and
    is read after the prefix (``terminal``)."""

    row: int
    prefix: list[int]
    seqs: list[Any]
    leaves: list[list[int]] = field(default_factory=list)
    terminal: bool = False


def plan_rows(seqs: Sequence[Any], judge: bool) -> tuple[list[SharedRow], list[Any]]:
    """Group sequences (`judgetrain.eval.sequences.TokenSequence`: row, slot, ids, start) into shareable rows;
    return (rows, sequences left unshared).

    logps mode: the sequences of a row that have the same start and the same tokens before it share them (a
    response whose prompt ``truncate_prompt`` cut on its own is scored whole). judge mode: a row shares the common
    token prefix of its judge prompts (at least one token left per sequence); a single judge prompt runs as one
    segment."""
    by_key: dict[tuple, list[Any]] = {}
    for s in seqs:
        key = (s.row,) if judge else (s.row, s.start, tuple(s.ids[: s.start]))
        by_key.setdefault(key, []).append(s)
    rows: list[SharedRow] = []
    unshared: list[Any] = []
    for key, group in by_key.items():
        if judge and len(group) == 1:
            rows.append(SharedRow(key[0], list(group[0].ids), group, terminal=True))
            continue
        if judge:
            n = min(len(s.ids) for s in group) - 1
            for s in group[1:]:
                n = min(n, common_prefix_length(group[0].ids, s.ids))
        else:
            n = group[0].start
        if n < 1 or len(group) < 2:
            unshared.extend(group)
            continue
        rows.append(SharedRow(key[0], list(group[0].ids[:n]), group, [list(s.ids[n:]) for s in group]))
    return rows, unshared


def shared_token_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix common to every sequence, leaving each at least one token of its own; 0 for fewer
    than two sequences or a prefix shorter than MIN_SUITE_PREFIX (not worth a forward of its own)."""
    if len(seqs) < 2:
        return 0
    n = min(len(s) for s in seqs) - 1
    first = seqs[0]
    for s in seqs[1:]:
        n = min(n, common_prefix_length(first, s))
        if n < MIN_SUITE_PREFIX:
            return 0
    return n if n >= MIN_SUITE_PREFIX else 0


def suite_prefix(rows: Sequence[SharedRow]) -> int:
    """Length of the token prefix common to every row's prefix, leaving each row at least one token of its own."""
    return shared_token_prefix([r.prefix for r in rows])


def group_rows(rows: Sequence[SharedRow], batch_tokens: int, max_batch: int) -> list[list[SharedRow]]:
    """Rows in groups whose row forward fits the budget (rows x longest prefix, suite prefix included); longest
    prefixes first so a group pads little."""
    order = sorted(rows, key=lambda r: (-len(r.prefix), -max((len(x) for x in r.leaves), default=0), r.row))
    return budget_batches(order, lambda r: len(r.prefix), batch_tokens, max_batch)


def leaf_chunks(group: Sequence[SharedRow], batch_tokens: int, max_batch: int) -> list[list[tuple[int, int]]]:
    """(row position in group, leaf index) chunks: longest leaves first, a chunk grows while
    entries x (longest row prefix + longest leaf) fits the budget (the key/value length each leaf attends over), and
    while a leaf is at least `MIN_FILL` of the chunk's longest (the leaves are what the chunk's forward pads)."""
    past = max(len(r.prefix) for r in group)
    items = [(g, i) for g, r in enumerate(group) for i, leaf in enumerate(r.leaves) if leaf]
    items.sort(key=lambda gi: -len(group[gi[0]].leaves[gi[1]]))
    return budget_batches(items, lambda gi: past + len(group[gi[0]].leaves[gi[1]]), batch_tokens, max_batch,
                          padded=lambda gi: len(group[gi[0]].leaves[gi[1]]), min_fill=MIN_FILL)


def count_forwards(rows: Sequence[SharedRow], batch_tokens: int, max_batch: int) -> int:
    """Forwards `SharedScorer.score` will run for these rows (every rank must run as many under sharded weights)."""
    if not rows:
        return 0
    shared = suite_prefix(rows)
    groups = group_rows(rows, batch_tokens, max_batch)
    return int(shared > 0) + len(groups) + sum(len(leaf_chunks(g, batch_tokens, max_batch)) for g in groups)


class SharedScorer:
    """Runs the three-level forward for a list of `SharedRow`s and returns {(row, slot): value}.

    ``token_logps(logits, targets)`` gives log p(target) per position; ``judge_value(last_logits)`` turns the logits
    after a judge prompt into its expected score. ``stats`` (an ``EngineStats``) gets real and padded tokens."""

    def __init__(self, model: torch.nn.Module, pad_id: int, stats: Any, token_logps: Callable, judge_value: Callable,
                 logits_to_keep: bool):
        self.model = model
        self.pad_id = pad_id
        self.stats = stats
        self.token_logps = token_logps
        self.judge_value = judge_value
        self.logits_to_keep = logits_to_keep
        self.cache_kw = cache_keyword(model)
        self.device = next(model.parameters()).device
        self.before_forward: Callable | None = None  # called before each forward (the engine's stop point)

    # -------------------------------------------------------------------------------------------- one forward
    def _forward(self, segments: list[list[int]], past: Any, past_mask: torch.Tensor | None,
                 next_pos: torch.Tensor | None, keep: int):
        """Left-padded segments on top of ``past`` (one entry per segment). Returns (logits of the last ``keep``
        columns, the cache now holding past + segments, the full attention mask, the next position per entry)."""

        if self.before_forward is not None:
            self.before_forward()
        longest = max(len(s) for s in segments)
        ids = torch.full((len(segments), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(segments), longest), dtype=torch.long)
        for i, s in enumerate(segments):
            ids[i, longest - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, longest - len(s):] = 1
        self.stats.real_tokens += int(mask.sum())
        self.stats.padded_tokens += ids.numel()
        ids, mask = ids.to(self.device), mask.to(self.device)
        start = next_pos if next_pos is not None else torch.zeros(len(segments), dtype=torch.long, device=self.device)
        pos = start[:, None] + (mask.cumsum(-1) - 1).clamp(min=0)
        full_mask = mask if past_mask is None else torch.cat([past_mask, mask], dim=-1)
        kwargs = {"input_ids": ids, "attention_mask": full_mask, "position_ids": pos, "use_cache": True,
                  self.cache_kw: past if past is not None else DynamicCache()}
        if self.logits_to_keep:
            kwargs["logits_to_keep"] = keep
        out = self.model(**kwargs)
        return out.logits[:, -keep:, :], output_cache(out), full_mask, start + mask.sum(-1), ids

    @staticmethod
    def _select(cache: Any, index: torch.Tensor):
        """A new cache with one entry per ``index`` (repeats allowed); ``cache`` itself is left as it is."""
        return select_cache_entries(cache, index)

    # -------------------------------------------------------------------------------------------- all rows
    def score(self, rows: Sequence[SharedRow], judge: bool, batch_tokens: int, max_batch: int) -> dict:
        out: dict[tuple[int, int], float] = {}
        for r in rows:  # empty leaves (a response that tokenizes to nothing) score 0 without a forward
            for s, leaf in zip(r.seqs, r.leaves):
                if not leaf:
                    out[(s.row, s.slot)] = 0.0
        if not rows:
            return out
        shared = suite_prefix(rows)
        root = root_mask = root_pos = None
        if shared:
            _, root, root_mask, root_pos, _ = self._forward([rows[0].prefix[:shared]], None, None, None, 1)
        for group in group_rows(rows, batch_tokens, max_batch):
            self._score_group(group, shared, (root, root_mask, root_pos), judge, batch_tokens, max_batch, out)
        return out

    def _score_group(self, group, shared, root, judge, batch_tokens, max_batch, out) -> None:
        root_cache, root_mask, root_pos = root
        n = len(group)
        past = past_mask = next_pos = None
        if root_cache is not None:
            zeros = torch.zeros(n, dtype=torch.long, device=self.device)
            past, past_mask, next_pos = self._select(root_cache, zeros), root_mask[zeros], root_pos[zeros]
        logits, cache, mask, pos, _ = self._forward([r.prefix[shared:] for r in group], past, past_mask, next_pos, 1)
        last = logits[:, -1, :].float()
        if judge:
            values = self.judge_value(last)
            for g, r in enumerate(group):
                if r.terminal:
                    out[(r.seqs[0].row, r.seqs[0].slot)] = float(values[g])
        else:  # each leaf's first token is predicted from the row's last prompt token
            lse = torch.logsumexp(last, dim=-1)
            for g, r in enumerate(group):
                for s, leaf in zip(r.seqs, r.leaves):
                    if leaf:
                        out[(s.row, s.slot)] = float(last[g, leaf[0]] - lse[g])
        for chunk in leaf_chunks(group, batch_tokens, max_batch):
            self._score_chunk(group, chunk, (cache, mask, pos), judge, out)

    def _score_chunk(self, group, chunk, parent, judge, out) -> None:
        cache, mask, pos = parent
        index = torch.tensor([g for g, _ in chunk], dtype=torch.long, device=self.device)
        leaves = [group[g].leaves[i] for g, i in chunk]
        keep = 1 if judge else max(len(x) for x in leaves)
        logits, _, _, _, ids = self._forward(leaves, self._select(cache, index), mask[index], pos[index], keep)
        seqs = [group[g].seqs[i] for g, i in chunk]
        if judge:
            for s, v in zip(seqs, self.judge_value(logits[:, -1, :].float())):
                out[(s.row, s.slot)] = float(v)
            return
        if keep < 2:
            return
        token_logps = self.token_logps(logits[:, :-1, :], ids[:, ids.shape[1] - keep + 1:])  # (B, keep - 1)
        for b, (s, leaf) in enumerate(zip(seqs, leaves)):
            rest = len(leaf) - 1
            if rest:
                out[(s.row, s.slot)] += float(token_logps[b, token_logps.shape[1] - rest:].double().sum())
