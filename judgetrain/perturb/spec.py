"""The perturbation spec: a YAML file (or a pack shipped in ``judgetrain/perturb/packs``) read with safe YAML and
checked key by key before any source row is read or any model loads. An unknown key is refused with the nearest
valid one.

    from judgetrain.perturb.spec import load_spec
    spec = load_spec("materials")            # a pack's name, or a path to your own YAML
    spec.sets[0].name, spec.sets[0].rates    # "element_substitution", (1.0,)

A spec (every key of ``SPEC_KEYS``; docs/perturb.md shows one in full):

- ``text_field``: the source column holding the text to perturb (default ``text``).
- ``template``: the judge prompt, a list of ``{role, content}`` messages with ``{{field}}`` placeholders filled from
  the source row (``{{text}}`` is the perturbed text). A source row's own ``prompt_template`` column wins.
- ``tables``: named substitution tables, each a mapping (``before: after``) or ``{file: PATH}`` (YAML mapping, or a
  TSV / CSV of two columns; a relative path is read next to the spec).
- ``operators``: name -> operator (``OPERATOR_KEYS``): ``kind`` table | numeric | format | model, ``category``
  error | represent, and the keys of its kind.
- ``sets``: list of ``{name, operators, rates, edits}``; every set x rate is one ``perturbation_set``
  (``<name>_<percent>pct``). A set's operators share one category. An error set that gives no ``rates`` makes
  ``edits`` edits per copy (``[low, high]``, drawn per item; default the spec's ``edits``, else 1 to 3), named at
  rate 1.0; a set with ``rates`` edits that share of its spans.
- ``edits``: the default edits per error copy of a set without rates (default ``[1, 3]``).
- ``original``: also write every sample unperturbed, as the represent set ``original_0pct``.
- ``seed``: the draw of edits (same seed, same source, same spec: byte-identical output).
"""

from __future__ import annotations

import csv
import difflib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from judgetrain.utils.errors import BadInputError

PACKS_DIR = Path(__file__).resolve().parent / "packs"
CATEGORIES = ("error", "represent")
KINDS = ("table", "numeric", "format", "model", "swap", "order")
SPEC_KEYS = ("name", "description", "text_field", "template", "tables", "operators", "sets", "original", "seed",
             "units", "rewriter_system", "edits")
SET_KEYS = ("name", "operators", "rates", "description", "edits")
DEFAULT_EDITS = (1, 3)
COMMON_KEYS = ("kind", "category", "description", "checks")
OPERATOR_KEYS = {
    "table": COMMON_KEYS + ("table", "pairs", "file", "match", "case", "symmetric"),
    "numeric": COMMON_KEYS + ("mode", "factor", "shift", "decimals", "require_unit", "pool"),
    "format": COMMON_KEYS + ("rewrite",),
    "model": COMMON_KEYS + ("instruction", "stand_in"),
    "swap": COMMON_KEYS + ("classes", "case"),
    "order": COMMON_KEYS,
}
NUMERIC_MODES = ("scale", "shift", "unit_swap", "convert", "borrow")
FORMAT_REWRITES = ("markdown_to_plain", "plain_to_markdown", "list_order", "whitespace", "number_format")
CHECK_KEYS = ("numbers", "entities", "length_ratio", "changed")
ORIGINAL_SET = "original_0pct"
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class SpecError(BadInputError, ValueError):
    """A spec that cannot run: unknown key, bad value, missing table. Raised before any source row is read."""


@dataclass(frozen=True)
class Operator:
    name: str
    kind: str
    category: str
    options: dict[str, Any]  # the kind's keys, as checked (tables resolved to ``pairs``)
    checks: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PerturbSet:
    name: str
    operators: tuple[str, ...]
    rates: tuple[float, ...]
    category: str
    edits: tuple[int, int] | None = None  # edits per copy (low, high) where the set gives no rates

    def set_name(self, rate: float) -> str:
        """``element_substitution`` at 1.0 -> ``element_substitution_100pct`` (the name `judgetrain pairs build`
        reads type and rate from)."""
        pct = rate * 100
        return f"{self.name}_{int(round(pct)) if abs(pct - round(pct)) < 1e-9 else f'{pct:g}'}pct"


