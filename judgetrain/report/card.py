"""The trained judge's model card: the README.md of a run's output_dir, written by judgetrain instead of TRL's generic
card.

    from judgetrain.report.card import write_model_card
    write_model_card("runs/quickstart")      # -> runs/quickstart/README.md

It reads what the run wrote (``recipe.yaml``, ``judgetrain_run.json``, ``data_audit.json``, ``metrics.jsonl``) and
says: the base model as its hub id or judgetrain alias (a local folder by its name only: no machine path reaches the
card), the training data, the recipe, the headline figures of the best and the last evaluation
(`judgetrain.report.headline`, the figures `judgetrain report` opens with) also as the hub's ``model-index``
metadata, and how to use the judge: its prompt, ``judgetrain judge``, and how its score is read.

Training writes it at the end (`judgetrain.train.save_final`, after the model files and before the completion
marker) and wherever TRL would write its own card (`JudgeDPOTrainer.create_model_card`: each checkpoint save and
``push_to_hub``), so TRL's card never replaces it.
"""

# Late imports: judgetrain.models, yaml, judgetrain.report (inside the functions that use them): `judgetrain report`
# draws without torch; the plotting and template libraries come in with the figures and pages.

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from judgetrain.config.suites import registered, known_suites
from judgetrain.eval.benchmarks import Suite
from judgetrain.report.headline import (Headline, against_base, against_base_lines, headline, headline_note,
                                        headline_table)
from judgetrain.utils.files import read_json, write_lines
from judgetrain.utils.hub import is_hub_id, is_url

logger = logging.getLogger(__name__)

CARD_FILE = "README.md"
_CACHE_DIR = re.compile(r"(?:^|/)models--([\w.-]+)--([\w.-]+)(?:/|$)")


def base_model(name: str) -> tuple[str | None, str, str]:
    """(hub id or None, how the card names it, how a command names it) of a recipe's ``model_name_or_path``: a hub
    id as itself, an alias as the alias with what it is, a folder of the hub's cache as the hub id it holds, any other
    folder by its name only."""
    from judgetrain.models.aliases import aliases

    known = aliases()
    if name in known:
        return None, f"`{name}` (judgetrain alias: {known[name]})", name
    if is_hub_id(name):
        return name, f"[{name}](https://huggingface.co/{name})", name
    cached = _CACHE_DIR.search(str(name).replace("\\", "/"))
    if cached:
        hub = f"{cached.group(1)}/{cached.group(2)}"
        return hub, f"[{hub}](https://huggingface.co/{hub})", hub
    folder = Path(str(name).rstrip("/")).name or "BASE"
    return None, f"a local model folder (`{folder}`)", f"path/to/{folder}"


def _source(source: Any, hub_default: str | None, bundled: str) -> tuple[str | None, str]:
    """(hub id or None, how the card names it) of a data source: never a machine path."""
    source = str(source or "bundled")
    if source == "bundled":
        return None, bundled
    if is_hub_id(source):
        return source, f"[{source}](https://huggingface.co/datasets/{source})"
    return None, f"a local file or folder (`{Path(source.rstrip('/')).name}`)"


