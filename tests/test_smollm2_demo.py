"""The pure-python parts of the SmolLM2 RM-Bench demonstration (scripts/smollm2_rmbench_demo.py), without a model:
the id split, the per-domain row selection, the style-balanced pair designs and the stratified, paired bootstrap."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("smollm2_rmbench_demo", REPO / "scripts" / "smollm2_rmbench_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_rows(n_per_domain: int = 40) -> list[dict]:
    """RM-Bench-shaped rows; the response text length stands in for the token length."""
    rows = []
    for domain in ("chat", "code", "safety-refuse", "safety-response"):
        for i in range(n_per_domain):
            rows.append({"id": f"{domain}/{i}", "domain": domain, "prompt": f"q{i}",
                         "chosen": [f"c{s}-{i}" + "x" * (i % 13) for s in range(3)],
                         "rejected": [f"r{s}-{i}" for s in range(3)]})
    return rows


def longest(row: dict) -> int:
    return max(len(r) for r in row["chosen"] + row["rejected"])


def test_split_disjoint_per_domain_and_capped(demo):
    train, evals = demo.select_rows(fake_rows(), longest, max_tokens=10, per_domain=5)
    assert not {r["id"] for r in train} & {r["id"] for r in evals}
    for half, rows in ((0, train), (1, evals)):
        assert Counter(r["domain"] for r in rows) == {d: 5 for d in ("chat", "code", "safety-refuse", "safety-response")}
        assert all(demo.id_half(r["id"]) == half and longest(r) <= 10 for r in rows)
    # the split is the id hash alone: the same ids whatever the cap or the count
    train_big, _ = demo.select_rows(fake_rows(), longest, max_tokens=100, per_domain=40)
    assert {r["id"] for r in train} <= {r["id"] for r in train_big}
    assert {r["id"] for r in train_big} == {r["id"] for r in fake_rows() if demo.id_half(r["id"]) == 0}


def test_split_takes_what_fits_when_a_domain_runs_short(demo):
    train, evals = demo.select_rows(fake_rows(6), longest, max_tokens=7, per_domain=10)
    fits = [r for r in fake_rows(6) if longest(r) <= 7]
    assert sorted(r["id"] for r in train + evals) == sorted(r["id"] for r in fits)


@pytest.mark.parametrize("n_rows", [3, 6, 9])
def test_latin_design_balances_style(demo, n_rows):
    cells = demo.style_cells(n_rows, "latin")
    assert all(len(c) == 3 for c in cells)
    for row in cells:  # each style once chosen and once rejected in every row
        assert sorted(i for i, _ in row) == [0, 1, 2] and sorted(j for _, j in row) == [0, 1, 2]
    counts = Counter(c for row in cells for c in row)
    assert counts == {(i, j): n_rows // 3 for i in range(3) for j in range(3)}
    kinds = Counter(demo.cell_kind(i, j) for row in cells for i, j in row)
    assert kinds == {"hard": n_rows, "normal": n_rows, "easy": n_rows}


def test_all_design_and_unknown_design(demo):
    assert demo.style_cells(2, "all") == [[(i, j) for i in range(3) for j in range(3)]] * 2
    with pytest.raises(ValueError, match="pair design must be one of"):
        demo.style_cells(2, "hard")


def test_style_pairs_are_balanced_per_domain_and_carry_the_right_texts(demo):
    rows = [r for r in fake_rows(3)]
    pairs = demo.style_pairs(rows, "latin")
    assert len(pairs) == 3 * len(rows)
    for domain in ("chat", "code", "safety-refuse", "safety-response"):  # 3 rows a domain: all 9 cells once
        cells = Counter(tuple(p["cell"]) for p in pairs if p["domain"] == domain)
        assert cells == {(i, j): 1 for i in range(3) for j in range(3)}
    by_id = {r["id"]: r for r in rows}
    for p in pairs:
        (i, j), row = p["cell"], by_id[p["id"]]
        assert p["prompt"] == [{"role": "user", "content": row["prompt"]}]
        assert p["chosen"] == [{"role": "assistant", "content": row["chosen"][i]}]
        assert p["rejected"] == [{"role": "assistant", "content": row["rejected"][j]}]
    # one row a domain: the shift runs on across domains, so 3 of the 4 rows already cover the 9 cells
    kinds = Counter(demo.cell_kind(*p["cell"]) for p in demo.style_pairs(fake_rows(1), "latin"))
    assert kinds == {"normal": 6, "hard": 3, "easy": 3}


def test_accuracies_of_a_length_judge(demo):
    # a judge that only likes short answers: chosen styles score 3, 2, 1, rejected the same (ties on the diagonal)
    scores = np.tile([3.0, 2.0, 1.0, 3.0, 2.0, 1.0], (4, 1))
    acc = demo.accuracies(scores)
    assert acc["hard_acc"] == 1.0 and acc["normal_acc"] == 0.0 and acc["easy_acc"] == 0.0
    assert acc["easy_minus_hard"] == -1.0 and acc["avg_acc"] == pytest.approx(1 / 3)


def test_bootstrap_stratified_and_paired(demo):
    rng = np.random.default_rng(0)
    domains = ["chat"] * 6 + ["code"] * 4
    before = rng.normal(size=(10, 6))
    after = before.copy()
    after[:6, :3] += 10.0  # chat rows: every chosen response now wins
    figs = demo.bootstrap({"loglik_before": before, "loglik_after": after}, domains, n=200, seed=1)
    assert set(figs) == {"all", "chat", "code"}
    chat = figs["chat"]["loglik_after"]
    assert chat["avg_acc"]["value"] == 1.0 and chat["avg_acc"]["ci95"] == [1.0, 1.0]
    code_diff = figs["code"]["loglik_after-loglik_before"]
    assert code_diff["avg_acc"]["value"] == 0.0 and code_diff["avg_acc"]["ci95"] == [0.0, 0.0]  # paired: same rows
    pooled = figs["all"]["loglik_after-loglik_before"]["avg_acc"]
    assert pooled["ci95"][0] <= pooled["value"] <= pooled["ci95"][1] and pooled["value"] > 0
    # the pooled figure is over all rows: chat rows now all right, code rows as before
    expected = demo.accuracies(after)["avg_acc"] - demo.accuracies(before)["avg_acc"]
    assert pooled["value"] == pytest.approx(expected)
    # differences whose operands are missing are left out, not computed from nothing
    assert "judge_after-judge_before" not in figs["all"]


def test_stratified_sample_keeps_domain_counts(demo):
    groups = {"a": np.arange(0, 5), "b": np.arange(5, 8)}
    draw = demo.stratified_sample(groups, np.random.default_rng(0))
    assert {g: len(v) for g, v in draw.items()} == {"a": 5, "b": 3}
    assert set(draw["a"]) <= set(range(5)) and set(draw["b"]) <= set(range(5, 8))


def test_tables_print_pooled_and_per_domain(demo):
    domains = ["chat"] * 3 + ["code"] * 3
    scores = {"loglik_before": np.random.default_rng(0).normal(size=(6, 6))}
    result = {"eval_domains": domains, "figures": demo.bootstrap(scores, domains, n=20, seed=0)}
    text = demo.tables(result)
    assert "### All eval rows (6)" in text and "### chat (3 rows)" in text and "### code (3 rows)" in text
    assert text.count("| log-likelihood, before |") == 3


def test_phases_keep_finished_results_and_refuse_other_settings(demo, tmp_path):
    calls = []

    def work():
        calls.append(1)
        return np.arange(3.0)

    first = demo.Phases(tmp_path, {"rows_per_domain": 4})
    assert first.run("loglik_before", work, save=np.ndarray.tolist, load=np.array).tolist() == [0.0, 1.0, 2.0]
    again = demo.Phases(tmp_path, {"rows_per_domain": 4})  # a stopped run started again: nothing is recomputed
    assert again.run("loglik_before", work, save=np.ndarray.tolist, load=np.array).tolist() == [0.0, 1.0, 2.0]
    assert len(calls) == 1 and again.records["loglik_before"]["seconds"] >= 0
    assert set(again.records["loglik_before"]) == {"seconds", "cpu_seconds", "load_average"}
    with pytest.raises(SystemExit, match="other settings"):
        demo.Phases(tmp_path, {"rows_per_domain": 6})
