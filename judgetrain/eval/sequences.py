"""Requests -> token sequences, as the scoring engine feeds them to the model; no model needed.

A suite turns each of its rows into a `Request` (`judgetrain.eval.suites.build_requests`). `SequenceBuilder` turns
requests into `TokenSequence`s (one per response, or per judge prompt) and one `RowScore` per row, with the rules the
engine scores by: implicit / log-likelihood sequences tokenised exactly as TRL 1.16's DPOTrainer tokenizes (each prompt
tokenised once where the template gives a boundary, `judgetrain.data.tokenise`), judge prompts rendered up to where the
assistant's content starts and followed by the forced score prefix, and inputs longer than ``max_length`` cut from the
left (``long_inputs="truncate_prompt"``) or skipped (``"skip"``), counted on the row. The ids of a request with a
``cache_key`` are kept and reused while the tokenizer and the length rules stay.

The engine (`judgetrain.eval.scoring.ScoringEngine`) builds its sequences here, and so does the eval rows' length
audit (`judgetrain.eval.rows.audit_eval_lengths`), which needs a tokenizer only.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from judgetrain.data.chat import chat_ids, control_pattern, neutral_messages, text_ids
from judgetrain.data.tokenise import checked_tokens, pair_tokeniser
from judgetrain.eval.batching import common_prefix_length
from judgetrain.eval.requests import LIKELIHOOD_KINDS, Request, RowScore
from judgetrain.models.templates import assistant_prefix

logger = logging.getLogger(__name__)

LONG_INPUT_MODES = ("truncate_prompt", "skip")
DEFAULT_JUDGE_PREFIX = '```json\n{\n  "overall_score": '


@dataclass
class TokenSequence:
    """One sequence the model runs: the ``slot``-th response (or judge prompt) of request ``row``."""

    row: int
    slot: int
    ids: list[int]
    start: int  # first scored token (the likelihood kinds); judge: len(ids) (the score is read after the last token)
    key: str = ""


def as_ids(encoded: Any) -> list[int]:
    ids = encoded["input_ids"] if not isinstance(encoded, list) else encoded
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if ids and isinstance(ids[0], list):  # a batch dimension
        ids = ids[0]
    return list(ids)


def judge_prompt_ids(tokenizer: Any, messages: Any, suffix: str = "") -> list[int]:
    """A judge prompt's token ids up to where the judge writes, then ``suffix`` (judge mode's forced score prefix;
    nothing for generation): the chat template up to where an assistant turn's content starts, as training renders it
    (`judgetrain.models.templates.assistant_prefix`; Qwen3: after the empty think block), encoded without adding
    special tokens; without a chat template the contents joined by newlines, plus one newline. ``messages``: a
    messages list, or a plain string (one user turn)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if getattr(tokenizer, "chat_template", None):  # content neutralised; the template and the suffix are ours
        return as_ids(tokenizer(text=assistant_prefix(tokenizer, list(messages)) + suffix, add_special_tokens=False))
    return text_ids(tokenizer, "\n".join(m["content"] for m in messages) + "\n" + suffix)

