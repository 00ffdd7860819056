"""`judgetrain report LOOP_DIR` on a loop folder laid out as `judgetrain loop` writes it (the files written here
directly; tests/test_loop.py draws a real loop's): the page opens with the loop's status and the round table of the
headline figures (each cell the figure with its interval, the difference against the base with its interval and p),
then the held-out set and the goal the config states, and links each round's training report; every link and image
of the page is a file beside it; none of a training run's notes (no recipe.yaml, no metrics.jsonl...)."""

from __future__ import annotations

import json
import logging
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from judgetrain import cli
from judgetrain.report.build import make_report
from judgetrain.report.loop import loop_status

STAGES = ["items", "split", "pairs", "train", "eval"]
RUN_NOTES = ("no recipe.yaml", "no metrics.jsonl", "no evaluation yet", "in progress or stopped",
             "No evaluation against the base judge")


def _row(k: int, figure: str, value: float, delta: float | None = None) -> dict:
    return {"round": k, "figure": figure, "value": value, "ci_low": value - 0.2, "ci_high": value + 0.2,
            "delta": delta, "delta_ci_low": None if delta is None else delta - 0.15,
            "delta_ci_high": None if delta is None else delta + 0.15, "p_value": None if delta is None else 0.02,
            "n": 12}


def make_loop(root: Path, done_rounds: int = 2, stopped_at: str | None = None) -> Path:
    """A 2-round loop folder: the state (settings, stages, every stage done up to ``stopped_at`` of the last round),
    the stage log, round 1's split, the held-out pairs, each round's training metrics and the round table."""
    out = root / "loop"
    settings = {"output_dir": str(out), "model": "tiny-judge", "recipe": "recipes/quickstart.yaml", "rounds": 2,
                "goal": "verdicts on held-out notes right in both orders, no figure worse than the base",
                "heldout": {"fraction": 0.25, "types": ["spacing"], "seed": 0},
                "eval": {"suites": ["pairwise"], "scoring": ["judge", "verdict"], "max_rows": None,
                         "options": {"eval_regression_margin": 0.05}}}
    done = {f"{k}/{s}": {"wall_s": 1.5, "cpu_s": 2.0} for k in range(1, done_rounds + 1) for s in STAGES}
    if stopped_at:
        done = {key: v for key, v in done.items()
                if int(key[0]) < done_rounds or STAGES.index(key[2:]) < STAGES.index(stopped_at)}
    (out / "round-1" / "split").mkdir(parents=True)
    (out / "loop_state.json").write_text(json.dumps({"config": "ab12", "done": done, "settings": settings,
                                                     "stages": STAGES}))
    events = [{"time": 1.0, "round": int(k[0]), "stage": k[2:], "event": e} for k in done for e in ("start", "done")]
    if stopped_at:
        events.append({"time": 2.0, "round": done_rounds, "stage": stopped_at, "event": "start"})
    (out / "stages.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (out / "round-1" / "split" / "split.json").write_text(json.dumps(
        {"train_items": 18, "heldout_items": 6, "heldout_samples": ["3", "7", "9"], "heldout_types": ["spacing"]}))
    (out / "heldout").mkdir()
    (out / "heldout" / "pairwise.jsonl").write_text("".join(json.dumps({"id": f"{i}|drug_swap"}) + "\n"
                                                            for i in (3, 7, 9)))
    for k in range(1, done_rounds + 1):
        (out / f"round-{k}" / "train").mkdir(parents=True)
        (out / f"round-{k}" / "train" / "recipe.yaml").write_text("model_name_or_path: tiny-judge\neval_suites: none\n")
        (out / f"round-{k}" / "train" / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "epoch": s / 2, "train/loss": 0.7 - 0.1 * s}) + "\n" for s in (1, 2)))
    rows = [_row(0, "pairwise/verdict/accuracy", 0.5), _row(0, "pairwise/verdict/first_position_rate", 0.9),
            _row(0, "pairwise/accuracy", 0.4)]
    for k in range(1, done_rounds + 1):
        rows += [_row(k, "pairwise/verdict/accuracy", 0.5 + 0.1 * k, 0.1 * k),
                 _row(k, "pairwise/verdict/first_position_rate", 0.9 - 0.1 * k, -0.1 * k),
                 _row(k, "pairwise/accuracy", 0.4, 0.0)]
    (out / "rounds.json").write_text(json.dumps({"keys": {}, "rows": rows}))
    (out / "rounds.md").write_text("| figure | base | round 1 | round 2 |\n")
    return out


