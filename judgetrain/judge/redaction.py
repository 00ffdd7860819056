"""An API key kept out of every text a server's answer reaches: `redact` replaces each run of the key by ``***``.

    from judgetrain.judge.redaction import redact
    redact('{"error": "key sk\\u002dABCDEFGH seen"}', "sk-ABCDEFGH")   # '{"error": "key *** seen"}'

A server may echo the key in any form: as sent, in part, JSON-escaped (``\\uXXXX`` in either case, ``\\/``, ``\\"``),
URL-encoded (``%XX`` in either case, ``+`` for a space), as HTML entities (``&#45;``, ``&#x2d;``, ``&hyphen;``),
one character at a time or escaped twice over (``\\\\u002d``, ``%5Cu002d``, ``&amp;#45;``). `decoded` decodes all of
these in a copy of the text, pass after pass, and keeps, for each decoded character, the span of the original text
it came from; the key and its pieces (any `REDACT_RUN` characters in a row) are looked for in the original and in
each decoded copy, and what matches in a copy is redacted as the span of the original it was decoded from.
"""

from __future__ import annotations

import html.entities
import json
import re
import urllib.parse

REDACT_RUN = 8  # characters in a row of the key (in any form) that are redacted wherever they appear
DECODE_PASSES = 4  # a key escaped within an escape (JSON in JSON, a JSON escape URL-encoded) is decoded this deep
MIN_CUT_START = 4  # a start of the key this long at the very end of a text cut short is redacted
PARTIAL_ESCAPE = re.compile(r"(?:\\(?:[uUxX][0-9A-Fa-f]{0,3})?|%[0-9A-Fa-f]?|&#?[xX]?[0-9A-Za-z]{0,31})$")

JSON_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
ESCAPE = re.compile(r"\\(?:[uU]([0-9A-Fa-f]{4})|[xX]([0-9A-Fa-f]{2})|([\"\\/bfnrt]))"
                    r"|((?:%[0-9A-Fa-f]{2})+)"
                    r"|&(?:#(?:([0-9]{1,7})|[xX]([0-9A-Fa-f]{1,6}))|([A-Za-z][A-Za-z0-9]{1,31}));?")


def _percent(run: str) -> list[tuple[str, int]]:
    """The characters a run of ``%XX`` escapes stands for, each with the length of the run's text it came from: UTF-8
    sequences decoded whole, a byte that starts none kept as written."""
    raw = bytes(int(run[i + 1:i + 3], 16) for i in range(0, len(run), 3))
    out, i = [], 0
    while i < len(raw):
        for n in (1, 2, 3, 4):
            try:
                out.append((raw[i:i + n].decode("utf-8"), 3 * n))
                i += n
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append((run[3 * i:3 * i + 3], 3))
            i += 1
    return out


def _entity(match: re.Match) -> str | None:
    """The character an HTML entity stands for; None for a name HTML does not define."""
    if match.group(5) or match.group(6):
        code = int(match.group(5), 10) if match.group(5) else int(match.group(6), 16)
        return chr(code) if code <= 0x10FFFF else None
    name = match.group(7)
    return html.entities.html5.get(name + ";") if match.group().endswith(";") else html.entities.html5.get(name)


def _decode_once(text: str) -> tuple[str, list[int], list[int]]:
    """``text`` with every escape decoded once, and for each decoded character the start and end of its text."""
    pieces: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    at = 0
    for m in ESCAPE.finditer(text):
        pieces.append(text[at:m.start()])
        starts.extend(range(at, m.start()))
        ends.extend(range(at + 1, m.start() + 1))
        if m.group(4):
            here = m.start()
            for char, width in _percent(m.group(4)):
                pieces.append(char)
                starts.extend([here] * len(char))
                ends.extend([here + width] * len(char))
                here += width
        else:
            hexa = m.group(1) or m.group(2)
            char = chr(int(hexa, 16)) if hexa else JSON_ESCAPES.get(m.group(3) or "") or _entity(m)
            char = m.group() if char is None else char
            pieces.append(char)
            starts.extend([m.start()] * len(char))
            ends.extend([m.end()] * len(char))
        at = m.end()
    pieces.append(text[at:])
    starts.extend(range(at, len(text)))
    ends.extend(range(at + 1, len(text) + 1))
    return "".join(pieces), starts, ends


