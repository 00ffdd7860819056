"""`judgetrain probe`: the figures on toy sets whose answer is known by construction (which text wins in each mode,
a hidden direction shared by some error types and reversed in another, an unseen type on noise read at chance by a
probe that never saw its samples), the items paired and refused before any model loads, and one real run of the
command on the tiny judge, its log-likelihoods and hidden states checked against plain forward passes of the same
model."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from judgetrain.probe import linear
from judgetrain.probe.figures import kind_figures, table
from judgetrain.probe.hidden import default_layers, response_means
from judgetrain.probe.pairs import Pair, ProbeSet, Text, read_probe_set
from judgetrain.probe.readings import Readings, better_share, pair_values, verdict_pairs

TEMPLATE = [{"role": "system", "content": "Judge the note. End with ```json {\"overall_score\": ...}```."},
            {"role": "user", "content": "Patient: {{patient}}\n\nNote:\n{{text}}"}]
SOURCE = [{"sample_id": i, "patient": f"P{i}", "text": f"Give aspirin {100 * i} mg at {i} h, then rest."}
          for i in range(1, 7)]


def cli(*argv) -> int:
    from judgetrain.cli import main

    return main([str(a) for a in argv])


def factory(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A spec of two error operators and one rewrite, its six samples, and the items perturb made of them."""
    spec = {"name": "clinic", "template": TEMPLATE,
            "units": {"mass": {"mg": 0.001, "g": 1}, "time": {"h": 3600, "min": 60}},
            "operators": {"drug_swap": {"kind": "table", "category": "error", "pairs": {"aspirin": "warfarin"}},
                          "dose_error": {"kind": "numeric", "category": "error", "mode": "scale", "factor": [5, 10],
                                         "require_unit": True},
                          "to_grams": {"kind": "numeric", "category": "represent", "mode": "convert"}},
            "sets": [{"name": "drug_swap"}, {"name": "dose_error"}, {"name": "to_grams"}]}
    (tmp_path / "clinic.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    (tmp_path / "notes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SOURCE), encoding="utf-8")
    assert cli("perturb", "--source", tmp_path / "notes.jsonl", "--spec", tmp_path / "clinic.yaml",
               "--output_dir", tmp_path / "items") == 0
    return tmp_path / "clinic.yaml", tmp_path / "notes.jsonl", tmp_path / "items" / "items.jsonl"


def toy_set(n_samples: int = 6) -> ProbeSet:
    """Per sample: a source (0), error copies of types a and b, and a rewrite r; every pair kind."""
    texts, pairs = [], []
    for s in range(n_samples):
        base = len(texts)
        texts += [Text(s, f"source {s}", "source"), Text(s, f"a {s}", "error", "a", "a_100pct", frozenset({"a"})),
                  Text(s, f"b {s}", "error", "b", "b_100pct", frozenset({"b"})),
                  Text(s, f"r {s}", "represent", "r", "r_100pct", frozenset({"r"}))]
        pairs += [Pair("error", s, "a", base, base + 1, frozenset({"a"})),
                  Pair("error", s, "b", base, base + 2, frozenset({"b"})),
                  Pair("represent", s, "r", base, base + 3, frozenset({"r"})),
                  Pair("cross", s, "a", base + 3, base + 1, frozenset({"a"}), "r"),
                  Pair("cross", s, "b", base + 3, base + 2, frozenset({"b"}), "r")]
    return ProbeSet(texts, {s: f"question {s}" for s in range(n_samples)}, [[] for _ in texts], pairs,
                    samples=n_samples)


