"""Format rewrites (represent): markdown to plain text, plain text to markdown, a list's order, whitespace, a number's
thousands separators. Each lists the spans it could edit (`judgetrain.perturb.edits.Span`), never inside code (a
fenced block, a fence nested in a longer fence included; an indented block; inline code), math or an identifier,
and never where the rewrite would change what the text means:

- plain to markdown: a bullet starts a sentence, never the middle of one (a hard-wrapped sentence stays one item);
  lines after a line ending in ``:`` are items of that list; a setext heading (``Results`` over ``=======``) and a
  rule (``---``) are left as they are;
- whitespace: a paragraph break is never removed (three blank lines become one, not none) nor put before an
  indented line or a setext underline (which would turn text into code or a heading into text);
- number format: years (``2023``, ``2019–2023``), standards (``ISO 9001``), ports, labels (``Step 1200``) and
  numbers beside letters or dashes keep their digits as written.

    spans = FORMATS["number_format"]("thousands", "Add 1500 mL.")     # one span: 1500 -> 1,500
"""

from __future__ import annotations

import random
import re
from typing import Callable

from judgetrain.perturb.edits import Span

LIST_LINE = re.compile(r"^([ \t]*)([-*+]|\d+[.)])[ \t]+(.*)$", re.M)
_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_INLINE = re.compile(
    r"(`+)(?!`)[^\n]*?(?<!`)\1(?!`)"  # inline code
    r"|\$\$.+?\$\$|\\\[.+?\\\]|\\\(.+?\\\)|(?<![\w$])\$(?=\S)[^$\n]+?(?<=\S)\$(?![\w$])"  # math
    r"|(?<![\w.])(?=[\w.]*_)[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?:\(\))?"  # identifiers: snake_case, __init__
    r"|(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\(\)", re.S)
# a thematic break (---, * * *) or a setext heading's underline (===, ---)
_RULE = re.compile(r"^ {0,3}(?:([-*_])(?:[ \t]*\1){2,}|=+|-+)[ \t]*$")
_SENTENCE_END = (".", "!", "?", ":", ";")
_LABELS = {"port", "ports", "no", "no.", "number", "step", "stage", "figure", "fig", "fig.", "table", "section",
           "version", "model", "code", "id", "room", "page", "line", "item", "entry", "run", "batch", "sample"}
# the units a year-like number may carry and stay a quantity (1500 mL, 2000 rpm)
_UNIT_AFTER = re.compile(r"[ \u00a0\u202f]?(?:[µμunmcdkMG]?(?:g|L|l|m|s|h|W|V|A|Pa|J|K|M|Hz|mol|bar|Torr)|min|rpm|"
                         r"°C|°F|°|%|ppm|wt|mAh|nm|mm|cm|km)(?!\w)")


def _columns(line: str) -> int:
    """The columns of a line's leading whitespace (a tab to the next multiple of 4)."""
    col = 0
    for c in line:
        if c == " ":
            col += 1
        elif c == "\t":
            col = col // 4 * 4 + 4
        else:
            break
    return col


def code_blocks(text: str) -> list[tuple[int, int]]:
    """Fenced code blocks (closed by a line of the fence's character at least as long: a shorter fence inside is
    content; unclosed, to the text's end) and indented code blocks (lines indented 4 columns after a blank line or
    the text's start, with the blank lines between them), as (start, end)."""
    lines = text.split("\n")
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    regions, i, after_blank = [], 0, True
    while i < len(lines):
        line = lines[i]
        fence = _FENCE_OPEN.match(line)
        if fence and not (fence.group(1)[0] == "`" and "`" in fence.group(2)):
            mark = fence.group(1)
            close = re.compile(rf" {{0,3}}{re.escape(mark[0])}{{{len(mark)},}}[ \t]*")
            j = next((j for j in range(i + 1, len(lines)) if close.fullmatch(lines[j])), len(lines) - 1)
            regions.append((starts[i], starts[j] + len(lines[j])))
            i, after_blank = j + 1, False
            continue
        if after_blank and line.strip() and _columns(line) >= 4:
            j, last = i, i
            while j < len(lines) and (_columns(lines[j]) >= 4 or not lines[j].strip()):
                last = j if lines[j].strip() else last
                j += 1
            regions.append((starts[i], starts[last] + len(lines[last])))
            i, after_blank = last + 1, False
            continue
        after_blank = not line.strip()
        i += 1
    return regions


