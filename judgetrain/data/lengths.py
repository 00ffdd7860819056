"""The length audit: rows that do not fit ``max_length`` are counted per mixture component, then failed, skipped,
left to TRL's truncation or shortened, as the recipe's ``long_rows`` says; nothing is dropped silently.

The audit computes each row's ids as TRL's DPOTrainer does and keeps them (``prompt_ids``, ``chosen_ids``,
``rejected_ids``): judgetrain's trainer then skips TRL's own tokenisation of the same rows (one tokenisation per
start, not two). Each prompt is tokenised once, not three times (`judgetrain.data.tokenise`)."""

# Late imports: judgetrain.data, judgetrain.compat, datasets (inside the functions that use them): `judgetrain data
# check` and `pairs build` read rows without a model: tokenizer and training libraries come in with the functions that
# need them.

from __future__ import annotations

import logging
import os

from judgetrain.compat.trl import TOKEN_COLUMNS  # TRL's tokenised columns, kept by the audit
from judgetrain.config.recipe import RecipeError

logger = logging.getLogger(__name__)


PAIR_COLUMNS = ("prompt", "chosen", "rejected")
_CHECK = "check"  # `_lengths_batched` without ``tokens``: the tokenizer's boundary checked on probes here


def _lengths_batched(batch, tokenizer, tokens=_CHECK, strings=()):
    """TRL's token ids of each row (what its DPOTrainer would compute, which then reuses them: `judgetrain.data.
    tokenise`, each prompt tokenised once after ``tokens``, `check_boundary`'s first value) and the counts the audit
    reads: the prompt, and the prompt with the longer completion; ``_as_trl``: 1 for a row tokenised as TRL does.
    ``strings``: the control strings to neutralise in the messages first (`judgetrain.data.chat`); the columns
    that changed are returned with the ids."""
    from judgetrain.data.chat import neutralised_columns
    from judgetrain.data.tokenise import pair_tokeniser

    if tokens is _CHECK:
        tokens = _checked_tokens(tokenizer)
    fixed = neutralised_columns(batch, strings, PAIR_COLUMNS) if strings else {}
    texts = {c: fixed.get(c, batch[c]) for c in PAIR_COLUMNS}
    out = {**fixed, **pair_tokeniser(tokenizer, tokens)(texts["prompt"], texts["chosen"], texts["rejected"])}
    out["_as_trl"] = out.pop("as_trl")
    out["_prompt_len"] = [len(p) for p in out["prompt_ids"]]
    out["_full_len"] = [len(p) + max(len(c), len(r))
                        for p, c, r in zip(out["prompt_ids"], out["chosen_ids"], out["rejected_ids"])]
    return out


def _checked_tokens(tokenizer):
    from judgetrain.data.tokenise import checked_tokens

    return checked_tokens(tokenizer)


def _shorten_prompt(example, tokenizer, max_length: int, tokens=_CHECK):
    """Cut the middle of the last user message so prompt + the longer completion fits ``max_length``."""
    over = example["_full_len"] - max_length
    prompt = [dict(m) for m in example["prompt"]]
    user = max((i for i, m in enumerate(prompt) if m["role"] == "user"), default=None)
    if user is None:
        return example, False
    content_ids = tokenizer(prompt[user]["content"], add_special_tokens=False)["input_ids"]
    marker = "\n[... shortened to fit max_length ...]\n"
    cut = over + len(tokenizer(marker, add_special_tokens=False)["input_ids"]) + 4
    for _ in range(4):  # re-tokenising at the two seams can cost a few tokens more than counted: cut again
        if cut >= len(content_ids) - 16:
            return example, False
        keep = (len(content_ids) - cut) // 2
        prompt[user]["content"] = tokenizer.decode(content_ids[:keep]) + marker + tokenizer.decode(content_ids[-keep:])
        new = dict(example, prompt=[dict(m) for m in prompt])
        counted = _lengths_batched({k: [new[k]] for k in ("prompt", "chosen", "rejected")}, tokenizer, tokens)
        new.update({k: v[0] for k, v in counted.items()})
        if new["_full_len"] <= max_length:
            return new, True
        cut += new["_full_len"] - max_length + 2
    return example, False