@dataclass(frozen=True)
class Spec:
    name: str
    path: str
    text_field: str
    template: list[dict] | None
    operators: dict[str, Operator]
    sets: list[PerturbSet]
    units: dict[str, dict[str, tuple[float, float]]]  # dimension -> unit -> (scale, offset) to the base unit
    tables: dict[str, dict[str, str]] = field(default_factory=dict)
    original: bool = False
    seed: int = 0
    rewriter_system: str = "You rewrite texts exactly as instructed and output only the rewritten text."

    def has_models(self) -> bool:
        return any(self.operators[o].kind == "model" for s in self.sets for o in s.operators)


def pack_names() -> list[str]:
    return sorted(p.stem for p in PACKS_DIR.glob("*.yaml"))


def spec_path(value: str) -> Path:
    """A path that exists, else the pack of that name; SpecError naming the packs otherwise."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    pack = PACKS_DIR / f"{value.removesuffix('.yaml')}.yaml"
    if "/" not in value and pack.is_file():
        return pack
    raise SpecError(f"spec {value}: no such file and no such pack; packs: {', '.join(pack_names())}")


def _unknown(keys, valid, where: str) -> None:
    for key in keys:
        if key not in valid:
            near = difflib.get_close_matches(str(key), list(valid), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise SpecError(f"{where}: unknown key {key!r}{hint}; valid: {', '.join(valid)}")


def _mapping(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _range(value: Any, where: str) -> tuple[float, float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value), float(value)
    if (isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value)
            and value[0] <= value[1]):
        return float(value[0]), float(value[1])
    raise SpecError(f"{where}: expected a number or [low, high] with low <= high, got {value!r}")


def read_table_file(path: Path, where: str) -> dict[str, str]:
    """A substitution table from a YAML mapping, or a TSV / CSV file of two columns (before, after)."""
    if not path.is_file():
        raise SpecError(f"{where}: table file {path} not found")
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        data = yaml.safe_load(text)
        return {str(k): str(v) for k, v in _mapping(data, f"{where} ({path})").items()}
    delimiter = "\t" if path.suffix == ".tsv" else ","
    pairs = {}
    for i, row in enumerate(csv.reader(text.splitlines(), delimiter=delimiter)):
        if not row or row[0].startswith("#"):
            continue
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise SpecError(f"{where}: {path} line {i + 1}: expected two non-empty columns, got {row!r}")
        pairs[row[0].strip()] = row[1].strip()
    return pairs


def _table(op: dict, tables: dict[str, dict[str, str]], base: Path, where: str) -> dict[str, str]:
    given = [k for k in ("table", "pairs", "file") if k in op]
    if len(given) != 1:
        raise SpecError(f"{where}: a table operator takes exactly one of table (a name under tables), pairs or file")
    if "table" in op:
        if op["table"] not in tables:
            near = difflib.get_close_matches(str(op["table"]), list(tables), n=1)
            raise SpecError(f"{where}: no table {op['table']!r} under tables" +
                            (f"; did you mean {near[0]!r}?" if near else f"; tables: {', '.join(tables) or 'none'}"))
        pairs = dict(tables[op["table"]])
    elif "pairs" in op:
        pairs = {str(k): str(v) for k, v in _mapping(op["pairs"], f"{where} pairs").items()}
    else:
        pairs = read_table_file(base / str(op["file"]), where)
    if op.get("symmetric"):
        pairs.update({v: k for k, v in list(pairs.items()) if v not in pairs})
    bad = [k for k, v in pairs.items() if not k or k == v]
    if not pairs or bad:
        raise SpecError(f"{where}: the table is empty or maps {bad[:3]} to themselves")
    return pairs


_TEMPLATE_ESCAPE = re.compile(r"\\(g<([^>]*)>|\d{1,2}|\\|.?)", re.S)


def check_replacement(pattern: str, value: str, where: str, flags: int = 0) -> None:
    """A pattern table's pair checked before any text is read: the pattern compiles, and its value refers only to
    the pattern's own groups (``\\g<1>``, ``\\g<name>``, ``\\1``) and holds no other escape (``\\a`` would become
    a control character; write ``\\\\`` for a backslash). SpecError naming the pair otherwise."""
    try:
        compiled = re.compile(pattern, flags)
    except re.error as e:
        raise SpecError(f"{where}: pattern {pattern!r} does not compile: {e}") from None
    for m in _TEMPLATE_ESCAPE.finditer(value):
        ref = m.group(2) if m.group(2) is not None else m.group(1) if m.group(1)[:1].isdigit() else None
        if ref is not None:
            low = 0 if m.group(2) is not None else 1  # \\0 is an octal escape, \\g<0> the whole match
            known = ref in compiled.groupindex or (ref.isdigit() and low <= int(ref) <= compiled.groups)
            if not known:
                raise SpecError(f"{where}: the value {value!r} of pattern {pattern!r} refers to group {ref!r}, and "
                                f"the pattern has {compiled.groups} group(s)"
                                + (f" ({', '.join(compiled.groupindex)})" if compiled.groupindex else ""))
        elif m.group(1) != "\\":
            raise SpecError(f"{where}: the value {value!r} of pattern {pattern!r} holds the escape \\{m.group(1)}; "
                            f"a value takes group references (\\g<1>) and \\\\ for a backslash, nothing else")


def _checks(value: Any, where: str) -> dict[str, Any]:
    checks = dict(_mapping(value or {}, f"{where} checks"))
    _unknown(checks, CHECK_KEYS, f"{where} checks")
    if "length_ratio" in checks:
        checks["length_ratio"] = _range(checks["length_ratio"], f"{where} checks.length_ratio")
    if "entities" in checks and not (isinstance(checks["entities"], list) and checks["entities"]):
        raise SpecError(f"{where} checks.entities: expected a non-empty list of words or table names")
    return checks


def _operator(name: str, op: Any, tables: dict, units: dict, base: Path) -> Operator:
    where = f"operators.{name}"
    op = dict(_mapping(op, where))
    kind = op.get("kind")
    if kind not in KINDS:
        raise SpecError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
    _unknown(op, OPERATOR_KEYS[kind], where)
    if op.get("category") not in CATEGORIES:
        raise SpecError(f"{where}: category {op.get('category')!r} is not one of {', '.join(CATEGORIES)}")
    options = {k: v for k, v in op.items() if k not in COMMON_KEYS}
    if kind == "table":
        options = {"pairs": _table(op, tables, base, where), "match": op.get("match", "word"),
                   "case": op.get("case", "exact")}
        if options["match"] not in ("word", "pattern") or options["case"] not in ("exact", "preserve"):
            raise SpecError(f"{where}: match is word | pattern and case is exact | preserve")
        if options["match"] == "pattern":
            for pattern, value in options["pairs"].items():
                check_replacement(pattern, value, where, re.IGNORECASE if options["case"] == "preserve" else 0)
    elif kind == "numeric":
        mode = op.get("mode")
        if mode not in NUMERIC_MODES:
            raise SpecError(f"{where}: mode {mode!r} is not one of {', '.join(NUMERIC_MODES)}")
        if mode in ("unit_swap", "convert") and not units:
            raise SpecError(f"{where}: mode {mode} needs the spec's units (dimension -> unit -> [scale, offset])")
        if mode == "scale":
            options["factor"] = _range(op.get("factor", [0.5, 2.0]), f"{where}.factor")
        if mode == "shift":
            options["shift"] = _range(op.get("shift", [-10, 10]), f"{where}.shift")
        if "decimals" in op and (isinstance(op["decimals"], bool) or not isinstance(op["decimals"], int)
                                 or not 0 <= op["decimals"] <= 12):
            raise SpecError(f"{where}.decimals: expected an integer from 0 to 12, got {op['decimals']!r}")
        for key in ("require_unit", "pool"):
            if not isinstance(op.get(key, False), bool):
                raise SpecError(f"{where}.{key}: expected true or false, got {op[key]!r}")
        if op.get("pool") and mode != "unit_swap":
            raise SpecError(f"{where}.pool: only a unit_swap draws its unit from the sources (mode borrow draws "
                            "the whole quantity)")
        if mode == "borrow" and op["category"] != "error":
            raise SpecError(f"{where}: a value borrowed from another source is an error, not a representation")
        if mode in ("unit_swap", "convert") and (mode == "convert") != (op["category"] == "represent"):
            raise SpecError(f"{where}: a correct unit conversion is represent, a swap without converting is error")
    elif kind == "swap":
        options = {"classes": _classes(op.get("classes"), where), "case": op.get("case", "preserve")}
        if options["case"] not in ("exact", "preserve"):
            raise SpecError(f"{where}: case is exact | preserve")
    elif kind == "order":
        if op["category"] != "error":
            raise SpecError(f"{where}: two steps in another order is an error, not a representation")
    elif kind == "format":
        if op.get("rewrite") not in FORMAT_REWRITES:
            raise SpecError(f"{where}: rewrite {op.get('rewrite')!r} is not one of {', '.join(FORMAT_REWRITES)}")
    else:
        if not isinstance(op.get("instruction"), str) or not op["instruction"].strip():
            raise SpecError(f"{where}: a model operator needs its instruction (the text the rewriting model reads)")
        stand_in = op.get("stand_in")
        options["stand_in"] = tuple([stand_in] if isinstance(stand_in, str) else stand_in or ())
    return Operator(name, kind, op["category"], options, _checks(op.get("checks"), where))


def _classes(value: Any, where: str) -> tuple[tuple[str, ...], ...]:
    """A swap operator's classes: lists of two or more interchangeable words, no word in two classes."""
    if not isinstance(value, list) or not value:
        raise SpecError(f"{where}.classes: expected a list of classes, each a list of two or more words")
    seen: set[str] = set()
    for i, terms in enumerate(value):
        if not (isinstance(terms, list) and len(terms) >= 2 and all(isinstance(t, str) and t.strip() for t in terms)):
            raise SpecError(f"{where}.classes[{i}]: expected a list of two or more words, got {terms!r}")
        twice = seen & {t.casefold() for t in terms} or len({t.casefold() for t in terms}) < len(terms)
        if twice:
            raise SpecError(f"{where}.classes[{i}]: a word stands in two classes (or twice in one): {terms!r}")
        seen |= {t.casefold() for t in terms}
    return tuple(tuple(t.strip() for t in terms) for terms in value)