def protected(text: str) -> list[tuple[int, int]]:
    """Where format rewrites never go: code blocks (`code_blocks`), inline code, math and identifiers
    (``__init__``, ``snake_case``, ``f()``), as (start, end)."""
    blocks = code_blocks(text)
    inline = [m.span() for m in _INLINE.finditer(text) if not any(b <= m.start() < e for b, e in blocks)]
    return blocks + inline


def _outside(spans: list[Span], text: str) -> list[Span]:
    """``spans`` that touch no protected region of ``text``."""
    regions = protected(text)
    return [s for s in spans if not any(s.start < e and b < max(s.end, s.start + 1) for b, e in regions)]


def _markdown_to_plain(name: str, text: str) -> list[Span]:
    """Emphasis markers (CommonMark's rule: an opening marker before a non-space, a closing one after one, never
    inside a word), headings' and bullets' markers removed; a link written as its text and its address."""
    spans = []
    for pattern in (r"(?<![*\w])\*\*(?=\S)([^*\n]+?)(?<=\S)\*\*(?![*\w])", r"(?<![_\w])__(?=\S)([^_\n]+?)(?<=\S)__(?![_\w])",
                    r"(?<![*\w])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![*\w])",
                    r"(?<![_\w])_(?=[^\s_])([^_\n]+?)(?<=[^\s_])_(?![_\w])"):
        spans += [Span(m.start(), m.end(), name, lambda _r, g=m.group(1): g) for m in re.finditer(pattern, text)]
    spans += [Span(m.start(), m.end(), name, lambda _r, t=m.group(1), u=m.group(2): f"{t} ({u})")
              for m in re.finditer(r"(?<!!)\[([^\]\n]+)\]\(([^)\s]+)\)", text)]
    spans += [Span(m.start(), m.end(), name, lambda _r: "") for m in re.finditer(r"^#{1,6}[ \t]+", text, re.M)]
    spans += [Span(m.end(1), m.end(), name, lambda _r: "") for m in re.finditer(r"^([ \t]*)[-*+][ \t]+(?=\S)", text, re.M)]
    return _outside(spans, text)


def _paragraph_lines(lines: list[tuple[int, str]]) -> list[list[int]]:
    """The runs of non-blank lines (indices), each cut at a rule or setext underline, whose line and the one above
    it (a setext heading) belong to none."""
    runs, run = [], []
    for i, (_, line) in enumerate(lines + [(0, "")]):
        if not line.strip():
            runs, run = runs + [run] if run else runs, []
        elif _RULE.match(line):
            if run and (set(line.strip()) <= {"=", "-"}):
                run.pop()  # a setext heading's text
            runs, run = runs + [run] if run else runs, []
        else:
            run.append(i)
    return runs


def _plain_to_markdown(name: str, text: str) -> list[Span]:
    """A line ending in ``:`` (at most 80 characters) in bold; each sentence that starts a line of a paragraph of two
    or more (a line after one ending a sentence, or after the paragraph's ``:`` line) made a bullet."""
    spans = []
    lines = [(m.start(), m.group(0)) for m in re.finditer(r"^[^\n]*$", text, re.M)]
    for run in _paragraph_lines(lines):
        colon, starts = False, []
        for k, i in enumerate(run):
            body = lines[i][1].strip()
            before = lines[run[k - 1]][1].rstrip() if k else ""
            if k == 0 or colon or before.endswith(_SENTENCE_END):
                starts.append(i)
            colon = colon or body.endswith(":")
        for i in starts:
            start, line = lines[i]
            body, lead = line.strip(), len(line) - len(line.lstrip())
            if LIST_LINE.match(line) or body.startswith(("#", "|", ">", "*", "_", "`", "$")) or _columns(line) >= 4:
                continue
            if body.endswith(":") and len(body) <= 80 and "*" not in body:
                spans.append(Span(start + lead, start + len(line.rstrip()), name, lambda _r, b=body: f"**{b}**"))
            elif len(starts) > 1:
                spans.append(Span(start + lead, start + lead, name, lambda _r: "- "))
    return _outside(spans, text)


