"""TRL's DPOTrainer token ids of conversational rows, each prompt tokenised once.

TRL's DPOTrainer (``_prepare_dataset``) renders and tokenises every row three times: the prompt with the generation
prompt, prompt + chosen, prompt + rejected; the completion starts where the tokenised prompt and the tokenised
prompt + completion diverge. In judge data the prompt is most of each sequence, so most of that work is the same
prompt three times, and the rubric that opens every prompt once more in every row.

A fast (Rust) tokenizer cuts its input at its added tokens (``<|im_start|>``, ``<|eot_id|>``, ...) before anything
else, and tokenises the text between two of them on its own: no token crosses the end of an added token. So the ids
of a rendered conversation are the ids of its text up to the end of such a token, followed by the ids of the rest.
Per row, here:

- the three conversations are rendered as TRL renders them (rendering costs about 1% of tokenising them), and the
  boundary is the end of the last added token that the three texts share: for ChatML the ``<|im_start|>`` of the
  assistant turn, for Llama 3 its ``<|start_header_id|>`` or ``<|end_header_id|>``;
- the shared text before it is tokenised once, and its opening that recurs from row to row (the system turn of a
  judge rubric) once per process;
- the three short rests (``assistant\\n``; ``assistant\\n`` + the evaluation + ``<|im_end|>\\n``, ...) are tokenised,
  and the completion is cut where the prompt's rest and each completion's rest diverge, TRL's own cut
  (``common_prefix_length``): a completion that starts with whitespace or with a character that merges with the
  end of the generation prompt is cut exactly as TRL cuts it.

Where a tokenizer or template gives no such boundary (no fast backend, a pre-tokenizer that marks the start of the
text, an added token that matches only as a word, or ids that differ from TRL's on the probes checked at start),
every row is tokenised as TRL does (`judgetrain.compat.trl.dpo_token_ids`); a row whose texts share no added token
is tokenised that way too, and counted.
"""

# Late imports: trl (inside the functions that use them): `judgetrain data check` and `pairs build` read rows without
# a model: tokenizer and training libraries come in with the functions that need them.

from __future__ import annotations

import json
import re
from typing import Any

from judgetrain.compat.transformers import fast_backend
from judgetrain.compat.trl import TOKEN_COLUMNS, dpo_token_ids

MIN_SHARED_CHARS = 64  # a recurring opening shorter than this is not worth a cache entry
MAX_SHARED = 16  # recurring openings kept per process (a mixture has a few rubrics)
_PROBE_TEXTS = ("Answer.", " Answer.", "\nAnswer.", "\n\n- Answer.", "  \n Answer. ", "\t{\"score\": 4}", "")
_SEARCH_WINDOW = 256