def audit_lengths(dataset, tokenizer, max_length: int | None, action: str, rejects_path: str | None, num_proc=None,
                  neutralise: bool = False):
    """Count, per mixture component, rows whose prompt alone fills max_length (TRL would drop them) and rows whose
    completion would be cut (the judge's score lost), then apply the recipe's action. Returns (dataset, report).
    ``neutralise``: neutralise the messages' control strings first (`judgetrain.data.chat`), in the same pass over
    the rows as the tokenisation (the rows returned are the neutralised ones)."""
    from judgetrain.data.chat import neutralise_dataset

    if max_length is None:
        return (neutralise_dataset(dataset, tokenizer, num_proc=num_proc) if neutralise else dataset), {"max_length": None}
    with_len, tokens, tokenisation = _tokenised(dataset, tokenizer, num_proc, neutralise)
    report: dict = {"max_length": max_length, "action": action, "datasets": {}, "tokenisation": tokenisation}
    bad_rows = _count_long(with_len, max_length, report["datasets"])
    if bad_rows and action == "error":
        first = ", ".join(f"row {i} ({why})" for i, why in bad_rows[:5])
        raise RecipeError(
            f"{len(bad_rows)} training rows do not fit max_length={max_length}: {first}. Raise max_length, or set "
            "long_rows to skip, truncate or shorten_prompt."
        )
    drop: dict[int, str] = {}
    if action == "skip":
        drop = dict(bad_rows)
    elif action == "shorten_prompt" and bad_rows:
        with_len, drop, report["shortened"] = _shorten_rows(with_len, bad_rows, tokenizer, max_length, tokens)
    if drop:
        with_len = _drop_rows(with_len, drop, rejects_path)
    report["skipped"] = len(drop)
    if action == "truncate" and bad_rows:
        logger.warning("Data audit: %d rows will be truncated by TRL (their completion end is lost)", len(bad_rows))
    return with_len.remove_columns(["_prompt_len", "_full_len", "_as_trl"]), report


def _tokenised(dataset, tokenizer, num_proc, neutralise: bool):
    """(the rows with TRL's ids and the audit's counts, the boundary tokens, the report's ``tokenisation`` entry):
    the tokenisation pass, neutralising the messages' control strings first with ``neutralise``."""
    from judgetrain.compat.datasets import tokenizers_parallelism_kept
    from judgetrain.data.chat import control_strings, neutralise_dataset

    strings = control_strings(tokenizer) if neutralise else ()
    tokens, tokenisation = _tokenisation_plan(
        neutralise_dataset(_first_rows(dataset), tokenizer) if neutralise else _first_rows(dataset), tokenizer)
    processes = audit_processes(len(dataset), num_proc)
    if processes != num_proc:
        tokenisation["processes"] = processes or 1
        logger.info("Tokenisation: %d rows in %d process(es), not dataset_num_proc=%d: below %d rows a process, "
                    "starting a process costs more than it saves (the tokenizer encodes each batch on every core)",
                    len(dataset), processes or 1, num_proc, MIN_ROWS_PER_PROCESS)
    with tokenizers_parallelism_kept():  # the later encodes of this process (the eval rows' audit) on every core
        with_len = dataset.map(
            _lengths_batched, fn_kwargs={"tokenizer": tokenizer, "tokens": tokens, "strings": strings}, batched=True,
            batch_size=256, num_proc=processes, features=_audit_features(dataset),
            desc="Neutralising, tokenising and auditing sequence lengths" if neutralise else
            "Tokenising and auditing sequence lengths",
        )
    tokenisation["rows_as_trl"] = sum(with_len["_as_trl"])
    tokenisation["rows_prompt_once"] = len(with_len) - tokenisation["rows_as_trl"]
    logger.info("Tokenisation: %d rows with the prompt tokenised once, %d as TRL does (three times)",
                tokenisation["rows_prompt_once"], tokenisation["rows_as_trl"])
    return with_len, tokens, tokenisation


def _count_long(with_len, max_length: int, datasets: dict) -> list[tuple[int, str]]:
    """Per mixture component (``datasets``, filled): rows, rows whose prompt fills max_length, rows whose completion
    would be cut, the longest; returns the rows that do not fit, each with why."""
    names = with_len["dataset"] if "dataset" in with_len.column_names else ["train"] * len(with_len)
    bad_rows = []
    for i, (name, p, f) in enumerate(zip(names, with_len["_prompt_len"], with_len["_full_len"])):
        entry = datasets.setdefault(name, {"rows": 0, "prompt_fills_max_length": 0, "completion_cut": 0,
                                           "max_tokens": 0})
        entry["rows"] += 1
        entry["max_tokens"] = max(entry["max_tokens"], f)
        if p >= max_length:
            entry["prompt_fills_max_length"] += 1
            bad_rows.append((i, "prompt_fills_max_length"))
        elif f > max_length:
            entry["completion_cut"] += 1
            bad_rows.append((i, "completion_cut"))
    for name, entry in datasets.items():
        logger.info(
            "Data audit [%s]: %d rows, %d with a prompt that fills max_length=%d, %d whose completion would be cut, "
            "longest %d tokens",
            name, entry["rows"], entry["prompt_fills_max_length"], max_length, entry["completion_cut"], entry["max_tokens"],
        )
    return bad_rows


