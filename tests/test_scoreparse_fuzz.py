"""The linear-time score parser against a slow reference parser, on text built from the grammar's pieces.

The reference is the parser as it was written with backtracking regular expressions (fences, key: value pairs) and a
sort for the outermost braces: obviously what the rules say, quadratic on some long inputs, harmless at the 400
characters used here. Both share the value reading (``safe_arithmetic``, the JSON flattening), which is not scanned.
Inputs mix the pieces (fence markers and tags, blanks, braces, quotes and escapes, colons, commas, keys, digits,
operators) with long runs of any one of them, the shapes where a scanner is most likely to differ.
"""

from __future__ import annotations

import json
import re
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from judgetrain.data import scoreparse
from judgetrain.data.scoreparse import ScoreResult, parse_overall_score_result, parse_scores

# ---- the reference parser ---------------------------------------------------------------------------------------

REF_FENCE = re.compile(r"```[ \t]*([^\n`]*)\n(.*?)```", re.DOTALL)
REF_PAIR = re.compile(r"""["']?(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)["']?[ \t]*:[ \t]*("[^"\n]*"|'[^'\n]*'|[^,}\n]+)""")


def ref_fences(text: str) -> list[tuple[str, str]]:
    return [(m.group(1).strip().lower(), m.group(2)) for m in REF_FENCE.finditer(text)]


def ref_pairs(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in REF_PAIR.finditer(text)]


def ref_bare_objects(text: str) -> list[str]:
    """Braces paired as a stack pairs them, outside strings; a string opens at a quote inside a brace and ends at the
    next unescaped quote or newline. The spans not inside another span, in order."""
    opened, spans, quoted, i = [], [], False, 0
    while i < len(text):
        ch = text[i]
        if quoted and ch == "\\":
            i += 2  # the escaped character, whatever it is, is skipped with it
            continue
        if quoted:
            quoted = ch not in '"\n'
        elif ch == '"':
            quoted = bool(opened)
        elif ch == "{":
            opened.append(i)
        elif ch == "}" and opened:
            spans.append((opened.pop(), i))
        i += 1
    return [text[s : e + 1] for s, e in sorted(spans) if not any(s2 < s and e < e2 for s2, e2 in spans)]


def ref_block_items(block: str) -> dict[str, object]:
    text = block.strip()
    try:
        loaded = json.loads(text)
    except Exception:  # noqa: BLE001
        loaded = None
    items: dict[str, object] = {}
    if isinstance(loaded, dict):
        scoreparse._flatten(loaded, items)
        return items
    for name, raw in ref_pairs(text):
        items.setdefault(name, raw.strip())
    return items


def ref_blocks(text: str, key: str) -> list[tuple[str, list[str]]]:
    fences = ref_fences(text)
    return [("json_fence", [b for t, b in fences if t == "json"]), ("fence", [b for t, b in fences if t == ""]),
            ("bare", ref_bare_objects(text) if key in text else [])]


def ref_last(blocks: list[str], needle: str, max_blocks: int | None) -> list[str]:
    holding = [b for b in reversed(blocks) if needle in b]
    return holding if max_blocks is None else holding[:max_blocks]


def ref_candidates(text: str, key: str, max_blocks: int | None):
    for source, blocks in ref_blocks(text, key):
        for block in ref_last(blocks, key, max_blocks):
            items = ref_block_items(block)
            if key in items:
                yield source, items


def ref_numbers(items: dict) -> dict[str, float]:
    return {k: v for k, v in ((k, scoreparse._to_number(raw)) for k, raw in items.items()) if v is not None}


def ref_result(text: str, key: str = "overall_score", lo: float = 0.5, hi: float = 5.5,
               max_blocks: int | None = None) -> ScoreResult:
    if not text.strip():
        return ScoreResult(None, "unparseable", detail="empty evaluation")
    found = False
    for source, items in ref_candidates(text, key, max_blocks):
        found = True
        value = scoreparse._to_number(items[key])
        if value is None:
            continue
        if not lo <= value <= hi:
            return ScoreResult(None, "out_of_range", value, source, f"{key}={value:g} outside [{lo:g}, {hi:g}]",
                               ref_numbers(items))
        return ScoreResult(value, "ok", value, source, "", ref_numbers(items))
    return ScoreResult(None, "unparseable", detail=f"{key} holds no number" if found else f"no block with {key}")


