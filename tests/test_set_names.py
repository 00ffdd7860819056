"""Perturbation set names (``element_substitution_100pct``) are read as the former regular expression read them."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from judgetrain.data.pairs import TYPE_ALIASES, parse_set_name

FORMER = re.compile(r"^(?P<type>.+?)_(?P<pct>\d+(?:\.\d+)?)pct$")  # lazy type and digits competing for characters


def former(name: str) -> tuple[str, float | None]:
    match = FORMER.match(name)
    ptype, rate = (match["type"], float(match["pct"]) / 100) if match else (name, None)
    return TYPE_ALIASES.get(ptype, ptype), rate


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(["a", "_", "5", "\u0665", ".", "pct", "p", "\n", " ", "element_substitution", "100",
                                 "1.5", "all_equivalence_rewriting"]), max_size=12).map("".join))
def test_set_names_read_as_the_former_pattern_read_them(name):
    assert parse_set_name(name) == former(name)