def _shorten_rows(with_len, bad_rows: list[tuple[int, str]], tokenizer, max_length: int, tokens):
    """``long_rows: shorten_prompt``: (the rows with the long prompts shortened, the rows that could not be and why,
    how many were shortened)."""
    drop: dict[int, str] = {}
    rows = {}
    for i, why in bad_rows:
        new, ok = _shorten_prompt(with_len[i], tokenizer, max_length, tokens)
        if ok:
            rows[i] = new
        else:
            drop[i] = f"{why}_unfixable"
    if rows:
        def replace(example, idx):
            return rows.get(idx, example)

        with_len = with_len.map(replace, with_indices=True, features=with_len.features, desc="Shortening long prompts")
    logger.info("Data audit: shortened the prompt of %d rows; %d could not be shortened and are skipped", len(rows),
                len(drop))
    return with_len, drop, len(rows)


def _drop_rows(with_len, drop: dict[int, str], rejects_path: str | None):
    """The rows less ``drop`` (index -> why), those written to ``rejects_path``, counted in one warning."""
    if rejects_path:  # rewritten on each load (a resume loads the same rows): never the same row twice
        from judgetrain.data.validate import write_rejects

        full_lens = with_len["_full_len"]
        write_rejects(rejects_path, (
            {"row": i, "reason": why, "tokens": full_lens[i],
             "data": {k: v for k, v in with_len[i].items() if not k.startswith("_") and k not in TOKEN_COLUMNS}}
            for i, why in sorted(drop.items())
        ))
    with_len = with_len.select([i for i in range(len(with_len)) if i not in drop])
    logger.warning("Data audit: skipped %d rows that do not fit max_length (written to %s)", len(drop), rejects_path)
    return with_len


# Fewer rows than this for each of dataset_num_proc processes: one process, its batches encoded on every core by the
# tokenizer's own threads. SmolLM2, 2,000 judge rows on 2 cores: 5.1 s in one process, 6.5 s in two.
MIN_ROWS_PER_PROCESS = 5_000


def audit_processes(rows: int, num_proc: int | None) -> int | None:
    """The processes the audit's map runs in: the recipe's ``dataset_num_proc``, fewer where each would get fewer
    than `MIN_ROWS_PER_PROCESS` rows, None (one process, the tokenizer encoding each batch on every core itself)
    below twice that. Unchanged when ``TOKENIZERS_PARALLELISM`` is turned off (one process would encode on one
    core)."""

    if not num_proc or num_proc <= 1 or rows >= MIN_ROWS_PER_PROCESS * num_proc:
        return num_proc
    if os.environ.get("TOKENIZERS_PARALLELISM", "true").strip().lower() in ("", "off", "false", "f", "no", "n", "0"):
        return num_proc
    fewer = rows // MIN_ROWS_PER_PROCESS
    return fewer if fewer > 1 else None


def _audit_features(dataset):
    """The audit map's output features: the rows' own, TRL's id columns and the counts as 32-bit integers (half
    the bytes of the int64 that datasets would infer, in the map's file, the rows folder and the pages a run maps;
    every tokenizer's ids fit, and TRL's collator makes int64 tensors of them as of any list)."""
    from datasets import Features, List, Value

    features = Features(dataset.features)
    features.update({c: List(Value("int32")) for c in TOKEN_COLUMNS})
    features.update({c: Value("int32") for c in ("_as_trl", "_prompt_len", "_full_len")})
    return features


def _first_rows(dataset):
    """The rows `_tokenisation_plan` checks: the first four, their messages alone."""
    return dataset.select_columns(list(PAIR_COLUMNS)).select(range(min(4, len(dataset))))


def _tokenisation_plan(first, tokenizer) -> tuple[tuple[str, ...] | None, dict]:
    """The boundary tokens the rows are cut after (`judgetrain.data.tokenise.check_boundary`, on ``first``, the
    first rows, and the probes), said once at start, and the report's ``tokenisation`` entry."""
    from judgetrain.data.tokenise import check_boundary

    tokens, why = check_boundary(tokenizer, list(first))
    if tokens is None:
        logger.info("Tokenisation: no boundary to tokenise each prompt once (%s): rows are tokenised as TRL's "
                    "DPOTrainer does, prompt and completions rendered and tokenised three times a row", why)
    else:
        logger.info("Tokenisation: each prompt tokenised once, completions from the end of the template's last added "
                    "token before them (one of %s), an opening shared by the rows tokenised once per process",
                    ", ".join(tokens[:4]) + (", ..." if len(tokens) > 4 else ""))
    return tokens, {"boundary": tokens is not None, "why_not": why or None}


