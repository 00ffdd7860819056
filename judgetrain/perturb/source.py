"""Source samples: read and checked before any model loads.

A source row has ``sample_id`` (an integer, or a non-empty string), the text to perturb (the spec's ``text_field``,
default ``text``) and either its own ``prompt_template`` (messages, or their JSON string, with ``{{text}}`` where
the text goes) or the fields the spec's ``template`` names as ``{{field}}``. Sources: JSONL / JSON / parquet file
(gzip too), a folder of them (``split``'s files) or a hub dataset.

A bad row (no ``sample_id``, an empty text, a template placeholder the row does not fill, a sample seen twice) is
named with file, row and field (`judgetrain.data.validate.DataValidationError`), or with ``on_bad_row="skip"``
written to the rejects file and counted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from judgetrain.data.io import SAMPLES_DIR, JsonLines, read_split
from judgetrain.data.validate import Rejects, RowProblem, json_safe, parse_messages, validate_rows
from judgetrain.judge.items import check_sample_id
from judgetrain.perturb.spec import PLACEHOLDER, Spec

logger = logging.getLogger(__name__)

TEMPLATE_COLUMN = "prompt_template"
RECIPES = SAMPLES_DIR / "recipes"  # the materials pack's bundled source samples (scripts/make_samples.py)


@dataclass(frozen=True)
class Sample:
    sample_id: Any
    text: str
    template: list[dict]
    fields: dict[str, str]  # the placeholders' values other than text
    source: str
    row: int

    def prompt(self, text: str) -> list[dict]:
        """The judge prompt with ``text`` in the place of ``{{text}}`` (one pass: the text is never read for
        placeholders)."""
        values = {**self.fields, "text": text}
        return [{"role": m["role"], "content": PLACEHOLDER.sub(lambda g: values[g.group(1)], m["content"])}
                for m in self.template]


def row_template(row: dict, spec: Spec) -> tuple[list[dict] | None, str | None]:
    """(the row's template, None), or (None, why it has none usable)."""
    if row.get(TEMPLATE_COLUMN) is None:
        if spec.template is None:
            return None, "missing column: the spec has no template, so each row needs its own prompt_template"
        return spec.template, None
    messages, err = parse_messages(row[TEMPLATE_COLUMN])
    if err or not messages:
        return None, err or "empty message list"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") or \
                not isinstance(m.get("content"), str) or not m["content"].strip():
            return None, f"message {i} is not a {{role, content}} object with text"
    if messages[-1]["role"] == "assistant":
        return None, "the last message is the assistant's: the judge writes that turn"
    if not any("text" in PLACEHOLDER.findall(m["content"]) for m in messages):
        return None, "no message holds {{text}}, the place of the perturbed text"
    return [{"role": m["role"], "content": m["content"]} for m in messages], None


def check_row(row: dict, spec: Spec) -> list[tuple[str, str]]:
    problems = []
    if "sample_id" not in row:
        problems.append(("sample_id", "missing column"))
    elif err := check_sample_id(row["sample_id"]):
        problems.append(("sample_id", err))
    text = row.get(spec.text_field)
    if text is None:
        problems.append((spec.text_field, "missing column (the text to perturb: the spec's text_field)"))
    elif not isinstance(text, str) or not text.strip():
        problems.append((spec.text_field, "not a non-empty string"))
    template, err = row_template(row, spec)
    if err:
        problems.append((TEMPLATE_COLUMN, err))
    else:
        for name in sorted({n for m in template for n in PLACEHOLDER.findall(m["content"])} - {"text"}):
            value = row.get(name)
            if value is None or isinstance(value, (dict, list)) or not str(value).strip():
                problems.append((name, f"missing value for the template's {{{{{name}}}}}"))
    return problems


def read_samples(source: str, spec: Spec, *, split: str = "train", on_bad_row: str = "error",
                 rejects_path: str | None = None, revision: str | None = None) -> tuple[list[Sample], dict]:
    """The checked samples of ``source`` and ``{"rows", "rejected", "rejects_path"}``; DataValidationError naming
    file, row and field for the first bad row (``on_bad_row="error"``)."""
    rejects = Rejects("perturb", split, on_bad_row, rejects_path)
    tables = read_split(source, "perturb", split, rejects, **({"revision": revision} if revision else {}))
    samples: list[Sample] = []
    seen: dict[Any, tuple[str, int]] = {}
    for table in tables:
        verdict, bad = validate_rows(table.rows, lambda r: check_row(r, spec), source=table.source, split=split)
        rejects.add(verdict, bad)
        for i in verdict.good:
            row = table.rows[i]
            sid = int(row["sample_id"]) if isinstance(row["sample_id"], float) else row["sample_id"]
            if sid in seen:
                rejects.add_problem(RowProblem(table.source, split, i, "sample_id", f"duplicated sample_id {sid!r}: "
                                               f"already at {seen[sid][0]} row {seen[sid][1]}"), json_safe(row), 0)
                continue
            seen[sid] = (table.source, i)
            template, _ = row_template(row, spec)
            names = {n for m in template for n in PLACEHOLDER.findall(m["content"])} - {"text"}
            samples.append(Sample(sid, row[spec.text_field], template, {n: str(row[n]) for n in names},
                                  table.source, i))
    path = rejects.finish()
    if not samples:
        raise ValueError(f"{source}: no samples to perturb" + (f" ({rejects.n_bad} rejected, see {path})" if path else ""))
    logger.info("source: %d sample(s) from %s%s", len(samples), source,
                f"; {rejects.n_bad} rejected, written to {path}" if rejects.n_bad else "")
    return samples, {"rows": rejects.n_rows, "rejected": rejects.n_bad, "rejects_path": str(path) if path else None}



def bundled_recipes(split: str = "validation", n: int | None = None) -> list[dict]:
    """The bundled source samples of the materials pack (``judgetrain/data/samples/recipes``: the unperturbed
    recipes of the bundled JudgeBias samples). With ``n``, repeated under new ids up to ``n`` rows (a benchmark at
    scale)."""
    rows = list(JsonLines.parse(RECIPES / f"{split}.jsonl"))
    if n is None:
        return rows
    return [{**rows[i % len(rows)], "sample_id": i} for i in range(n)]