# --------------------------------------------------------------------------------------------- zero-shot figures
def test_each_mode_reads_which_text_wins_and_a_tie_is_wrong():
    probe = toy_set()
    # log-likelihood sums: the source is the likeliest, then the rewrite, then b, then a; but a is long (20 tokens
    # against 10), so per token a beats every other text
    loglik = np.tile([-10.0, -12.0, -11.0, -10.5], 6)
    tokens = np.tile([10.0, 20.0, 10.0, 10.0], 6)
    judge = np.tile([4.0, 4.0, 3.0, 4.5], 6)  # a ties its source (wrong); the rewrite scores above its source
    judge[0] = np.nan  # sample 0's source unscored: its error and represent pairs leave every judge figure
    verdicts = {i: (1.0, 0.0) if p.kind == "error" else (1.0, 1.0) for i, p in enumerate(probe.pairs)}
    values = pair_values(probe, Readings(loglik, tokens, judge, verdicts), ["implicit", "judge", "verdict"])
    of = {k: np.asarray([p.kind == k for p in probe.pairs]) for k in ("error", "represent", "cross")}
    a = np.asarray([p.perturbation_type == "a" for p in probe.pairs])
    assert np.all(values["loglik_sum"][of["error"]] == 1.0)
    assert np.all(values["loglik_mean"][of["error"] & a] == 0.0)  # -0.6 per token beats the source's -1
    assert np.all(values["loglik_mean"][of["error"] & ~a] == 1.0)
    assert np.all(values["loglik_mean"][of["cross"] & a] == 0.0)  # and the rewrite's -1.05
    assert np.all(values["loglik_sum"][of["cross"] & a] == 1.0) and np.all(values["loglik_sum"][of["cross"] & ~a] == 1.0)
    judge_error_a = values["judge"][of["error"] & a]
    assert np.isnan(judge_error_a[0]) and np.all(judge_error_a[1:] == 0.0)  # a tie is wrong
    assert np.all(values["judge"][of["represent"]][1:] == 0.0)  # the rewrite scored above: the source did not win
    assert np.all(values["verdict"][of["error"]] == 0.5) and np.all(values["verdict_both"][of["error"]] == 0.0)
    assert np.all(values["verdict"][of["cross"]] == 1.0) and np.all(values["verdict_both"][of["cross"]] == 1.0)
    shares = better_share(np.asarray([1.0, np.nan, 0.0, 0.0] * 6), probe)
    assert np.isnan(shares[0]) and shares[1] == 1.0  # an unscored copy leaves its pair out; the other still counts


def test_figures_pool_types_and_draw_a_samples_pairs_together():
    probe = toy_set(8)
    # error pairs: type a always ranked right, type b right on the first 4 samples only
    values = np.asarray([1.0 if p.perturbation_type == "a" or p.sample_id < 4 else 0.0 for p in probe.pairs])
    figures = kind_figures(probe, "error", {"loglik_sum": values}, n_resamples=400, seed=0)["loglik_sum"]
    assert figures["a"] == {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0, "n": 8, "n_units": 8, "n_samples": 8}
    assert figures["b"]["value"] == 0.5 and figures["b"]["n"] == 8
    assert figures["all"]["value"] == 0.75 and figures["all"]["n"] == 16 and figures["all"]["n_samples"] == 8
    # clustered by sample: a sample's two pairs (1+1 or 1+0) move together, so the pooled interval is the per-sample
    # mean's, within [0.5, 1]
    assert 0.5 <= figures["all"]["ci_low"] < 0.75 < figures["all"]["ci_high"] <= 1.0
    text = table({"error": {"loglik_sum": figures}})
    assert "error: share of pairs, source ranked above its error copy" in text
    assert "1.00 [1.00,1.00]" in text.splitlines()[2] and text.splitlines()[-1].split()[:2] == ["all", "16"]


def test_a_figure_of_one_source_sample_prints_no_interval_and_says_why():
    """One source sample, its two error pairs ranked right once and wrong once: "all" is 0.50 over 2 pairs of 1
    sample. Every resample draws that sample, so the old table printed "all 2 0.50 [0.50,0.50]", a zero-width interval
    it does not have; it prints the value alone, and the line saying why."""
    probe = toy_set(1)
    values = np.asarray([1.0 if p.perturbation_type == "a" else 0.0 for p in probe.pairs])
    figures = kind_figures(probe, "error", {"loglik_sum": values}, n_resamples=200, seed=0)["loglik_sum"]
    assert figures["all"]["value"] == 0.5 and figures["all"]["n"] == 2 and figures["all"]["n_units"] == 1
    assert np.isnan(figures["all"]["ci_low"]) and np.isnan(figures["all"]["ci_high"])
    text = table({"error": {"loglik_sum": figures}})
    row = next(line for line in text.splitlines() if line.startswith("all"))
    assert row.split() == ["all", "2", "0.50"] and "[" not in row
    assert "holds one source sample: every resample draws that one sample" in text


