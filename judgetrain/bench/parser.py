"""The parser part: the score parser (`judgetrain.data.scoreparse`) on hostile text at its 200,000-character cap.

- **hostile vs clean**: every hostile family below, at the cap, against a clean evaluation of the same length (a long
  judge evaluation of real panel prose ending in its json block); the slowest family over the clean text is the
  figure (target <= 20x). Each family is a shape that costs a backtracking regular expression or a rescanning loop
  super-linear time, or once cost this parser a RecursionError.
- **pairs build**: `build_pairs` on a panel of 10 copies of the bundled one (4,080 evaluations, new sample ids),
  clean and with 4 of its evaluations replaced by the 4 slowest hostile texts at the cap (target <= 2x); the same on
  the bundled panel itself (408 evaluations of 287,000 characters in all, less than two such texts) is reported
  beside it.
- **growth**: the slowest family at half the cap and at the cap; a linear parser about doubles (quadratic: 4x).

Times are CPU seconds (`time.process_time`, the figure that holds on a shared, loaded machine), best of
``repeats`` rounds, sides alternating.
"""

# Late imports: judgetrain, judgetrain.data (inside the functions that use them): each benchmark part loads only what
# it measures, and a timed side's imports are part of what it times.

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from judgetrain.bench.common import BenchError, alternating, ratio
from judgetrain.data import scoreparse

CAP = scoreparse._MAX_TEXT_CHARS  # the parser reads at most this many characters (the tail of a longer text)
KEY = '"overall_score"'
HOSTILE_IN_PANEL = 4  # evaluations of the panel replaced by hostile texts in the pairs-build comparison
PANEL_COPIES = 10  # copies of the bundled panel (408 evaluations) that make the pairs-build panel


