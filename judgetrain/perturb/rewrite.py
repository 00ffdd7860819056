"""Model rewrites on the engine of `judgetrain judge`: each rewrite is one judge item whose "evaluation" is the
rewritten text.

The rewriting model is a judge specification (`judgetrain.judge.judges`: an alias, a hub id, a local folder with
an adapter, or an OpenAI-compatible endpoint), and the rewrites run through `judgetrain.judge.runner.run_panel`
into ``<output_dir>/rewrites``: batched by length, sharded over the processes of an ``accelerate launch``,
committed a chunk at a time with the done index, so a killed run continues where it stopped and every rewrite is
made once. The prompt of a rewrite is the spec's ``rewriter_system`` and the operator's instruction
(``{{percent}}`` / ``{{rate}}`` filled with the set's rate) followed by the text.
"""

# Late imports: judgetrain.judge (its runner, inside the functions that run rewrites): a run of rule operators alone
# never imports the generation stack (torch, transformers).

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from judgetrain.judge.items import Item, ItemSet
from judgetrain.judge.judges import JudgeSpec
from judgetrain.judge.options import Options
from judgetrain.judge.output import EVALUATIONS
from judgetrain.perturb.edits import Change
from judgetrain.perturb.spec import PLACEHOLDER, Operator, Spec

REWRITES = "rewrites"
_TOKENS = re.compile(r"\s+|[^\s]+")
_FENCE = re.compile(r"^```[\w-]*\n(.*)\n```$", re.S)


@dataclass(frozen=True)
class Request:
    key: tuple[Any, str]  # (sample_id, perturbation_set)
    messages: list[dict]


def rewrite_messages(spec: Spec, op: Operator, rate: float, text: str) -> list[dict]:
    values = {"percent": f"{rate * 100:g}", "rate": f"{rate:g}"}
    instruction = PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), op.options["instruction"].strip())
    return [{"role": "system", "content": spec.rewriter_system},
            {"role": "user", "content": f"{instruction}\n\nText:\n{text}"}]


def run_rewrites(requests: list[Request], spec: Spec, rewriter: JudgeSpec, opts: Options, out: Path,
                 state) -> dict[tuple, dict] | None:
    """Every request through the judge engine into ``out/rewrites`` (resuming what is there). Returns, on the main
    process, ``{key: {"text", "stopped", "n_tokens"}}`` (other processes: {}); None when a signal stopped the run."""
    from judgetrain.judge.runner import run_panel

    items = [Item(r.key, r.messages, {"sample_id": r.key[0], "perturbation_set": r.key[1]}, spec.path, i)
             for i, r in enumerate(requests)]
    result = run_panel(ItemSet(items, f"perturb rewrites ({spec.path})"), [rewriter], opts, out / REWRITES, state)
    if result["status"] == "stopped":
        return None
    if not state.is_main_process:
        return {}
    texts = {}
    with (out / REWRITES / EVALUATIONS).open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            texts[(row["sample_id"], row["perturbation_set"])] = {
                "text": clean(row["evaluation"]), "stopped": row["stopped"], "n_tokens": row["n_tokens"],
                "error": row.get("error")}
    return texts


def clean(text: str) -> str:
    """The rewrite as the text of an item: surrounding whitespace and a code fence around the whole of it cut."""
    text = text.strip()
    fenced = _FENCE.match(text)
    return fenced.group(1).strip() if fenced else text


def diff_changes(kind: str, before: str, after: str) -> list[Change]:
    """What a rewrite changed, word by word: one change per replaced, deleted or inserted run of words, at its
    character offset in the source text."""
    a, b = _TOKENS.findall(before), _TOKENS.findall(after)
    offsets = [0]
    for token in a:
        offsets.append(offsets[-1] + len(token))
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [Change(kind, "".join(a[i1:i2]), "".join(b[j1:j2]), offsets[i1])
            for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