def test_verdict_mode_reads_every_direct_pair_and_a_drawn_rewrite_per_error_copy():
    probe = toy_set(3)
    # a second rewrite per sample: each error copy now has two rewrites to be read against
    for s in range(3):
        probe.texts.append(Text(s, f"r2 {s}", "represent", "r2", "r2_100pct", frozenset({"r2"})))
        for worse in (4 * s + 1, 4 * s + 2):
            probe.pairs.append(Pair("cross", s, probe.texts[worse].perturbation_type, len(probe.texts) - 1, worse,
                                    frozenset(), "r2"))
    chosen = verdict_pairs(probe, 1, seed=0)
    kinds = Counter(probe.pairs[i].kind for i in chosen)
    assert kinds == {"error": 6, "represent": 3, "cross": 6}  # one of the two rewrites per error copy
    assert len({probe.pairs[i].worse for i in chosen if probe.pairs[i].kind == "cross"}) == 6
    assert Counter(probe.pairs[i].kind for i in verdict_pairs(probe, 5, seed=0))["cross"] == 12
    assert "cross" not in Counter(probe.pairs[i].kind for i in verdict_pairs(probe, 0, seed=0))


# --------------------------------------------------------------------------------------------- the linear probe
def test_the_probe_finds_a_shared_direction_on_an_unseen_type_and_misses_a_reversed_one():
    # every type's pairs: a direction of their own, plus the shared one (a, b, c) or its reverse (flip)
    # (each axis's length varies from pair to pair)
    rng = np.random.default_rng(0)
    axes = np.eye(5)
    shared, own = axes[0], {t: axes[k] for k, t in enumerate(("a", "b", "c", "flip"), start=1)}
    pairs, feats = [], []
    for s in range(40):
        for ptype, sign in (("a", 1), ("b", 1), ("c", 1), ("flip", -1)):
            pairs.append(Pair("error", s, ptype, 0, 1, frozenset({ptype})))
            feats.append(sign * shared * rng.uniform(0.5, 1.5) + own[ptype] * rng.uniform(0.5, 1.5))
    feats = np.asarray(feats)
    by_type = linear.held_out_type(pairs, feats, l2=1.0)
    types = np.asarray([p.perturbation_type for p in pairs])
    for ptype in ("a", "b", "c"):  # fitted on the other two and the reversed type: the shared direction carries over
        assert by_type[types == ptype].mean() == 1.0
    assert by_type[types == "flip"].mean() == 0.0  # the three others point the other way: it ranks all wrong
    held = linear.held_out_samples([p.sample_id for p in pairs], 0.25, seed=0)
    assert len(held) == 10
    by_sample = linear.held_out_sample_values(pairs, feats, held, l2=1.0)
    tested = np.asarray([p.sample_id in held for p in pairs])
    assert np.all(np.isnan(by_sample[~tested])) and np.all(np.isfinite(by_sample[tested]))
    # on held-out samples every type was seen in the fit, the reversed one too (its own axis): all ranked right
    assert by_sample[tested].mean() == 1.0


def test_an_unseen_type_is_scored_by_a_probe_that_never_saw_its_samples():
    # 60 samples of 4 types in 2000 dimensions, every text a random point: the error copies are noise, so no probe
    # can tell an unseen type's copy from its source beyond chance. Every pair of a sample shares its better text
    # (the source); a probe fitted on the same samples' other types recognises the source and reads ~1.0
    rng = np.random.default_rng(2)
    n_samples, dims, types = 60, 2000, ("a", "b", "c", "d")
    pairs, feats = [], []
    for s in range(n_samples):
        source = rng.normal(size=dims)
        for ptype in types:
            pairs.append(Pair("error", s, ptype, 0, 1, frozenset({ptype})))
            feats.append(source - rng.normal(size=dims))
    feats = np.asarray(feats)
    values = linear.held_out_type(pairs, feats, l2=1.0)  # 4 folds of 15 samples
    assert np.all(np.isfinite(values))  # every pair scored, each by a probe fitted on the other folds
    assert 0.3 < values.mean() < 0.7  # chance (the same samples in the fit: 1.0)
    folds = linear.sample_folds([p.sample_id for p in pairs], 4, seed=0)
    assert sorted(Counter(folds.values()).values()) == [15, 15, 15, 15]
    assert linear.sample_folds([1, 2], 4, seed=0) in ({1: 0, 2: 1}, {1: 1, 2: 0})  # no more folds than samples


