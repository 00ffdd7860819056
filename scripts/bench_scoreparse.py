"""Time the score parser on hostile inputs at its 200,000-character cap (a measurement, not a test).

    python scripts/bench_scoreparse.py            # one line per input family: characters, best of 3 (CPU and wall
                                                  # seconds; CPU is the figure on a shared, loaded machine), result
    python scripts/bench_scoreparse.py --chars 20000

Each family is a shape that once cost the parser super-linear time or a RecursionError: long identifier runs inside
a brace (the key: value scan), unclosed fences, thousands of braces, deep nesting. Doubling ``--chars`` should about
double each time (linear), never quadruple it.
"""

from __future__ import annotations

import argparse
import time

from judgetrain.data.scoreparse import parse_overall_score_result, parse_scores

KEY = '"overall_score"'


def families(n: int) -> dict[str, str]:
    """Input name -> text of about ``n`` characters."""
    depth = n // 10
    return {
        "identifier run in a brace": "{" + "a" * n + "} overall_score",
        "key: without value, repeated": "{" + "a:" * (n // 2) + "overall_score}",
        "open braces": "{" * n + " overall_score",
        "open quotes in braces": '{"' * (n // 2) + " overall_score",
        "unclosed json fence": "```json\n" + KEY + ": " + "x" * n,
        "many empty fences": "```\n" * (n // 4) + KEY,
        "spaces after the key": "{" + KEY + ":" + " " * n + "}",
        "deep nesting in a json fence": "```json\n{" + KEY + ": 3, " + '"a":{' * depth + '"b":1' + "}" * depth + "}\n```",
        "deep nesting, bare": "{" + KEY + ": 3, " + '"a":[' * depth + "1" + "]" * depth + "}",
        "real evaluation padded": "reasoning " * (n // 10) + '```json\n{"overall_score": 4}\n```',
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chars", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    for name, text in families(args.chars).items():
        cpu = wall = float("inf")
        for _ in range(args.repeats):
            c0, w0 = time.process_time(), time.perf_counter()
            result = parse_overall_score_result(text)
            parse_scores(text)
            cpu, wall = min(cpu, time.process_time() - c0), min(wall, time.perf_counter() - w0)
        print(f"{name:32s} {len(text):8d} chars  cpu {cpu:7.4f} s  wall {wall:7.4f} s  {result.reason} {result.score}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