def decoded(text: str) -> list[tuple[str, list[int], list[int]]]:
    """Each decoded copy of ``text`` (one per pass that changed something, `DECODE_PASSES` at most; a copy with
    ``+`` read as a space after the last), each as (copy, starts, ends): the span of ``text`` its character ``i``
    was decoded from is ``text[starts[i]:ends[i]]``."""
    copies: list[tuple[str, list[int], list[int]]] = []
    current, starts, ends = text, list(range(len(text))), list(range(1, len(text) + 1))
    for _ in range(DECODE_PASSES):
        if not any(c in current for c in "\\%&"):
            break
        nxt, s, e = _decode_once(current)
        if nxt == current:
            break
        current, starts, ends = nxt, [starts[i] for i in s], [ends[j - 1] for j in e]
        copies.append((current, starts, ends))
    if "+" in current:
        copies.append((current.replace("+", " "), starts, ends))
    return copies


def _secret_forms(secret: str) -> list[str]:
    """The forms a server may echo a secret in, looked for in the text as written: as sent, JSON-escaped (``\\/``,
    ``\\uXXXX``), URL-encoded (``%XX`` in either case, ``+`` for a space); a start of any of them ends a text cut
    short."""
    escaped = json.dumps(secret)[1:-1]
    quoted = [urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret, safe=""),
              urllib.parse.quote(secret)]
    forms = {secret, escaped, escaped.replace("/", "\\/"), "".join(f"\\u{ord(c):04x}" for c in secret)}
    forms.update(quoted)
    forms.update(re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), q) for q in quoted)
    return sorted(forms, key=len, reverse=True)


def _mark(marks: bytearray, view: str, forms: list[str], cut: bool, starts: list[int], ends: list[int]) -> None:
    """Mark in ``marks`` (one per character of the original text) the spans that ``view``'s runs of ``forms`` came
    from."""
    for form in forms:
        n = min(REDACT_RUN, len(form))
        for gram in {form[i:i + n] for i in range(len(form) - n + 1)}:
            at = view.find(gram)
            while at >= 0:
                marks[starts[at]:ends[at + n - 1]] = b"\1" * (ends[at + n - 1] - starts[at])
                at = view.find(gram, at + 1)
        if cut:  # a start of the form at the very end, or just before an escape the cut split
            partial = PARTIAL_ESCAPE.search(view)
            for end in {len(view), partial.start() if partial else len(view)}:
                for j in range(min(len(form), end), MIN_CUT_START - 1, -1):
                    if view.endswith(form[:j], 0, end):
                        marks[starts[end - j]:] = b"\1" * (len(marks) - starts[end - j])
                        break


def redact(text: str, secret: str | None, *, cut: bool = False) -> str:
    """``text`` with a secret (an API key) replaced by ``***`` wherever any `REDACT_RUN` characters in a row of it
    appear, as written in one of its forms (`_secret_forms`) or once the text is decoded (`decoded`): the whole key,
    a key a server shows in part, a key split by a cut, a key escaped character by character. ``cut``: ``text`` is
    the start of a longer body, so a start of the key of `MIN_CUT_START` characters or more at its very end goes too.
    Applied before anything is cut to length, everywhere a response's body or header reaches a message, a log, a row
    or a file."""
    if not secret or not text:
        return text
    marks = bytearray(len(text))
    partial = PARTIAL_ESCAPE.search(text) if cut else None
    for whole in {text, text[:partial.start()] if partial else text}:  # a cut may split an escape that still decodes
        identity = list(range(len(whole)))
        _mark(marks, whole, _secret_forms(secret), cut, identity, [i + 1 for i in identity])
        for view, starts, ends in decoded(whole):
            _mark(marks, view, [secret], cut, starts, ends)
    if not any(marks):
        return text
    out, i = [], 0
    while i < len(text):
        if marks[i]:
            while i < len(text) and marks[i]:
                i += 1
            out.append("***")
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