def test_a_held_out_type_is_never_fitted_on_a_copy_holding_its_edits():
    rng = np.random.default_rng(1)
    pairs = [Pair("error", s, t, 0, 1, frozenset(ops)) for s in range(10)
             for t, ops in (("a", {"a"}), ("b", {"b"}), ("mixed", {"a", "b"}))]
    feats = rng.normal(size=(len(pairs), 8)) + 3.0
    values = linear.held_out_type(pairs, feats, l2=1.0)
    types = np.asarray([p.perturbation_type for p in pairs])
    assert np.all(np.isnan(values[types == "mixed"]))  # its edits are of a and b: nothing is left to fit on
    assert np.all(values[types == "a"] == 1.0)  # fitted on b alone (the mixed copies hold a's edits)
    w1, s1 = linear.fit_probe(feats, 1.0)
    w2, s2 = linear.fit_probe(feats.copy(), 1.0)
    assert np.array_equal(w1, w2) and np.array_equal(s1, s2)  # the same pairs, the same probe


# --------------------------------------------------------------------------------------------- items and refusals
def test_items_are_paired_per_source_and_what_makes_no_pair_is_counted(tmp_path):
    spec, source, items_path = factory(tmp_path)
    from judgetrain.perturb.source import read_samples
    from judgetrain.perturb.spec import load_spec

    samples, _ = read_samples(str(source), load_spec(str(spec)))
    items = [json.loads(line) for line in items_path.read_text().splitlines()]
    items.append({**items[0], "sample_id": 99})  # a sample the source lacks
    items.append({**items[0], "perturbation_set": "drug_swap_noop_100pct",
                  "prompt": [{"role": "system", "content": TEMPLATE[0]["content"]},
                             {"role": "user", "content": f"Patient: P1\n\nNote:\n{SOURCE[0]['text']}"}]})
    (tmp_path / "more.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    probe = read_probe_set(str(tmp_path / "more.jsonl"), samples)
    assert probe.skipped == {"no_source": 1, "unchanged": 1}
    assert probe.samples == 6 and Counter(t.category for t in probe.texts) == {"source": 6, "error": 12,
                                                                             "represent": 6}
    assert Counter(p.kind for p in probe.pairs) == {"error": 12, "represent": 6, "cross": 12}
    for p in probe.pairs:
        better, worse = probe.texts[p.better], probe.texts[p.worse]
        assert better.sample_id == worse.sample_id == p.sample_id
        assert (better.category, worse.category) == {"error": ("source", "error"), "represent": ("source", "represent"),
                                                    "cross": ("represent", "error")}[p.kind]
    swap = next(t for t in probe.texts if t.perturbation_type == "drug_swap")
    assert "warfarin" in swap.text and swap.operators == {"drug_swap"}
    assert probe.questions[1] == "Patient: P1\n\nNote:"
    assert read_probe_set(str(items_path), samples, types=["dose_error"], max_samples=3).samples == 3


@pytest.mark.parametrize("case, says", [
    ("missing", "nope.jsonl"),
    ("no_errors", "no error copy to compare with its source"),
    ("unknown_type", "--types: drug_slip not among the perturbation types"),
    ("bad_share", "--holdout_fraction 1.0: give a share between 0 and 1"),
])
def test_bad_input_is_one_line_exit_2_before_any_model_loads(case, says, tmp_path, capsys, monkeypatch):
    spec, source, items_path = factory(tmp_path)
    argv = ["probe", "--items", items_path, "--source", source, "--spec", spec, "--model", "no-such/model",
            "--output_dir", tmp_path / "out"]
    if case == "missing":
        argv[2] = tmp_path / "nope.jsonl"
    elif case == "no_errors":
        rewrites = [line for line in items_path.read_text().splitlines() if '"represent"' in line]
        (tmp_path / "rewrites.jsonl").write_text("\n".join(rewrites) + "\n")
        argv[2] = tmp_path / "rewrites.jsonl"
    elif case == "unknown_type":
        argv += ["--types", "drug_slip", "dose_error"]
    else:
        argv += ["--holdout_fraction", "1"]
    loaded = []
    monkeypatch.setattr("judgetrain.probe.run.load_local", lambda *a, **k: loaded.append(a))
    capsys.readouterr()
    assert cli(*argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()  # the entry's one line: "judgetrain probe: ..."
    assert len(lines) == 1 and lines[0].startswith("judgetrain probe: ") and says in lines[0], lines
    assert loaded == [] and not (tmp_path / "out").exists()


# --------------------------------------------------------------------------------------------- a real run
def test_the_command_on_the_tiny_judge_matches_plain_forward_passes(tmp_path, tiny_judge, caplog):
    spec, source, items_path = factory(tmp_path)
    caplog.set_level(logging.INFO)
    out = tmp_path / "probe"
    assert cli("probe", "--items", items_path, "--source", source, "--spec", spec, "--model", tiny_judge,
               "--output_dir", out, "--n_resamples", "200", "--batch_tokens", "256") == 0
    result = json.loads((out / "probe.json").read_text())
    assert result["samples"] == 6 and result["pairs"] == {"error": 12, "represent": 6, "cross": 12}
    assert result["verdict_pairs"] == 12 + 6 + 12  # one rewrite per error copy: each has just one
    assert result["layers"] == default_layers(2) == [1, 2] and len(result["held_out_samples"]) == 2
    figures = result["figures"]
    assert set(figures) == {"error", "represent", "cross"}
    assert set(figures["error"]) == {"loglik_mean", "loglik_sum", "judge", "verdict", "verdict_both",
                                     "probe_held_out_type", "probe_held_out_samples"}
    assert set(figures["cross"]) == set(figures["error"]) | {"probe_error_transfer"}
    assert set(figures["error"]["judge"]) == {"drug_swap", "dose_error", "all"}
    assert figures["error"]["judge"]["all"]["n"] == 12 and figures["error"]["judge"]["all"]["n_samples"] == 6
    assert any("error: share of pairs" in r.getMessage() for r in caplog.records)

    # the implicit figures, recomputed with plain forward passes of the same model, one text at a time
    from judgetrain.perturb.source import read_samples
    from judgetrain.perturb.spec import load_spec
    from transformers import AutoModelForCausalLM, AutoTokenizer

    samples, _ = read_samples(str(source), load_spec(str(spec)))
    probe = read_probe_set(str(items_path), samples)
    model = AutoModelForCausalLM.from_pretrained(tiny_judge, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(tiny_judge)
    sums, means = [], []
    for t in probe.texts:
        prompt = tok.apply_chat_template([{"role": "user", "content": probe.questions[t.sample_id]}],
                                         add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        full = tok.apply_chat_template([{"role": "user", "content": probe.questions[t.sample_id]},
                                        {"role": "assistant", "content": t.text}], tokenize=True,
                                       return_dict=True)["input_ids"]
        assert full[:len(prompt)] == prompt
        with torch.no_grad():
            o = model(torch.tensor([full]), output_hidden_states=True)
        logp = torch.log_softmax(o.logits[0, :-1].double(), -1).gather(-1, torch.tensor(full[1:])[:, None])[:, 0]
        sums.append((float(logp[len(prompt) - 1:].sum()), len(full) - len(prompt)))
        means.append(torch.cat([o.hidden_states[k][0, len(prompt):].mean(0) for k in (1, 2)]).numpy())
    s = np.asarray([x for x, _ in sums])
    per_token = s / np.asarray([n for _, n in sums])
    for method, scores in (("loglik_sum", s), ("loglik_mean", per_token)):
        want = better_share(scores, probe)[[p.kind == "error" for p in probe.pairs]].mean()
        assert figures["error"][method]["all"]["value"] == pytest.approx(want), method
    batched = response_means(model, [(f, len(p)) for f, p in _sequences(tok, probe)], [1, 2], pad_id=0,
                             batch_tokens=256)
    assert np.allclose(batched.reshape(len(probe.texts), -1), np.asarray(means), atol=1e-4)


def _sequences(tok, probe):
    for t in probe.texts:
        q = [{"role": "user", "content": probe.questions[t.sample_id]}]
        yield (tok.apply_chat_template(q + [{"role": "assistant", "content": t.text}], tokenize=True,
                                       return_dict=True)["input_ids"],
               tok.apply_chat_template(q, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