def ref_scores(text: str, key: str = "overall_score", max_blocks: int | None = None) -> dict[str, float]:
    if not text.strip():
        return {}
    for _, items in ref_candidates(text, key, max_blocks):
        if key in ref_numbers(items):
            return ref_numbers(items)
    fences = ref_fences(text)
    blocks = [b for t, b in fences if t == "json"] + [b for t, b in fences if t == ""] + ref_bare_objects(text)
    for block in ref_last(blocks, ":", max_blocks):
        if ref_numbers(ref_block_items(block)):
            return ref_numbers(ref_block_items(block))
    return {}


# ---- inputs from the grammar's pieces ---------------------------------------------------------------------------

PIECES = [
    "```json", "```JSON ", "```", "``", "`", "```json\n", "```\n", "``` \t\n", " ", "\t", "\n", "\r", "{", "}",
    "[", "]", '"', "'", "\\", '\\"', ":", ",", "overall_score", '"overall_score"', "'overall_score'", "a_score",
    '"a_score": 4', "x", "_", "é", "0", "1", "3", "4.5", "9", "+", "-", "*", "/", "(", ")", ".", "=", "e", "NaN",
    "null", "true", '{"overall_score": 4}', "{'overall_score': (4+3.5)/2}", "overall_score: 2 * 2,",
]
MAX_CHARS = 400

run = st.tuples(st.sampled_from(PIECES), st.integers(2, 80)).map(lambda p: p[0] * p[1])  # a long run of one piece
entry = st.tuples(  # key: value, as a judge writes it (quoted or not, arithmetic, blanks, nothing)
    st.sampled_from(["overall_score", '"overall_score"', "'overall_score'", "a_score", "_x1", "1a"]),
    st.sampled_from([":", " :", "\t: ", '": ', "':", ": \t", ":\n"]),
    st.sampled_from(["4", "(4+3.5)/2", '"4.5"', "'3'", "", " ", "x", "1e999", '"(4+4)/2 = 4"', "NaN", "-2", '"4']),
    st.sampled_from([",", ", ", "\n", "}", ""]),
).map("".join)
atom = st.one_of(st.sampled_from(PIECES), run, entry)
# nested: braces and fences around other pieces, opened and (not always) closed
texts = st.recursive(
    st.lists(atom, max_size=6).map("".join),
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["{", '{"', "{'", "{\n"]), st.lists(inner, max_size=4).map("".join),
                  st.sampled_from(["}", '"}', "'}", "\n}", ""])).map("".join),
        st.tuples(st.sampled_from(["```json\n", "```\n", "``` json \n", "```JSON\t\n", "```python\n", "```"]),
                  st.lists(inner, max_size=4).map("".join), st.sampled_from(["```", "\n```", "``", ""])).map("".join),
        st.lists(inner, max_size=4).map("".join),
    ),
    max_leaves=24,
).map(lambda text: text[:MAX_CHARS])


@settings(max_examples=500, deadline=None)
@given(texts)
def test_scanners_find_what_the_reference_patterns_find(text):
    assert scoreparse._fences(text) == ref_fences(text)
    assert list(scoreparse._pairs(text)) == ref_pairs(text)
    assert scoreparse._bare_objects(text) == ref_bare_objects(text)


@settings(max_examples=300, deadline=None)
@given(texts, st.sampled_from(["overall_score", "a_score"]))
def test_scores_are_those_of_the_reference_parser(text, key):
    assert parse_overall_score_result(text, key=key) == ref_result(text, key)
    assert parse_scores(text, key=key) == ref_scores(text, key)


@settings(max_examples=150, deadline=None)
@given(texts)
def test_only_the_last_blocks_of_a_tier_are_read(text):
    with mock.patch.object(scoreparse, "_MAX_BLOCKS", 2):
        assert parse_overall_score_result(text) == ref_result(text, max_blocks=2)
        assert parse_scores(text) == ref_scores(text, max_blocks=2)


def test_a_block_beyond_the_last_hundred_is_not_read():
    text = '{"overall_score": 4} ' + '{"overall_score": "x"} ' * scoreparse._MAX_BLOCKS
    assert ref_result(text).score == 4.0  # the reference without a bound reads the first block
    assert parse_overall_score_result(text) == ref_result(text, max_blocks=scoreparse._MAX_BLOCKS)
    assert parse_overall_score_result(text).detail == "overall_score holds no number"
    assert parse_overall_score_result(text[text.index(" ") + 1 :].replace('"x"', "3", 1)).score == 3.0