def _training_data(recipe: Mapping[str, Any], audit: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(hub dataset ids, Markdown lines) of the recipe's ``train_datasets``."""
    rows_by = (audit.get("datasets") or {}) if isinstance(audit, Mapping) else {}
    hub_ids, lines = [], ["| dataset | source | split | options | rows trained on |", "|---|---|---|---|---|"]
    for comp in recipe.get("train_datasets") or []:
        name = str(comp.get("dataset"))
        train_hub = getattr(registered(name), "train_hub", None)  # an eval suite of the same schema knows its hub id
        bundled = f"judgetrain's bundled synthetic sample in the {train_hub or name} schema"
        hub, shown = _source(comp.get("source"), train_hub, bundled)
        if hub:
            hub_ids.append(hub)
        options = ", ".join(f"{k}={v}" for k, v in comp.items() if k not in ("dataset", "source", "split")) or "-"
        rows = (rows_by.get(name) or {}).get("rows")
        lines.append(f"| {name} | {shown} | {comp.get('split', '-')} | {options} | {rows if rows is not None else '-'} |")
    skipped = audit.get("skipped") if isinstance(audit, Mapping) else None
    if skipped:
        lines += ["", f"{skipped} row(s) were skipped at the data audit (listed in the run's rejects file)."]
    return hub_ids, lines


def _recipe_lines(recipe: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The recipe as a short list: method, adapter, schedule, batch, length, precision, seed."""
    get = recipe.get
    loss = get("loss_type") or ["sigmoid"]
    lines = [f"- DPO (TRL `DPOTrainer`), loss {', '.join(map(str, loss if isinstance(loss, list) else [loss]))}, "
             f"beta {get('beta', 0.1)}"]
    if get("use_peft"):
        targets = get("lora_target_modules")
        lines.append(f"- LoRA: r {get('lora_r')}, alpha {get('lora_alpha')}, dropout {get('lora_dropout', 0.0)}"
                     + (f", on {', '.join(map(str, targets))}" if isinstance(targets, list) else
                        f", on {targets}" if targets else ""))
    else:
        lines.append("- full fine-tune (every weight trained)")
    length = f"{get('num_train_epochs')} epoch(s)" if get("max_steps") in (None, -1) else f"{get('max_steps')} steps"
    lines.append(f"- {length}, learning rate {get('learning_rate')} ({get('lr_scheduler_type', 'linear')} schedule"
                 + (f", {get('warmup_steps')} warmup steps" if get("warmup_steps") else "") + ")")
    procs = current.get("num_processes") or 1
    per, accum = get("per_device_train_batch_size", 8), get("gradient_accumulation_steps", 1)
    lines.append(f"- batch: {per} pairs per device x {procs} process(es) x {accum} accumulation step(s) = "
                 f"{int(per) * int(procs) * int(accum)} pairs per optimizer step")
    precision = "bf16" if get("bf16") else "fp16" if get("fp16") else "fp32"
    lines.append(f"- max_length {get('max_length', 1024)} tokens, {precision}, seed {get('seed', 42)}")
    versions = current.get("versions") or {}
    if versions:
        lines.append("- libraries: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    return lines


def _suite_dataset(suite: str, recipe: Mapping[str, Any]) -> dict[str, Any]:
    cls = registered(suite) or Suite  # its name, the hub dataset it comes from, what the bundled sample is
    name, hub, bundled = cls.title or suite, cls.hub or suite, cls.bundled or "no bundled copy"
    source = str(recipe.get(f"eval_{suite}_source") or "bundled")
    if source == "bundled":
        return {"name": f"{name} ({bundled})", "type": hub}
    if is_hub_id(source):
        return {"name": name, "type": source}
    if is_url(source):
        return {"name": f"{name} ({source.split('//', 1)[-1].split('/', 1)[0]})", "type": hub}
    return {"name": f"{name} (local copy)", "type": hub}


def model_index(name: str, head: Headline | None, which: str, recipe: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The hub's ``model-index``: one result per eval suite, with the headline figures of the evaluation ``which``
    (``best`` or ``last``) names: the one this folder's weights are."""
    if head is None:
        return []
    results = []
    for suite in known_suites():
        metrics = [{"type": "accuracy" if r["metric"].endswith("acc") or r["metric"].endswith("accuracy")
                    else "parse_rate", "name": r["label"], "value": round(r[which], 4)}
                   for r in head.rows if r["metric"].split("/")[1] == suite and r[which] is not None]
        if metrics:
            results.append({"task": {"type": "text-generation", "name": "LLM judging"},
                            "dataset": _suite_dataset(suite, recipe), "metrics": metrics})
    return [{"name": name, "results": results}] if results else []


def _usage(name: str, base: str, recipe: Mapping[str, Any]) -> list[str]:
    """How to run the judge and read its score, for the kinds of rows it was trained on."""
    kinds = {(str(c.get("dataset")), str(c.get("mode", "implicit"))) for c in recipe.get("train_datasets") or []}
    adapter = bool(recipe.get("use_peft"))
    spec = f"model={base},adapter=path/to/{name}" if adapter else f"model=path/to/{name}"
    load = (f'model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(resolve_model("{base}")), '
            f'"path/to/{name}")' if adapter else f'model = AutoModelForCausalLM.from_pretrained("path/to/{name}")')
    out = ["The judge reads a chat: a system message with the grading rubric, then a user message with the item to "
           "grade (the shape of its training rows' `prompt`). It writes its reasoning, then its scores.", "",
           "With judgetrain, over a file of items (`sample_id`, `prompt` as messages), writing one row per item with "
           "the evaluation, the parsed `score` and the parser's `reason`:", "", "```bash",
           f"judgetrain judge --items items.jsonl --judge {spec} --output_dir judged", "```", "",
           "(`judged/evaluations.jsonl` holds the rows, `judged/summary.json` the parse rate and mean score; see "
           "`judgetrain judge --help` for `--force_score_prefix` and the rest). In Python:", "",
           "```python", *(["from peft import PeftModel"] if adapter else []),
           "from transformers import AutoModelForCausalLM, AutoTokenizer",
           "from judgetrain.data.scoreparse import parse_overall_score",
           "from judgetrain.eval.generate import Generator", "from judgetrain.models.aliases import resolve_model", "",
           f'tokenizer = AutoTokenizer.from_pretrained("path/to/{name}")', load,
           "gen = Generator(model, tokenizer, max_new_tokens=512)  # the chat template as in training, greedy",
           'messages = [{"role": "system", "content": RUBRIC}, {"role": "user", "content": ITEM}]',
           "[out] = gen.generate([messages])", "score = parse_overall_score(out.text)  # None: no readable score",
           "```", ""]
    if any(k[0] == "judgebias" for k in kinds) or not kinds:
        out += ["**Reading the score.** The evaluation ends in a fenced `json` code block of criteria scores and "
                "`overall_score` (1 to 5 in steps of 0.5). `judgetrain.data.scoreparse.parse_overall_score` reads "
                "the last such block (an untagged or bare JSON object holding the key if there is none), evaluates "
                "simple arithmetic such as `(4+3.5)/2` without executing the text, and returns None, with a reason, "
                "for a text without a readable score or a score outside [0.5, 5.5]. A judge that does not write the "
                "block by itself can be started inside it, at `\"overall_score\": ` (`--force_score_prefix`): it then "
                "writes the score first."]
    if ("ideation", "pairwise") in kinds:
        out += ["", "**Pairwise verdicts.** Shown two proposals A and B, the judge says which is better: "
                "`judgetrain.data.scoreparse.parse_verdict` reads \"Proposal A is better\" (or a lone letter); both "
                "letters is `conflicting`. Ask for both orders to cancel position bias."]
    if ("ideation", "implicit") in kinds:
        out += ["", "**Implicit reward.** Trained on proposal pairs without a written verdict, it also ranks two "
                "responses by DPO's implicit reward against the base model (`judgetrain eval --eval_scoring implicit`)."]
    return out


def render_card(run_dir: str | Path) -> str:
    """The model card of the run in ``run_dir``, as Markdown with YAML metadata."""
    import yaml

    from judgetrain.report.build import read_metrics

    out = Path(run_dir)
    name = out.resolve().name
    try:
        recipe = yaml.safe_load((out / "recipe.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        recipe = {}
    current = (read_json(out / "judgetrain_run.json") or {}).get("current") or {}
    records = read_metrics(out / "metrics.jsonl") if (out / "metrics.jsonl").is_file() else {}
    head = headline(records, recipe)
    which = "best" if recipe.get("load_best_model_at_end") else "last"
    hub_base, base_text, base_cli = base_model(str(recipe.get("model_name_or_path", "")))
    datasets, data_lines = _training_data(recipe, read_json(out / "data_audit.json") or {})
    meta: dict[str, Any] = {}
    if hub_base:
        meta["base_model"] = hub_base
    meta["library_name"] = "peft" if recipe.get("use_peft") else "transformers"
    if datasets:
        meta["datasets"] = sorted(set(datasets))
    meta["pipeline_tag"] = "text-generation"
    meta["tags"] = ["judgetrain", "llm-as-a-judge", "dpo", "trl"] + (["lora"] if recipe.get("use_peft") else [])
    index = model_index(name, head, which, recipe)
    if index:
        meta["model-index"] = index
    what = "A LoRA adapter" if recipe.get("use_peft") else "A fine-tuned model"
    lines = ["---", yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
             f"# {name}", "", f"{what} that makes {base_text} a judge: trained with judgetrain (DPO on judge "
             "evaluations) to stay invariant to representational change and sensitive to real errors.", "",
             "## Base model", "", base_text + ".", ""]
    revisions = current.get("revisions") or {}
    pinned = [f"`{k.split(':', 1)[1]}` at commit `{v}`" for k, v in revisions.items() if k.startswith("model:") and v]
    if pinned:
        lines += ["Read at " + "; ".join(pinned) + ".", ""]
    lines += ["## Training data", "", *data_lines, "", "## Recipe", "", *_recipe_lines(recipe, current), "",
              "`recipe.yaml` beside this card is the recipe as run: `accelerate launch --config_file CONFIG -m "
              "judgetrain.train recipe.yaml` trains it again.", "", "## Evaluation", ""]
    lines += ["### Against the base judge", "", *against_base_lines(against_base(records, recipe, out)), "",
              "### Headline figures", ""]
    lines += _evaluation_lines(head, which, max(records) if records else None)
    lines += ["", "## Using the judge", "", *_usage(name, base_cli, recipe)]
    return "\n".join(lines).rstrip() + "\n"


def _evaluation_lines(head: Headline | None, which: str, final_step: int | None) -> list[str]:
    if head is None:
        return ["No evaluation was logged (the recipe's `eval_suites` was empty, or the run stopped before one)."]
    header, rows = headline_table(head)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    step = head.best_step if which == "best" else head.last_step
    lines += ["", headline_note(head) + f" The weights in this folder are the {which} evaluation's "
              + ("(`load_best_model_at_end`)" if which == "best" else f"(step {final_step})")
              + (f"; the last training step, {final_step}, came after it." if which == "last" and final_step
                 and final_step > step else ".")
              + " The `model-index` metadata holds the same figures. Every figure of every evaluation is in "
              "`metrics.jsonl`; `judgetrain report` draws them."]
    return lines


def write_model_card(run_dir: str | Path) -> Path:
    """Write ``run_dir``/README.md (through a temporary file and a rename). Returns its path."""
    text = render_card(run_dir)
    return write_lines(Path(run_dir) / CARD_FILE, text.rstrip("\n").split("\n"))


def write_card(output_dir: str) -> None:
    """The judge's model card into ``output_dir``; a failure is a warning (the model files are what a run must not
    lose over it)."""
    try:
        write_model_card(output_dir)
    except Exception as e:  # noqa: BLE001 - any failure of the card: warned, the run goes on
        logger.warning("the model card could not be written to %s/README.md: %s: %s", output_dir, type(e).__name__, e)