class SequenceBuilder:
    """Turns `Request`s into token sequences (see the module doc); keeps the ids of requests with a ``cache_key``.

    Args:
        tokenizer: the tokenizer (chat template used when it has one).
        max_length: longest sequence.
        long_inputs: ``truncate_prompt`` or ``skip``.
        judge_prefix: forced answer prefix after a judge prompt.
    """

    def __init__(self, tokenizer: Any, *, max_length: int, long_inputs: str = "truncate_prompt",
                 judge_prefix: str = DEFAULT_JUDGE_PREFIX) -> None:
        if long_inputs not in LONG_INPUT_MODES:
            raise ValueError(f"long_inputs must be one of {LONG_INPUT_MODES}, got {long_inputs!r}")
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.long_inputs = long_inputs
        self.judge_prefix = judge_prefix
        self._seq_cache: dict[str, tuple[list[tuple[int, np.ndarray, int]], bool, bool]] = {}
        self._seq_cache_of: tuple | None = None
        self._said_no_boundary = False

    def _has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def _chat_ids(self, messages: list[dict], add_generation_prompt: bool = False) -> list[int]:
        """The conversation's ids; control strings inside message content are text (judgetrain.data.chat)."""
        return chat_ids(self.tokenizer, messages, add_generation_prompt=add_generation_prompt)

    def chat_pairs(self, requests: Sequence[Request | None]) -> dict[int, tuple[list[int], list[list[int]]]]:
        """`pair_ids`' ids of the conversational implicit / log-likelihood requests (None: not asked), a batch at once
        with each prompt tokenised once (`judgetrain.data.tokenise.PairTokeniser.rows`: the same ids, the prompt
        rendered and tokenised up to the template's last added token before the responses, the rubric that opens
        every prompt once per process); {} where the tokenizer gives no such boundary (said once), and rows without
        one are left to `pair_ids`."""

        if not self._has_chat_template():
            return {}
        asked = [(r, req) for r, req in enumerate(requests) if req is not None and req.kind in LIKELIHOOD_KINDS
                 and isinstance(req.prompt, (list, str)) and req.responses]
        if not asked:
            return {}
        tokens = checked_tokens(self.tokenizer)
        if tokens is None:
            if not self._said_no_boundary:
                self._said_no_boundary = True
                logger.info("eval: no boundary to tokenise each prompt once for this tokenizer: each response's "
                            "sequence is rendered and tokenised whole, as TRL's DPOTrainer does")
            return {}
        tok, pattern = self.tokenizer, control_pattern(self.tokenizer)
        # as `pair_ids` reads a row under a chat template: a string prompt is the user's turn, a string
        # response the assistant's
        prompts = [neutral_messages([{"role": "user", "content": req.prompt}] if isinstance(req.prompt, str)
                                    else req.prompt, tok, pattern) for _, req in asked]
        completions = [[neutral_messages([{"role": "assistant", "content": x}] if isinstance(x, str) else list(x),
                                         tok, pattern) for x in req.responses] for _, req in asked]
        got = pair_tokeniser(self.tokenizer, tokens).rows(prompts, completions)
        return {r: ids for (r, _), ids in zip(asked, got) if ids is not None}

    def pair_ids(self, prompt: Any, responses: Sequence[Any]) -> tuple[list[int], list[list[int]]]:
        """TRL 1.16 DPOTrainer tokenization of one prompt with several completions."""
        chat = self._has_chat_template()
        if isinstance(prompt, str) and chat:
            prompt = [{"role": "user", "content": prompt}]
        responses = [
            ([{"role": "assistant", "content": r}] if isinstance(r, str) and chat else r) for r in responses
        ]
        if isinstance(prompt, list):
            if not chat:  # a conversational row but no template: render as plain text
                prompt = "\n".join(m["content"] for m in prompt)
                responses = [r if isinstance(r, str) else "\n".join(m["content"] for m in r) for r in responses]
        if isinstance(prompt, list):
            prompt_ids = self._chat_ids(prompt, add_generation_prompt=True)
            full = [self._chat_ids(prompt + list(r)) for r in responses]
        else:  # TRL's plain-text path (prompt + completion + EOS), the text encoded as text
            tok = self.tokenizer
            eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
            prompt_ids = text_ids(tok, prompt, add_special_tokens=True)
            full = [text_ids(tok, prompt + r, add_special_tokens=True) + eos for r in responses]
        prompt_len = min(common_prefix_length(prompt_ids, f) for f in full) if full else len(prompt_ids)
        return prompt_ids[:prompt_len], [f[prompt_len:] for f in full]

    def turn_ids(self, messages: list[dict]) -> list[int]:
        """Prompt tokens up to where the assistant's content starts, as training renders the turn."""
        if not self._has_chat_template():
            return self._chat_ids(messages, add_generation_prompt=True)
        return judge_prompt_ids(self.tokenizer, messages)

    def judge_ids(self, messages: Any) -> list[int]:
        return judge_prompt_ids(self.tokenizer, messages, self.judge_prefix)

    def build(self, requests: Sequence[Request]) -> tuple[list[TokenSequence], list[RowScore]]:
        seqs: list[TokenSequence] = []
        rows: list[RowScore] = []
        self._check_cache()
        cached_of = [self._seq_cache.get(f"{req.kind}|{req.cache_key}") if req.cache_key is not None else None
                     for req in requests]
        pairs = self.chat_pairs([req if cached is None else None for req, cached in zip(requests, cached_of)])
        for r, req in enumerate(requests):
            cached = cached_of[r]
            if cached is not None:  # tokenised at an earlier eval: the same ids (same tokenizer and length rule)
                self._append_cached(r, cached, seqs, rows, len(req.judge_prompts if req.kind == "judge" else req.responses))
                continue
            row_seqs: list[TokenSequence] = []
            truncated = skipped = False
            if req.kind == "judge":
                n = len(req.judge_prompts)
                for slot, prompt in enumerate(req.judge_prompts):
                    ids = self.judge_ids(prompt)
                    if len(ids) > self.max_length:
                        if self.long_inputs == "skip":
                            skipped = True
                            break
                        ids, truncated = ids[-self.max_length :], True
                    row_seqs.append(TokenSequence(r, slot, ids, len(ids)))
            elif req.kind in LIKELIHOOD_KINDS:
                n = len(req.responses)
                prompt_ids, completions = pairs.get(r) or self.pair_ids(req.prompt, req.responses)
                for slot, comp in enumerate(completions):
                    ids, start = prompt_ids + comp, len(prompt_ids)
                    if len(ids) > self.max_length:
                        if self.long_inputs == "skip":
                            skipped = True
                            break
                        truncated = True
                        cut = len(ids) - self.max_length
                        ids = ids[cut:]
                        start = max(start - cut, 1)  # the first kept token has no context to be scored from
                    if not comp:
                        logger.warning("row %d response %d tokenizes to nothing; its score is 0", r, slot)
                    row_seqs.append(TokenSequence(r, slot, ids, start))
            else:
                raise ValueError(f"unknown request kind {req.kind!r}")
            if req.cache_key is not None:
                self._seq_cache[f"{req.kind}|{req.cache_key}"] = (
                    [(s.slot, np.asarray(s.ids, dtype=np.int32), s.start) for s in row_seqs], truncated, skipped)
            if skipped:
                rows.append(RowScore(None, truncated=False, skipped=True))
                continue
            rows.append(RowScore([math.nan] * n, truncated=truncated))
            seqs.extend(row_seqs)
        return seqs, rows

    def _check_cache(self) -> None:
        """Kept token ids stay valid while the tokenizer and the length rules stay; any change drops them."""
        tok = self.tokenizer
        of = (id(tok), getattr(tok, "name_or_path", None), len(tok) if hasattr(tok, "__len__") else None,
              getattr(tok, "chat_template", None), self.max_length, self.long_inputs, self.judge_prefix)
        if of != self._seq_cache_of:
            self._seq_cache.clear()
            self._seq_cache_of = of

    @staticmethod
    def _append_cached(r: int, cached, seqs: list[TokenSequence], rows: list[RowScore], n: int) -> None:
        row_seqs, truncated, skipped = cached
        if skipped:
            rows.append(RowScore(None, truncated=False, skipped=True))
            return
        rows.append(RowScore([math.nan] * n, truncated=truncated))
        seqs.extend(TokenSequence(r, slot, ids.tolist(), start) for slot, ids, start in row_seqs)