def _edits(value: Any, where: str) -> tuple[int, int]:
    low, high = _range(value, where)
    if low != int(low) or high != int(high) or low < 1:
        raise SpecError(f"{where}: expected a whole number of edits >= 1, or [low, high], got {value!r}")
    return int(low), int(high)


def _units(value: Any) -> dict[str, dict[str, tuple[float, float]]]:
    out = {}
    for dim, units in _mapping(value or {}, "units").items():
        out[str(dim)] = {}
        for unit, conv in _mapping(units, f"units.{dim}").items():
            if not re.fullmatch(r"[^\s\d.,:;()\[\]{}-][^\s]*", str(unit)):
                raise SpecError(f"units.{dim}.{unit}: a unit is a token without spaces that does not start with a "
                                f"digit or punctuation")
            if any(str(unit) in seen for seen in out.values()):
                raise SpecError(f"units.{dim}.{unit}: already a unit of another dimension")
            if isinstance(conv, (int, float)) and not isinstance(conv, bool):
                conv = [conv, 0]
            if not (isinstance(conv, list) and len(conv) == 2 and all(isinstance(c, (int, float)) for c in conv)
                    and conv[0] != 0):
                raise SpecError(f"units.{dim}.{unit}: expected a scale or [scale, offset] to the base unit")
            out[str(dim)][str(unit)] = (float(conv[0]), float(conv[1]))
        if len(out[str(dim)]) < 2:
            raise SpecError(f"units.{dim}: a dimension needs at least two units")
    return out