def _fill(head: str, unit: str, tail: str, n: int) -> str:
    """``head + unit * k + tail`` with the largest ``k`` that keeps it within ``n`` characters."""
    return head + unit * max(0, (n - len(head) - len(tail)) // len(unit)) + tail


def hostile_families(n: int = CAP) -> dict[str, str]:
    """Family name -> hostile text of at most ``n`` characters (at least ``n`` minus one repeated unit)."""
    depth = (n - 40) // 6  # levels of 6 characters
    return {
        # fences (a fence scan by regex backtracks on blanks, or rescans from each ``` start)
        "fence, then blanks and no newline": _fill("```", " ", "", n),
        "fence, then tabs and no newline": _fill("```", "\t", "", n),
        "fences, each followed by 1,000 blanks": _fill("", "```" + " " * 1000, "", n),
        "fence tags without newline": _fill("", "```x", KEY, n),
        "backtick run": _fill("", "`", KEY, n),
        "many empty fences": _fill("", "```\n", KEY, n),
        "unclosed json fence": _fill("```json\n" + KEY + ": ", "x", "", n),
        "unclosed json fence after newlines": _fill("", "\n", "```json\n{" + KEY + ": 3", n),
        "json fences holding the key, none readable": _fill("", "```json\n{" + KEY + ": x}\n```\n", "", n),
        # braces (the bare-object scan)
        "open braces": _fill("", "{", " overall_score", n),
        "open quotes in braces": _fill("", '{"', " overall_score", n),
        "open single quotes in braces": _fill("", "{'", KEY, n),
        "escapes in a string": _fill('{"', "\\", KEY, n),
        "empty objects": _fill("", "{}", KEY, n),
        "bare objects holding the key, none readable": _fill("", "{" + KEY + ": x}", "", n),
        "bare objects with a colon, no number": _fill("", "{a: x}", KEY, n),
        "deep nesting, bare": "{" + KEY + ": 3, " + '"a":[' * depth + "1" + "]" * depth + "}",
        "deep nesting in a json fence": "```json\n{" + KEY + ": 3, " + '"a":{' * depth + "1" + "}" * depth + "}\n```",
        # key: value pairs inside a block that is not JSON (the pair scan)
        "identifier run in a brace": _fill("{", "a", "} overall_score", n),
        "key: without value, repeated": _fill("{", "a:", "overall_score}", n),
        "keys without colon": _fill("{", "a ", KEY + "}", n),
        "key, then blanks and no colon": _fill("{" + KEY, " ", "x}", n),
        "key:, then blanks": _fill("{" + KEY + ":", " ", "}", n),
        "key:, then tabs and newlines": _fill("{" + KEY + ":", "\t\n", "}", n),
        "colons after the key": _fill("{" + KEY, ":", "}", n),
        "newlines in a brace": _fill("{" + KEY, "\n", "}", n),
        "the key repeated": _fill("{", KEY + ": ", "}", n),
        "unclosed quoted values": _fill("{", KEY + ': "x, ', "}", n),
        "unclosed single-quoted values": _fill("{", "'overall_score': 'x, ", "}", n),
        "long arithmetic": _fill("{" + KEY + ": ", "(1+", "1}", n),
        "long number": _fill("```json\n{" + KEY + ": ", "1", "}\n```", n),
    }


def _panel_rows() -> list[dict]:
    import judgetrain
    from judgetrain.data.pairs import read_evaluations

    return read_evaluations(Path(judgetrain.__file__).parent / "data" / "samples" / "panel" / "evaluations.jsonl.gz")


def _reasoning(evaluation: str) -> str:
    """An evaluation up to its first fence or brace (where its score block starts)."""
    starts = [i for i in (evaluation.find("```"), evaluation.find("{")) if i >= 0]
    return evaluation[: min(starts, default=len(evaluation))].strip()


@lru_cache(maxsize=4)
def clean_evaluation(n: int = CAP) -> str:
    """A clean judge evaluation of ``n`` characters: the reasoning of the bundled panel's evaluations one after
    another (each up to its score block), then the first ```json score block of the panel."""
    texts = [r["evaluation"] for r in _panel_rows() if isinstance(r["evaluation"], str)]
    block = next(t[t.rindex("```json"):] for t in texts if "```json" in t)
    prose = "\n\n".join(_reasoning(t) for t in texts)
    body = (prose + "\n\n") * (n // max(1, len(prose)) + 1)
    return body[: n - len(block) - 2].rstrip() + "\n\n" + block


def _parse(text: str) -> None:
    scoreparse.parse_overall_score_result(text)
    scoreparse.parse_scores(text)


def _cpu(fn, *args) -> float:
    t0 = time.process_time()
    fn(*args)
    return time.process_time() - t0


def time_families(n: int, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` CPU seconds of reading one text (score and every criterion) per family, and "clean"."""
    texts = {"clean": clean_evaluation(n), **hostile_families(n)}
    best = {name: float("inf") for name in texts}
    for _, _, order in alternating(0, repeats, list(texts)):
        for name in order:
            best[name] = min(best[name], _cpu(_parse, texts[name]))
    return best


def panel(copies: int = 1) -> list[dict]:
    """The bundled panel, or ``copies`` of it as one larger panel: each copy's samples get new ids and their prompts
    a line naming the copy (so its pairs are new ones, not duplicates)."""
    rows = _panel_rows()
    if copies == 1:
        return rows
    stride = 1 + max(int(r["sample_id"]) for r in rows)
    out = []
    for c in range(copies):
        for r in rows:
            prompt = r["prompt"]
            if c and isinstance(prompt, list) and prompt and isinstance(prompt[-1].get("content"), str):
                prompt = [*prompt[:-1], dict(prompt[-1], content=f"{prompt[-1]['content']}\n(panel copy {c})")]
            out.append(dict(r, sample_id=int(r["sample_id"]) + c * stride, prompt=prompt))
    return out


def bench_pairs_build(hostile: list[str], repeats: int, copies: int = 1) -> dict:
    """`build_pairs` on ``panel(copies)``, clean and with evaluations spread over it replaced by ``hostile`` texts."""
    from judgetrain.data.pairs import build_pairs

    clean = panel(copies)
    spoiled = [dict(r) for r in clean]
    for row, text in zip(spoiled[:: max(1, len(spoiled) // max(1, len(hostile)))], hostile):
        row["evaluation"] = text
    sides = {"clean": clean, "hostile": spoiled}
    best = {side: float("inf") for side in sides}
    stats: dict[str, dict] = {}
    pairs_logger = logging.getLogger("judgetrain.data.pairs")
    level = pairs_logger.level
    pairs_logger.setLevel(logging.WARNING)  # its lines per build are not the bench's
    try:
        with tempfile.TemporaryDirectory(prefix="judgetrain-bench-pairs-") as tmp:
            for i, _, order in alternating(1, repeats, list(sides)):  # one untimed round: imports, parquet writer
                for side in order:
                    t0 = time.process_time()
                    stats[side] = build_pairs(sides[side], Path(tmp) / f"{side}-{i}")
                    if i > 0:
                        best[side] = min(best[side], time.process_time() - t0)
    finally:
        pairs_logger.setLevel(level)
    return {"panel_copies": copies, "evaluations": len(clean), "hostile_evaluations": len(hostile),
            "hostile_chars": [len(t) for t in hostile], "cpu_s": best,
            "scored_rows": {side: s["scored_rows"] for side, s in stats.items()},
            "rejected_rows": {side: s["rejected_rows"] for side, s in stats.items()},
            "hostile_vs_clean_ratio": ratio(best["hostile"], best["clean"])}


def bench_parser(args: argparse.Namespace) -> dict:
    """The parser part of `judgetrain bench`: per-family times at ``args.parser_chars``, the slowest family over the
    clean evaluation, the same at half the size (growth), and `build_pairs` with the slowest hostile texts on a panel
    of ``args.parser_panel_copies`` copies of the bundled one (the figure) and on the bundled panel itself."""
    n, repeats = args.parser_chars, args.repeats
    if n < 1000 or args.parser_panel_copies < 1:
        raise BenchError("--parser-chars must be at least 1000 and --parser-panel-copies at least 1")
    times = time_families(n, repeats)
    clean = times.pop("clean")
    ranked = sorted(times, key=times.get, reverse=True)
    slowest = ranked[0]
    half = min(_cpu(_parse, hostile_families(n // 2)[slowest]) for _ in range(repeats))
    hostile_texts = [hostile_families(n)[name] for name in ranked[:HOSTILE_IN_PANEL]]
    return {
        "chars": n, "repeats": repeats, "clean_cpu_s": clean, "family_cpu_s": times,
        "slowest_family": slowest, "slowest_cpu_s": times[slowest],
        "hostile_vs_clean_ratio": ratio(times[slowest], clean),
        "slowest_growth_2x": ratio(times[slowest], half),
        "pairs_build": bench_pairs_build(hostile_texts, repeats, args.parser_panel_copies),
        "pairs_build_bundled_panel": (bench_pairs_build(hostile_texts, repeats) if args.parser_panel_copies > 1
                                      else None),
    }