class Page(HTMLParser):
    """Every href and src of a page, the text of each element with an id, and each table's cells by row."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.cells: list[list[str]] = []
        self._in_cell = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.links += [attrs[a] for a in ("href", "src") if a in attrs]
        if tag == "tr":
            self.cells.append([])
        if tag == "td":
            self.cells[-1].append("")
            self._in_cell = True

    def handle_endtag(self, tag):
        if tag == "td":
            self._in_cell = False

    def handle_data(self, data):
        if self._in_cell:
            self.cells[-1][-1] += data


def test_a_finished_loops_report_opens_with_its_status_and_round_table_and_no_run_notes(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    loop = make_loop(tmp_path)
    assert cli.main(["report", str(loop)]) == 0
    out = loop / "report"
    md = (out / "report.md").read_text()
    lines = md.splitlines()
    assert lines[0] == "# judgetrain report: loop loop"
    assert lines[2] == "**Status: finished: every stage of the 2 rounds done.**"
    assert lines[4] == "## Rounds against the base"
    table = md[md.index("| figure (mode: reading) |"):].split("\n\n")[0].splitlines()
    assert table[0] == "| figure (mode: reading) | base (round 0) | round 1 | round 2 |"  # rows with no mode: as named
    assert table[2] == ("| pairwise/verdict/accuracy | 0.5000 [0.3000, 0.7000] | 0.6000 [0.4000, 0.8000]; difference "
                        "0.1000 [-0.0500, 0.2500], p 0.0200 | 0.7000 [0.5000, 0.9000]; difference 0.2000 "
                        "[0.0500, 0.3500], p 0.0200 |")
    # a row per headline figure: the position rate is pairwise's headline figure too, no figure outside it
    assert [r.split(" | ")[0][2:] for r in table[2:]] == ["pairwise/verdict/accuracy",
                                                        "pairwise/verdict/first_position_rate", "pairwise/accuracy"]
    assert md.index("## Held out") < md.index("## Goal") < md.index("## Rounds\n")
    assert ("Configured: a fraction 0.25 of the samples (seed 0) and every item of the perturbation types: spacing."
            in md)
    assert "Round 1's split: 6 items held out (3 samples), 18 items to train on." in md
    assert "Held-out pairs scored every round (heldout/pairwise.jsonl): 3." in md
    assert "Goal: verdicts on held-out notes right in both orders, no figure worse than the base" in md
    assert "in the modes judge, verdict; a figure is worse than the base only beyond 0.05." in md
    assert "| 1 | items, split, pairs, train, eval | [round-1](round-1/report.html) |" in md
    for note in RUN_NOTES:
        assert note not in caplog.text and note not in md, note
    assert "finished: every stage of the 2 rounds done" in caplog.text  # the terminal says it too
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] is True and len(summary["table"]["rows"]) == 3


def test_every_link_and_image_of_a_loops_page_is_a_file_beside_it(tmp_path):
    loop = make_loop(tmp_path)
    paths = make_report([loop], tmp_path / "out")
    html = paths["report.html"].read_text()
    page = Page()
    page.feed(html)
    assert sorted(page.links) == ["../loop/rounds.json", "../loop/rounds.md", "round-1/report.html",
                                  "round-2/report.html", "rounds.png"]
    for link in page.links:
        assert (tmp_path / "out" / link).is_file(), link
    assert (tmp_path / "out" / "rounds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # each round's training report is a run report of that round's training folder
    assert "## Headline" not in (tmp_path / "out" / "round-1" / "report.md").read_text()
    assert "train_curves.png" in (tmp_path / "out" / "round-2" / "report.md").read_text()
    round_2 = next(row for row in page.cells if row and row[0] == "pairwise/verdict/first_position_rate")[3]
    assert round_2 == "0.7000 [0.5000, 0.9000]difference -0.2000 [-0.3500, -0.0500], p 0.0200"
    assert re.search(r'<p class="finished" id="status">Status: finished: every stage of the 2 rounds done\.</p>', html)


@pytest.mark.parametrize("stopped_at, running", [("train", True), ("eval", False)])
def test_a_stopped_loop_says_in_which_round_and_stage(tmp_path, stopped_at, running):
    loop = make_loop(tmp_path, stopped_at=stopped_at)
    state = json.loads((loop / "loop_state.json").read_text())
    if not running:  # the log's last line is another stage's end: the loop was stopped, not running
        (loop / "stages.jsonl").write_text('{"round": 2, "stage": "pairs", "event": "done"}\n')
    n_done = 5 + STAGES.index(stopped_at)
    expected = (f"stopped in round 2 of 2 at stage {stopped_at}" + (" (or still running it)" if running else "")
                + f": {n_done} of 10 stages done; the same judgetrain loop command continues from there")
    last = json.loads((loop / "stages.jsonl").read_text().splitlines()[-1])
    assert loop_status(state, last) == (expected, False)
    md = make_report([loop], tmp_path / "out")["report.md"].read_text()
    assert f"**Status: {expected}.**" in md
    assert "| 2 | items, split, pairs" in md


def test_a_loop_state_without_settings_still_reports_its_rounds(tmp_path):
    """A loop folder whose state records only the stages done (an earlier judgetrain): the rounds done are read as
    the rounds, and the page says the config is not recorded."""
    loop = make_loop(tmp_path)
    (loop / "loop_state.json").write_text(json.dumps({"config": "ab12", "done": {
        f"{k}/{s}": {} for k in (1, 2) for s in STAGES}}))
    md = make_report([loop], tmp_path / "out")["report.md"].read_text()
    assert "**Status: finished: every stage of the 2 rounds done (the state file does not record the rounds " in md
    assert "does not record the loop's config" in md and "| pairwise/verdict/accuracy |" in md


def _read(k: int, figure: str, value: float, mode: str, reading: str, over_rule: float | None = None) -> dict:
    return {**_row(k, figure, value, None if k == 0 else value - 0.6), "mode": mode, "reading": reading,
            "best_rule": None if over_rule is None else "shorter", "over_rule": over_rule,
            "over_rule_ci_low": None if over_rule is None else over_rule - 0.05,
            "over_rule_ci_high": None if over_rule is None else over_rule + 0.05, "learned": bool(over_rule)}


def test_the_page_draws_the_held_out_pairs_base_against_the_last_round_under_one_reading(tmp_path):
    """The held-out pairs drawn right under the round table (heldout.png): a line per error type, the type held out
    whole first, and one for all pairs; base and round 2 under the one reading they share (loglik_mean: the implicit
    rows read the base's log-likelihood against round 2's log-ratio and are not drawn), the best rule beside."""
    from judgetrain.report.rounds import heldout_figure, shared_mode

    loop = make_loop(tmp_path)
    rows = []
    for k in (0, 1, 2):
        for figure, value in (("pairwise/accuracy", 0.6), ("pairwise/drug_swap/accuracy", 0.55),
                              ("pairwise/spacing/accuracy", 0.7)):
            named = figure.replace("pairwise/", "pairwise/loglik_mean/")  # a mode after the first: in the name
            rows.append(_read(k, named, value + 0.1 * k, "loglik_mean", "loglik_mean", 0.1 * k if k else None))
            rows.append(_read(k, figure, value, "implicit", "log_ratio" if k else "loglik_sum"))
    state = json.loads((loop / "loop_state.json").read_text())
    state["trained_form"] = "log_ratio"
    (loop / "loop_state.json").write_text(json.dumps(state))
    (loop / "rounds.json").write_text(json.dumps({"keys": {}, "rows": rows}))
    assert shared_mode(rows, 2, "implicit") == "loglik_mean" and shared_mode(rows, 2, "loglik_mean") == "loglik_mean"
    fig, mode = heldout_figure(rows, "implicit", ["spacing"])
    ax = fig.axes[0]
    assert mode == "loglik_mean"
    assert [t.get_text() for t in ax.get_yticklabels()][::-1] == ["spacing (held out whole)", "drug_swap",
                                                                  "all held-out pairs"]
    base, trained = (c.lines[0].get_xdata() for c in ax.containers[:2])  # each errorbar's points
    assert list(base) == pytest.approx([0.7, 0.55, 0.6]) and list(trained) == pytest.approx([0.9, 0.75, 0.8])
    assert "loglik_mean" in ax.get_xlabel()
    assert cli.main(["report", str(loop)]) == 0
    md = (loop / "report" / "report.md").read_text()
    assert (loop / "report" / "heldout.png").stat().st_size > 0
    assert md.index("| figure (mode: reading) |") < md.index("](heldout.png)") < md.index("## Held out")
    assert 'src="heldout.png"' in (loop / "report" / "report.html").read_text()
    # a loop whose rounds share no reading with the base on the held-out pairs draws none
    only_implicit = [r for r in rows if r["mode"] == "implicit"]
    assert heldout_figure(only_implicit, "implicit") is None


def test_the_goal_section_names_every_mode_a_round_is_read_in(tmp_path):
    """A loop scoring implicit reads every round, the base included, by loglik_sum and loglik_mean too: the page says
    all three."""
    from judgetrain.report.loop import goal_lines, read_loop

    loop = make_loop(tmp_path)
    state = json.loads((loop / "loop_state.json").read_text())
    state["settings"]["eval"]["scoring"] = ["implicit"]
    (loop / "loop_state.json").write_text(json.dumps(state))
    assert any("in the modes implicit, loglik_sum, loglik_mean;" in line for line in goal_lines(read_loop(loop)))