def _template(value: Any) -> list[dict] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(
            isinstance(m, dict) and m.get("role") in ("system", "user", "assistant") and isinstance(m.get("content"),
                                                                                               str) for m in value):
        raise SpecError("template: expected a list of {role: system | user | assistant, content: text} messages")
    if not any("text" in PLACEHOLDER.findall(m["content"]) for m in value):
        raise SpecError("template: no message holds {{text}}, the place of the perturbed text")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _sets(value: Any, operators: dict[str, Operator], edits: tuple[int, int] = DEFAULT_EDITS) -> list[PerturbSet]:
    if not isinstance(value, list) or not value:
        raise SpecError("sets: expected a non-empty list of {name, operators, rates}")
    out, seen = [], set()
    for i, entry in enumerate(value):
        where = f"sets[{i}]"
        entry = _mapping(entry, where)
        _unknown(entry, SET_KEYS, where)
        name = entry.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
            raise SpecError(f"{where}: name {name!r} is not a word (letters, digits, _)")
        ops = entry.get("operators", [name])
        ops = [ops] if isinstance(ops, str) else ops
        for op in ops:
            if op not in operators:
                near = difflib.get_close_matches(str(op), list(operators), n=1)
                raise SpecError(f"{where} ({name}): no operator {op!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
        categories = {operators[o].category for o in ops}
        if len(categories) != 1:
            raise SpecError(f"{where} ({name}): its operators mix the categories error and represent")
        kinds = {operators[o].kind == "model" for o in ops}
        if True in kinds and len(ops) > 1:
            raise SpecError(f"{where} ({name}): a model operator is a set of its own (one instruction per rewrite)")
        rates = entry.get("rates", [1.0])
        rates = [rates] if isinstance(rates, (int, float)) else rates
        if not isinstance(rates, list) or not rates or not all(
                isinstance(r, (int, float)) and not isinstance(r, bool) and 0 < r <= 1 for r in rates):
            raise SpecError(f"{where} ({name}): rates must be numbers in (0, 1], got {rates!r}")
        category = categories.pop()
        if "edits" in entry and ("rates" in entry or category != "error"):
            raise SpecError(f"{where} ({name}): edits is for an error set without rates")
        per_copy = _edits(entry["edits"], f"{where} ({name}).edits") if "edits" in entry else \
            edits if "rates" not in entry and category == "error" else None
        pset = PerturbSet(name, tuple(ops), tuple(float(r) for r in rates), category, per_copy)
        for rate in pset.rates:
            if pset.set_name(rate) in seen or pset.set_name(rate) == ORIGINAL_SET:
                raise SpecError(f"{where}: set {pset.set_name(rate)} is named twice")
            seen.add(pset.set_name(rate))
        out.append(pset)
    return out


def parse_spec(data: Any, *, path: str = "<spec>", base: Path | None = None) -> Spec:
    """A checked `Spec` from the YAML's data (see the module doc); SpecError naming the key otherwise."""
    data = _mapping(data, f"spec {path}")
    _unknown(data, SPEC_KEYS, f"spec {path}")
    base = base or Path(".")
    try:
        tables = {str(k): (read_table_file(base / str(v["file"]), f"tables.{k}") if isinstance(v, dict) and "file" in v
                           else {str(a): str(b) for a, b in _mapping(v, f"tables.{k}").items()})
                  for k, v in _mapping(data.get("tables") or {}, "tables").items()}
        units = _units(data.get("units"))
        operators = {str(n): _operator(str(n), op, tables, units, base)
                     for n, op in _mapping(data.get("operators") or {}, "operators").items()}
        for op in operators.values():
            for stand_in in op.options.get("stand_in", ()):
                if stand_in not in operators or operators[stand_in].kind == "model" \
                        or operators[stand_in].category != op.category:
                    raise SpecError(f"operators.{op.name}.stand_in: {stand_in!r} is not a rule operator of category "
                                    f"{op.category}")
            for entity in op.checks.get("entities", ()):
                if not isinstance(entity, str):
                    raise SpecError(f"operators.{op.name} checks.entities: {entity!r} is not a word or table name")
        seed = data.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise SpecError(f"seed: expected an integer, got {seed!r}")
        return Spec(name=str(data.get("name") or Path(path).stem), path=str(path),
                    text_field=str(data.get("text_field", "text")), template=_template(data.get("template")),
                    operators=operators, units=units, tables=tables,
                    sets=_sets(data.get("sets"), operators, _edits(data.get("edits", list(DEFAULT_EDITS)), "edits")),
                    original=bool(data.get("original", False)), seed=seed,
                    **({"rewriter_system": str(data["rewriter_system"])} if data.get("rewriter_system") else {}))
    except SpecError as e:
        raise SpecError(f"spec {path}: {e}" if not str(e).startswith("spec ") else str(e)) from None


def load_spec(value: str, *, seed: int | None = None) -> Spec:
    """The spec at ``value`` (a path, or a pack's name), checked; ``seed`` overrides the spec's."""
    path = spec_path(value)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SpecError(f"spec {path}: cannot read it: {e}") from None
    spec = parse_spec(data, path=str(path), base=path.parent)
    if seed is not None:
        spec = replace(spec, seed=int(seed))
    return spec


def table_entities(spec: Spec, names: list[str]) -> dict[str, set[str]]:
    """The ``entities`` check's words: each entity (a listed word, or every key of a listed table or table
    operator) -> the spellings that count as it surviving: itself, and its equivalents in the tables of the spec's
    represent table operators (acetone survives as C3H6O where a represent operator rewrites one as the other; a
    tube furnace does not survive as the hot plate an error table swaps it for)."""
    equivalent: dict[str, set[str]] = {}
    for op in spec.operators.values():
        if op.kind == "table" and op.category == "represent" and op.options["match"] == "word":
            for k, v in op.options["pairs"].items():
                equivalent.setdefault(k, set()).add(v)
                equivalent.setdefault(v, set()).add(k)
    out: dict[str, set[str]] = {}
    for name in names:
        op = spec.operators.get(name)
        keys = op.options["pairs"] if op is not None and op.kind == "table" else spec.tables.get(name, {name: name})
        for key in keys:
            out[key] = {key} | equivalent.get(key, set())
    return out


def type_operators(spec: Spec, types: list[str]) -> set[str]:
    """The operators whose edits make each of ``types`` that is a set of one operator: that operator and, for a model
    operator, its stand-ins. An item of another set (a combined one) holding an edit of one of them holds that type's
    kind of edit. A combined set named in ``types`` adds none: its operators are the single types'."""
    out: set[str] = set()
    for pset in spec.sets:
        if pset.name in types and len(pset.operators) == 1:
            op = spec.operators[pset.operators[0]]
            out |= {op.name, *op.options.get("stand_in", ())}
    return out


def select_sets(spec: Spec, names: list[str] | None) -> Spec:
    """The spec with only the sets ``names`` lists (a set's name, all its rates); SpecError naming the nearest set
    for a name the spec does not have."""
    if not names:
        return spec
    known = [s.name for s in spec.sets]
    for name in names:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            raise SpecError(f"spec {spec.path}: no set {name!r}" + (f"; did you mean {near[0]!r}?" if near else "")
                            + f"; sets: {', '.join(known)}")
    return replace(spec, sets=[s for s in spec.sets if s.name in names])