def boundary_tokens(tokenizer) -> tuple[tuple[str, ...] | None, str]:
    """(the added tokens after whose end a rendered text may be cut, longest first; "") or (None, why not).

    A token qualifies when the tokenizer matches it on the raw text (not normalised), it takes no whitespace to its
    right (``rstrip``), no other added token contains it, and no added token matches only as a whole word."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None, f"{type(tokenizer).__name__} has no fast (Rust) tokenizer"
    spec = json.loads(backend.to_str())
    if _marks_text_start(spec.get("pre_tokenizer")):
        return None, "its pre-tokenizer marks the start of the text (Metaspace, prepend_scheme first)"
    added = list(backend.get_added_tokens_decoder().values())
    if any(t.single_word for t in added):
        return None, "an added token matches only as a whole word (single_word)"
    contents = [t.content for t in added]
    usable = [t.content for t in added if t.content and not t.rstrip and not t.normalized
              and not any(t.content != other and t.content in other for other in contents)]
    if not usable:
        return None, "no added token to cut after"
    return tuple(sorted(set(usable), key=lambda s: (-len(s), s))), ""


def _marks_text_start(spec: Any) -> bool:
    if isinstance(spec, dict):
        if spec.get("type") == "Metaspace" and spec.get("prepend_scheme") == "first":
            return True
        return any(_marks_text_start(v) for v in spec.values())
    if isinstance(spec, list):
        return any(_marks_text_start(v) for v in spec)
    return False


def common_prefix_chars(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (compared in C, a slice per halving)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if b.startswith(a[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


class PairTokeniser:
    """TRL's ``prompt_ids`` / ``chosen_ids`` / ``rejected_ids`` of a batch, each prompt tokenised once (module
    docstring). ``tokens``: `boundary_tokens`' first value (None: every row as TRL does). Keeps, per process, the
    ids of up to `MAX_SHARED` openings that recur from row to row."""

    def __init__(self, tokenizer, tokens: tuple[str, ...] | None):
        self.tokenizer = tokenizer
        self.pattern = re.compile("|".join(map(re.escape, tokens))) if tokens else None
        self.shared: list[tuple[str, list[int]]] = []  # (text, ids), longest first

    def __call__(self, prompts: list, chosens: list, rejecteds: list) -> dict[str, list]:
        """The three id columns and ``as_trl`` (1 for a row tokenised whole, as TRL does: no boundary found)."""
        if self.pattern is None or not prompts:
            out = dpo_token_ids(self.tokenizer, prompts, chosens, rejecteds)
            return {**out, "as_trl": [1] * len(prompts)}
        render = self.tokenizer.apply_chat_template
        texts_p = render(list(prompts), tokenize=False, add_generation_prompt=True)
        texts_c = render([p + c for p, c in zip(prompts, chosens)], tokenize=False)
        texts_r = render([p + r for p, r in zip(prompts, rejecteds)], tokenize=False)
        cuts = [self._last_end(p, min(common_prefix_chars(p, c), common_prefix_chars(p, r)))
                for p, c, r in zip(texts_p, texts_c, texts_r)]
        heads = [p[:b] for p, b in zip(texts_p, cuts)]
        self._learn_shared(heads)
        openings = [self._shared_of(h) for h in heads]
        pieces = [h[len(o[0]):] for h, o in zip(heads, openings)]
        pieces += [t[b:] for texts in (texts_p, texts_c, texts_r) for t, b in zip(texts, cuts)]
        ids = self._ids(pieces)
        n = len(prompts)
        heads_ids, rest_p, rest_c, rest_r = (ids[i * n:(i + 1) * n] for i in range(4))
        from trl.data_utils import common_prefix_length

        out: dict[str, list] = {name: [] for name in (*TOKEN_COLUMNS, "as_trl")}
        for (_, opening), head, p, c, r, b in zip(openings, heads_ids, rest_p, rest_c, rest_r, cuts):
            keep = min(common_prefix_length(p, c), common_prefix_length(p, r))
            out["prompt_ids"].append(opening + head + p[:keep])
            out["chosen_ids"].append(c[keep:])
            out["rejected_ids"].append(r[keep:])
            out["as_trl"].append(int(b == 0))
        return out

    def rows(self, prompts: list, completions: list[list]) -> list[tuple[list[int], list[list[int]]] | None]:
        """Per row, a prompt with any number of completions (an eval row: RM-Bench's three chosen and three rejected,
        a pair's two): the prompt's ids and each completion's, cut where the tokenised prompt and the tokenised
        prompt + completion diverge, the prompt as long as its shortest common prefix with any completion (one cut
        for the row, as `judgetrain.eval.scoring.ScoringEngine` scores its responses: with two completions, TRL's
        cut). None for a row without a boundary or without completions (the caller tokenises it whole). The
        messages are rendered as given: neutralise their content first, as the caller's whole tokenisation does."""
        out: list[tuple[list[int], list[list[int]]] | None] = [None] * len(prompts)
        if self.pattern is None or not prompts:
            return out
        from trl.data_utils import common_prefix_length

        render = self.tokenizer.apply_chat_template
        texts_p = render(list(prompts), tokenize=False, add_generation_prompt=True)
        flat = [p + list(c) for p, cs in zip(prompts, completions) for c in cs]
        texts_f = render(flat, tokenize=False) if flat else []
        spans, at = [], 0
        for p, cs in zip(texts_p, completions):
            fulls = texts_f[at:at + len(cs)]
            at += len(cs)
            cut = self._last_end(p, min(common_prefix_chars(p, f) for f in fulls)) if fulls else 0
            spans.append((cut, fulls))
        kept = [i for i, (cut, _) in enumerate(spans) if cut]
        heads = [texts_p[i][:spans[i][0]] for i in kept]
        self._learn_shared(heads)
        openings = [self._shared_of(h) for h in heads]
        pieces = [h[len(o[0]):] for h, o in zip(heads, openings)]
        for i in kept:
            cut, fulls = spans[i]
            pieces += [texts_p[i][cut:], *(f[cut:] for f in fulls)]
        ids = self._ids(pieces)
        rests = iter(ids[len(kept):])
        for i, head, (_, opening) in zip(kept, ids[:len(kept)], openings):
            p = next(rests)
            fulls = [next(rests) for _ in spans[i][1]]
            keep = min(common_prefix_length(p, f) for f in fulls)
            out[i] = (opening + head + p[:keep], [f[keep:] for f in fulls])
        return out

    def _ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, as TRL's tokenisation calls the tokenizer (no special tokens added); each
        distinct text tokenised once."""
        unique = list(dict.fromkeys(texts))
        encoded = dict(zip(unique, self._encode(unique))) if unique else {}
        return [list(encoded[t]) for t in texts]

    def _encode(self, texts: list[str]) -> list[list[int]]:
        """The tokenizer's ids of ``texts`` (no special tokens added): its Rust backend's ``encode_batch_fast`` (no
        character offsets computed: about half the time of ``tokenizer(texts)`` on judge prompts) where that call is
        exactly what ``tokenizer(texts)`` does (`fast_backend`), the tokenizer's own call otherwise."""
        backend = fast_backend(self.tokenizer)  # asked per batch: the tokenizer's state may change between them
        if backend is None:
            return self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)]

    def _last_end(self, text: str, limit: int) -> int:
        """The end of the last boundary token in ``text[:limit]`` (0: none), searched back from ``limit``."""
        width = _SEARCH_WINDOW
        while True:
            start = max(0, limit - width)
            end = 0
            for match in self.pattern.finditer(text, start, limit):
                end = match.end()
            if end or start == 0:
                return end
            width *= 4

    def _shared_of(self, head: str) -> tuple[str, list[int]]:
        for text, ids in self.shared:
            if head.startswith(text):
                return text, ids
        return "", []

    def _learn_shared(self, heads: list[str]) -> None:
        """Keep the ids of the opening (up to a boundary token) that two consecutive rows without a known opening
        share, when it is long enough to matter: the system turn of a rubric, tokenised once per process."""
        previous = None
        for head in heads:
            if len(self.shared) >= MAX_SHARED:
                return
            if self._shared_of(head)[0]:
                continue
            if previous is not None:
                end = self._last_end(head, common_prefix_chars(previous, head))
                if end >= MIN_SHARED_CHARS:
                    self.shared.append((head[:end], self._ids([head[:end]])[0]))
                    self.shared.sort(key=lambda entry: -len(entry[0]))
                    continue
            previous = head