def _list_order(name: str, text: str) -> list[Span]:
    """Each block of two or more consecutive list lines, its items drawn in another order (numbers stay put)."""
    spans, block = [], []
    matches = list(LIST_LINE.finditer(text))
    for m in matches + [None]:
        if m is not None and block and m.start() == block[-1].end() + 1 and m.group(1) == block[-1].group(1):
            block.append(m)
            continue
        if len(block) >= 2 and len({b.group(3) for b in block}) > 1:
            spans.append(Span(block[0].start(), block[-1].end(), name, _shuffled(block)))
        block = [m] if m is not None else []
    return _outside(spans, text)


def _shuffled(block: list[re.Match]) -> Callable[[random.Random], str | None]:
    def draw(rng: random.Random) -> str | None:
        bodies = [b.group(3) for b in block]
        order = bodies[:]
        while order == bodies:
            rng.shuffle(order)
        return "\n".join(f"{b.group(1)}{b.group(2)} {body}" for b, body in zip(block, order))

    return draw


def _whitespace(name: str, text: str) -> list[Span]:
    """Runs of spaces inside a line made one, trailing spaces cut, three or more line breaks made two, and a line
    break after a sentence's end made a paragraph break (never before an indented line, a rule or an underline)."""
    spans = [Span(m.start(), m.end(), name, lambda _r: " ") for m in re.finditer(r"(?<=\S)[ \t]{2,}(?=\S)", text)]
    spans += [Span(m.start(), m.end(), name, lambda _r: "") for m in re.finditer(r"[ \t]+$", text, re.M)]
    spans += [Span(m.start(), m.end(), name, lambda _r: "\n\n") for m in re.finditer(r"\n{3,}", text)]
    for m in re.finditer(r"(?<=[.:;!?])\n(?=[^\n])", text):
        following = text[m.end(): text.find("\n", m.end()) % (len(text) + 1)]
        if _columns(following) < 4 and not _RULE.match(following):
            spans.append(Span(m.start(), m.end(), name, lambda _r: "\n\n"))
    return _outside(spans, text)


def _is_code_number(text: str, start: int, end: int, value: str) -> bool:
    """Whether the number ``value`` at ``text[start:end]`` names something rather than counts it: a year (1000 to
    2100 without a unit after it), a standard's or a product's number (after a word in capitals: ISO 9001), a port,
    a step or another label."""
    words = re.findall(r"[^\s]+", text[max(0, start - 40): start])
    before = words[-1] if words else ""
    if (len(before) > 1 and before.isalpha() and before.isupper()) or before.lower().rstrip(":") in _LABELS \
            or before.endswith("#"):
        return True
    return len(value) == 4 and 1000 <= int(value) <= 2100 and not _UNIT_AFTER.match(text, end)


def _number_format(name: str, text: str) -> list[Span]:
    """A number of four or more digits written with thousands separators (1500 -> 1,500) or without them (2,000 ->
    2000), a number that names something (`_is_code_number`) or stands beside a dash, a letter or a separator
    aside."""
    spans = []
    for m in re.finditer(r"(?<![\w.,:/#\u2212\u2013\u2014-])(\d{1,3}(?:,\d{3})+|\d{4,})(\.\d+)?"
                         r"(?![\w,:/\u2212\u2013\u2014-]|\.\d)", text):
        whole = m.group(1)
        if not m.group(2) and _is_code_number(text, m.start(), m.end(), whole.replace(",", "")):
            continue
        new = whole.replace(",", "") if "," in whole else f"{int(whole):,}"
        spans.append(Span(m.start(1), m.end(1), name, lambda _r, n=new: n))
    return _outside(spans, text)


FORMATS: dict[str, Callable[[str, str], list[Span]]] = {
    "markdown_to_plain": _markdown_to_plain, "plain_to_markdown": _plain_to_markdown, "list_order": _list_order,
    "whitespace": _whitespace, "number_format": _number_format,
}
