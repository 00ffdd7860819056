"""The length audit: rows that do not fit ``max_length`` are counted per mixture component, then failed, skipped,
left to TRL's truncation or shortened, as the recipe's ``long_rows`` says; nothing is dropped silently.

The audit tokenises each row as TRL's DPOTrainer does and keeps the ids (``prompt_ids``, ``chosen_ids``,
``rejected_ids``): judgetrain's trainer then skips TRL's own tokenisation of the same rows (one tokenisation per
start, not two)."""

from __future__ import annotations

import logging

from judgetrain.compat.trl import TOKEN_COLUMNS  # TRL's tokenised columns, kept by the audit
from judgetrain.config.recipe import RecipeError

logger = logging.getLogger(__name__)


def _lengths_batched(batch, tokenizer):
    """TRL's token ids of each row (`judgetrain.compat.trl.dpo_token_ids`: what its DPOTrainer would compute, which
    then reuses them) and the counts the audit reads: the prompt, and the prompt with the longer completion."""
    from judgetrain.compat.trl import dpo_token_ids

    out = dpo_token_ids(tokenizer, batch["prompt"], batch["chosen"], batch["rejected"])
    out["_prompt_len"] = [len(p) for p in out["prompt_ids"]]
    out["_full_len"] = [len(p) + max(len(c), len(r))
                        for p, c, r in zip(out["prompt_ids"], out["chosen_ids"], out["rejected_ids"])]
    return out


def _shorten_prompt(example, tokenizer, max_length: int):
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
        counted = _lengths_batched({k: [new[k]] for k in ("prompt", "chosen", "rejected")}, tokenizer)  # ids too
        new.update({k: v[0] for k, v in counted.items()})
        if new["_full_len"] <= max_length:
            return new, True
        cut += new["_full_len"] - max_length + 2
    return example, False


def audit_lengths(dataset, tokenizer, max_length: int | None, action: str, rejects_path: str | None, num_proc=None):
    """Count, per mixture component, rows whose prompt alone fills max_length (TRL would drop them) and rows whose
    completion would be cut (the judge's score lost), then apply the recipe's action. Returns (dataset, report)."""
    if max_length is None:
        return dataset, {"max_length": None}
    with_len = dataset.map(
        _lengths_batched, fn_kwargs={"tokenizer": tokenizer}, batched=True, batch_size=256, num_proc=num_proc,
        desc="Tokenising and auditing sequence lengths",
    )
    names = with_len["dataset"] if "dataset" in with_len.column_names else ["train"] * len(with_len)
    prompt_lens, full_lens = with_len["_prompt_len"], with_len["_full_len"]
    report: dict = {"max_length": max_length, "action": action, "datasets": {}}
    bad_rows = []
    for i, (name, p, f) in enumerate(zip(names, prompt_lens, full_lens)):
        entry = report["datasets"].setdefault(
            name, {"rows": 0, "prompt_fills_max_length": 0, "completion_cut": 0, "max_tokens": 0}
        )
        entry["rows"] += 1
        entry["max_tokens"] = max(entry["max_tokens"], f)
        if p >= max_length:
            entry["prompt_fills_max_length"] += 1
            bad_rows.append((i, "prompt_fills_max_length"))
        elif f > max_length:
            entry["completion_cut"] += 1
            bad_rows.append((i, "completion_cut"))
    for name, entry in report["datasets"].items():
        logger.info(
            "Data audit [%s]: %d rows, %d with a prompt that fills max_length=%d, %d whose completion would be cut, "
            "longest %d tokens",
            name, entry["rows"], entry["prompt_fills_max_length"], max_length, entry["completion_cut"], entry["max_tokens"],
        )
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
        fixed = 0
        rows = {}
        for i, why in bad_rows:
            new, ok = _shorten_prompt(with_len[i], tokenizer, max_length)
            if ok:
                rows[i] = new
                fixed += 1
            else:
                drop[i] = f"{why}_unfixable"
        if rows:
            def replace(example, idx):
                return rows.get(idx, example)

            with_len = with_len.map(replace, with_indices=True, desc="Shortening long prompts")
        report["shortened"] = fixed
        logger.info("Data audit: shortened the prompt of %d rows; %d could not be shortened and are skipped", fixed, len(drop))
    if drop:
        if rejects_path:  # rewritten on each load (a resume loads the same rows): never the same row twice
            from judgetrain.data.validate import write_rejects

            write_rejects(rejects_path, (
                {"row": i, "reason": why, "tokens": full_lens[i],
                 "data": {k: v for k, v in with_len[i].items() if not k.startswith("_") and k not in TOKEN_COLUMNS}}
                for i, why in sorted(drop.items())
            ))
        keep = [i for i in range(len(with_len)) if i not in drop]
        with_len = with_len.select(keep)
        logger.warning("Data audit: skipped %d rows that do not fit max_length (written to %s)", len(drop), rejects_path)
    report["skipped"] = len(drop)
    if action == "truncate" and bad_rows:
        logger.warning("Data audit: %d rows will be truncated by TRL (their completion end is lost)", len(bad_rows))
    return with_len.remove_columns(["_prompt_len", "_full_len"]), report