_TOKENISERS: dict[int, tuple[Any, Any, PairTokeniser]] = {}  # per process: id(tokenizer) -> (it, tokens, tokeniser)


def pair_tokeniser(tokenizer, tokens) -> PairTokeniser:
    """This process's `PairTokeniser` for ``tokenizer`` and ``tokens`` (its recurring openings kept between
    batches)."""
    kept = _TOKENISERS.get(id(tokenizer))
    if kept is None or kept[0] is not tokenizer or kept[1] != tokens:
        if len(_TOKENISERS) >= 8:
            _TOKENISERS.clear()
        kept = _TOKENISERS[id(tokenizer)] = (tokenizer, tokens, PairTokeniser(tokenizer, tokens))
    return kept[2]


def probe_rows(tokenizer, rows: list[dict] = ()) -> list[dict]:
    """Rows the start-up check compares with TRL's tokenisation: ``rows`` (the data's first rows), then probes whose
    completions start with a space, a newline (which merges with the newline that ends most generation prompts),
    two newlines, a tab, or are empty, under a system turn and without one."""
    probes = [{"prompt": list(row["prompt"]), "chosen": list(row["chosen"]), "rejected": list(row["rejected"])}
              for row in rows]
    for system in (True, False):
        prompt = ([{"role": "system", "content": "You grade answers from 1 to 5."}] if system else []) + [
            {"role": "user", "content": "Grade this answer: 7 is prime."}]
        for a, b in zip(_PROBE_TEXTS, _PROBE_TEXTS[1:] + _PROBE_TEXTS[:1]):
            probes.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": a}],
                           "rejected": [{"role": "assistant", "content": b}]})
    return probes


_CHECKED: dict[int, tuple] = {}  # per process: id(tokenizer) -> (it, `check_boundary`'s tokens)


def checked_tokens(tokenizer) -> tuple[str, ...] | None:
    """`check_boundary`'s tokens for ``tokenizer`` (on its probes; None: no boundary), checked once per process."""
    kept = _CHECKED.get(id(tokenizer))
    if kept is None or kept[0] is not tokenizer:
        if len(_CHECKED) >= 8:
            _CHECKED.clear()
        kept = _CHECKED[id(tokenizer)] = (tokenizer, check_boundary(tokenizer)[0])
    return kept[1]


def check_boundary(tokenizer, rows: list[dict] = ()) -> tuple[tuple[str, ...] | None, str]:
    """`boundary_tokens`, confirmed on `probe_rows`: (tokens, "") when every probe that the template renders has
    TRL's ids and at least one was cut at a boundary; (None, why) otherwise, every row then tokenised as TRL does."""
    tokens, why = boundary_tokens(tokenizer)
    if tokens is None:
        return None, why
    split = PairTokeniser(tokenizer, tokens)
    cut = 0
    for i, row in enumerate(probe_rows(tokenizer, rows)):
        batch = ([row["prompt"]], [row["chosen"]], [row["rejected"]])
        try:
            expected = dpo_token_ids(tokenizer, *batch)
        except Exception:  # noqa: BLE001 - a probe the template refuses (e.g. a system turn): not this template's rows
            continue
        got = split(*batch)
        if any(got[k] != expected[k] for k in TOKEN_COLUMNS):
            return None, f"its ids differ from TRL's on {'row' if i < len(rows) else 'probe'} {i}"
        cut += 1 - got["as_trl"][0]
    if not cut:
        return None, "the template writes no added token before the assistant's content"
    return tokens, ""
