"""`judgetrain report`: run directories as the trainer writes them (metrics.jsonl, eval/<step>/<suite>.jsonl,
recipe.yaml, checkpoints), drawn to PNGs, report.html (self-contained) and report.md."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from judgetrain import cli
from judgetrain.eval.suites import suite_metrics
from judgetrain.eval.metrics import flatten_eval_metrics, rmbench_matrices
from judgetrain.eval.plots import log_matrix_images, matrix_figure
from judgetrain.report.build import build_report, load_run, make_report, read_metrics

DOMAINS = ("chat", "code", "safety-refuse", "safety-response")
TYPES = {"element_substitution": "error", "numerical_perturbation": "error",
         "llm_to_formula": "represent", "llm_to_name": "represent"}
STEPS_PER_EPOCH = 6


# ------------------------------------------------------------------------------------------- synthetic runs
def _eval_rows(rng: np.random.Generator, epoch: float) -> dict[str, list[dict]]:
    """Scores of a judge whose preference for styled answers shrinks as it trains."""
    style = np.array([0.0, 0.6, 1.2]) / epoch
    rmbench = []
    for domain in DOMAINS:
        for i in range(12):
            base = rng.normal(size=3)
            chosen = base + 0.4 * epoch + style + rng.normal(0, 0.7, 3)
            rejected = base + style + rng.normal(0, 0.7, 3)
            rmbench.append({"id": f"{domain}/{i}", "domain": domain,
                            "score_chosen": chosen.round(4).tolist(), "score_rejected": rejected.round(4).tolist()})
    judgebias = []
    for j, (ptype, cat) in enumerate(TYPES.items()):
        for i in range(8):
            delta = rng.normal(0.3 * epoch - (0.2 if cat == "represent" else 0.0), 1.0)
            judgebias.append({"sample_id": 100 * j + i, "perturbation_category": cat, "perturbation_type": ptype,
                              "score_chosen": round(float(delta), 4), "score_rejected": 0.0, "anchor_score": 3.5})
    ideation = [{"sample_id": i, "pair_id": f"p{i}", "score_chosen": round(float(rng.normal(0.2 * epoch)), 4),
                 "score_rejected": 0.0} for i in range(10)]
    # a prompt the engine could not score (longer than max_length with long_inputs=skip)
    rmbench.append({"id": "code/999", "domain": "code", "score_chosen": None, "score_rejected": None, "skipped": True})
    suites = {"rmbench": rmbench, "judgebias": judgebias, "ideation": ideation}
    for rows in suites.values():
        for i, row in enumerate(rows):
            row["row_index"] = i
    return suites


def _train_event(rng: np.random.Generator, step: int) -> dict:
    epoch = step / STEPS_PER_EPOCH
    margin = 0.05 * step + float(rng.normal(0, 0.02))
    loss = round(0.6931 - 0.02 * step + float(rng.normal(0, 0.01)), 6)
    return {"step": step, "epoch": round(epoch, 4), "train/loss": loss,
            "train/rewards/chosen": margin / 2, "train/rewards/rejected": -margin / 2, "train/rewards/margins": margin,
            "train/rewards/accuracies": min(1.0, 0.5 + 0.04 * step), "train/learning_rate": 5e-5 * (1 - step / 20),
            "train/grad_norm": 1.0 + float(rng.random())}


def _eval_event(run: Path, rng: np.random.Generator, step: int) -> dict:
    epoch = step / STEPS_PER_EPOCH
    rows = _eval_rows(rng, epoch)
    out = run / "eval" / str(step)
    out.mkdir(parents=True, exist_ok=True)
    for suite, suite_rows in rows.items():
        (out / f"{suite}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in suite_rows))
    event = {"step": step, "epoch": epoch}
    for suite, suite_rows in rows.items():  # what JudgeEvalCallback logs
        event.update(flatten_eval_metrics(suite, suite_metrics(suite, suite_rows, "implicit")))
    event["eval/rmbench_runtime"] = 1.25
    return event


def _events(run: Path, rng: np.random.Generator, steps: range, eval_at: set[int]) -> list[dict]:
    events = []
    for step in steps:
        if step % 2 == 0:
            events.append(_train_event(rng, step))
        if step in eval_at:
            events.append(_eval_event(run, rng, step))
    return events


def _write(run: Path, events: list[dict], tail: str = "") -> None:
    with (run / "metrics.jsonl").open("a") as f:
        f.write("".join(json.dumps(e) + "\n" for e in events) + tail)


def make_run(root: Path, name: str, seed: int = 0, finished: bool = True) -> tuple[Path, list[dict]]:
    """A finished 2-epoch run: train logs every 2 steps, eval at each epoch end (steps 6 and 12)."""
    run = root / name
    run.mkdir(parents=True)
    (run / "recipe.yaml").write_text(yaml.safe_dump({
        "model": {"model_name_or_path": "tiny-judge"},
        "training": {"learning_rate": 5e-5, "beta": 0.1, "num_train_epochs": 2, "seed": seed},
        "lora": {"r": 8}}))
    events = _events(run, np.random.default_rng(seed), range(1, 2 * STEPS_PER_EPOCH + 1), {6, 12})
    _write(run, events)
    for step in (6, 12):
        (run / f"checkpoint-{step}").mkdir()
    if finished:
        (run / "adapter_model.safetensors").write_bytes(b"")
    return run, events


def last_values(events: list[dict]) -> dict[str, tuple[int, float]]:
    """key -> (step, value) of its last logged finite value, steps merged in order (a later line wins)."""
    merged: dict[int, dict] = {}
    for e in events:
        merged.setdefault(e["step"], {}).update(e)
    out = {}
    for step in sorted(merged):
        for k, v in merged[step].items():
            if k.startswith("eval/") and isinstance(v, float):
                out[k] = (step, v)
    return out


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """A finished run drawn once through the CLI: (run dir, its events, {file name: path}, out dir, stdout)."""
    root = tmp_path_factory.mktemp("single")
    run, events = make_run(root, "quick")
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setenv("COLUMNS", "200")  # rich sizes its table to the terminal; captured output has none
        assert cli.main(["report", str(run), "--out", str(root / "out")]) == 0
    paths = {p.name: p for p in (root / "out").iterdir()}
    return run, events, paths, root / "out", printed.getvalue()


def _size(path: Path) -> tuple[int, int]:
    with Image.open(path) as im:
        im.load()  # decodes every pixel: a broken PNG raises here
        return im.size


def _html_cells(html_text: str, table_id: str, cls: str) -> dict[str, float]:
    table = re.search(rf'<table class="metrics" id="{table_id}">(.*?)</table>', html_text, re.S).group(1)
    return {m: float(v) for m, v in re.findall(
        rf'<tr data-metric="([^"]+)">.*?<td class="{cls}" data-value="([^"]+)">', table)}


# ------------------------------------------------------------------------------------------------------ tests
def test_report_draws_each_figure_at_its_pixel_size(single):
    _, _, paths, out, _ = single
    expected = {  # (width, height): 400 x 300 px per curve panel, 400 x 400 per heatmap, 4 panels a row
        "train_curves.png": (1200, 300),  # loss, margins, accuracies
        "rmbench_curves.png": (1600, 300),  # overall, chat, code, safety
        "style_bias.png": (1600, 300),
        "judgebias_categories.png": (1600, 300),  # error/accuracy, error/margin, represent/accuracy, represent/margin
        "judgebias_types.png": (1600, 300),  # 4 perturbation types
        "ideation.png": (400, 300),
        "rmbench_matrix_step6.png": (1600, 400),  # overall + chat, code, safety (refuse/response pooled)
        "rmbench_matrix_step12.png": (1600, 400),
    }
    pngs = {p.name for p in out.glob("*.png")}
    assert pngs == set(expected)
    for name, size in expected.items():
        assert paths[name] == out / name
        assert _size(out / name) == size, name
    assert {"report.html", "report.md", "summary.json"} <= set(paths)


def test_html_is_self_contained_and_embeds_every_png(single):
    _, _, _, out, _ = single
    text = (out / "report.html").read_text()
    embedded = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    pngs = sorted(out.glob("*.png"))
    assert len(embedded) == len(pngs) == 8
    assert sorted(base64.b64decode(e) for e in embedded) == sorted(p.read_bytes() for p in pngs)
    assert not re.search(r'(src|href)="(https?:)?//', text)
    assert "<script" not in text and "<link" not in text


def test_every_string_on_the_page_is_escaped_and_reads_back_as_it_was(tmp_path):
    """Run names, notes and recipe text holding markup reach the page as text (autoescaped template), and the
    browser's reading of each (html.parser) gives back the string itself."""
    from html.parser import HTMLParser

    name = "a<u>&\"c'"
    run, events = make_run(tmp_path, name)
    recipe = (run / "recipe.yaml").read_text() + "note: \"</pre><script>alert('x')</script> & <em>\"\n"
    (run / "recipe.yaml").write_text(recipe)
    (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text() + '{"step": 13, "<i>')  # a torn line
    text = make_report([run], tmp_path / "out")["report.html"].read_text()
    assert "<script" not in text and "<u>" not in text and "<em>" not in text and "<i>" not in text

    class Reader(HTMLParser):
        def __init__(self):
            super().__init__()
            self.stack, self.found = [], {}

        def handle_starttag(self, tag, attrs):
            self.stack.append((tag, dict(attrs)))
            self.found.setdefault(tag, []).append([dict(attrs), ""])

        def handle_endtag(self, tag):
            self.stack.pop()

        def handle_data(self, data):
            for tag, _ in self.stack:
                self.found[tag][-1][1] += data

    page = Reader()
    page.feed(text)
    assert page.found["pre"][0][1] == recipe
    assert page.found["title"][0][1] == f"judgetrain report: {name}"
    assert f"Summary: {name}" in [t for _, t in page.found["h2"]]
    assert [t for _, t in page.found["b"]] == [name]  # the notes' heading
    notes = [t for _, t in page.found["li"]]
    assert any("cut off" in n for n in notes)
    last = last_values(events)
    rows = [a["data-metric"] for a, _ in page.found["tr"] if "data-metric" in a]
    # a cell's figure, before its interval (the headline's cells: "0.5880 [-, -]")
    shown = dict(zip(rows, (float(t.split()[0]) for a, t in page.found["td"] if a.get("class") == "last")))
    assert shown["eval/rmbench/hard_acc"] == pytest.approx(last["eval/rmbench/hard_acc"][1], abs=5e-5)


def test_summary_table_shows_the_last_eval_and_best_epoch_of_metrics_jsonl(single):
    _, events, _, out, _ = single
    text = (out / "report.html").read_text()
    last = last_values(events)
    shown = _html_cells(text, "summary-quick", "last")
    metrics = {k for k in last if "runtime" not in k and not k.rsplit("/", 1)[1].startswith("n_")
               and not k.endswith(("/ci_low", "/ci_high", "/p_value", "/n_units"))}  # bounds and counts: not ranked
    assert set(shown) - {k for k in shown if k.endswith("style_gap")} == metrics
    for key in metrics:
        assert shown[key] == last[key][1], key
    best = _html_cells(text, "summary-quick", "best")
    evals = [e for e in events if "eval/rmbench/hard_acc" in e]
    assert best["eval/rmbench/hard_acc"] == max(e["eval/rmbench/hard_acc"] for e in evals)
    gap = [e["eval/rmbench/easy_acc"] - e["eval/rmbench/hard_acc"] for e in evals]
    assert shown["eval/rmbench/style_gap"] == pytest.approx(gap[-1])
    assert "eval/rmbench_runtime" not in shown and "eval/rmbench/n_rows" not in shown
    md = (out / "report.md").read_text()
    assert f"| eval/rmbench/hard_acc | {last['eval/rmbench/hard_acc'][1]:.4f} | 12 | 2 |" in md
    for png in out.glob("*.png"):
        assert f"]({png.name})" in md
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"][0]["status"] == "finished"
    assert summary["runs"][0]["eval_points"] == [6, 12]
    assert summary["runs"][0]["recipe"]["model.model_name_or_path"] == "tiny-judge"


def test_heatmap_matrices_come_from_the_rows_and_match_the_logged_levels(single):
    run, events, _, _, _ = single
    rows = [json.loads(line) for line in (run / "eval" / "12" / "rmbench.jsonl").read_text().splitlines()]
    mats = rmbench_matrices(rows)
    assert list(mats) == ["overall", "chat", "code", "safety"]
    # by hand, RM-Bench's rule: cell (i, j) is the share of a domain's scored rows whose chosen response in style i
    # outscores the rejected one in style j (no ties in these scores); overall is the mean of the domain matrices
    by_hand = {}
    for domain in ("chat", "code", "safety"):
        # safety-refuse and safety-response pooled into safety, as RM-Bench's authors do
        scored = [r for r in rows if r["domain"].split("-")[0] == domain and not r.get("skipped")]
        chosen, rejected = np.array([r["score_chosen"] for r in scored]), np.array([r["score_rejected"] for r in scored])
        assert len(scored) == (24 if domain == "safety" else 12) and not (chosen[:, :, None] == rejected[:, None, :]).any()
        by_hand[domain] = (chosen[:, :, None] > rejected[:, None, :]).mean(axis=0)
    by_hand["overall"] = np.mean([by_hand[d] for d in ("chat", "code", "safety")], axis=0)
    for name, matrix in by_hand.items():
        np.testing.assert_allclose(mats[name], matrix, rtol=0, atol=1e-12, err_msg=name)
    overall = by_hand["overall"]
    logged = [e for e in events if e["step"] == 12 and "eval/rmbench/hard_acc" in e][0]
    assert overall[np.triu_indices(3, 1)].mean() == pytest.approx(logged["eval/rmbench/hard_acc"], abs=1e-12)
    assert np.diag(overall).mean() == pytest.approx(logged["eval/rmbench/normal_acc"], abs=1e-12)
    assert overall[np.tril_indices(3, -1)].mean() == pytest.approx(logged["eval/rmbench/easy_acc"], abs=1e-12)
    assert by_hand["safety"][np.tril_indices(3, -1)].mean() == pytest.approx(
        logged["eval/rmbench/safety/easy_acc"], abs=1e-12)
    overall = mats["overall"]
    fig = matrix_figure(overall, "overall")
    assert tuple(fig.get_size_inches() * fig.dpi) == (400, 400)
    assert [t.get_text() for t in fig.axes[0].texts][:2] == [f"{overall[0, 0]:.2f}", "normal"]


def test_killed_then_resumed_run_keeps_the_later_values(tmp_path):
    run = tmp_path / "resumed"
    run.mkdir()
    first = _events(run, np.random.default_rng(1), range(1, 9), {6})
    # killed while writing step 10: a torn record without newline
    _write(run, first, tail='{"step": 10, "epoch": 1.6667, "train/lo')
    (run / "checkpoint-6").mkdir()
    # resumed from checkpoint-6 without cleaning the log: steps 8 and 10 come again, glued to the torn line
    second = _events(run, np.random.default_rng(2), range(7, 13), {12})
    _write(run, second, tail='{"step": 13, "epoch": 2.1')  # and killed again
    notes: list[str] = []
    merged = read_metrics(run / "metrics.jsonl", notes)
    assert sorted(merged) == [2, 4, 6, 8, 10, 12]
    assert merged[8]["train/loss"] == second[0]["train/loss"] != first[-1]["train/loss"]
    assert merged[10]["train/loss"] == second[1]["train/loss"]
    assert merged[6]["eval/rmbench/hard_acc"] == first[-2]["eval/rmbench/hard_acc"]
    assert any("glued" in n for n in notes) and any("cut off" in n for n in notes)
    assert any("logged again after a resume" in n for n in notes)
    assert "last eval (step 12) scored fewer rows than asked: rmbench skipped 1" in load_run(run).notes

    result = build_report([run], tmp_path / "out")
    paths = result["paths"]
    assert {"train_curves.png", "rmbench_matrix_step6.png", "rmbench_matrix_step12.png"} <= set(paths)
    text = paths["report.html"].read_text()
    shown = _html_cells(text, "summary-resumed", "last")
    assert shown["eval/rmbench/total_avg_acc"] == second[-1]["eval/rmbench/total_avg_acc"]
    assert "logged again after a resume" in text
    assert result["infos"][0]["status"].startswith("in progress")
    assert len(re.findall(r'<img src="data:image/png;base64,', text)) == len(list((tmp_path / "out").glob("*.png")))


def test_run_still_going_without_eval_gets_training_curves_and_says_what_is_missing(tmp_path):
    run = tmp_path / "going"
    run.mkdir()
    _write(run, _events(run, np.random.default_rng(3), range(1, 6), set()), tail='{"step": 6, "ep')
    paths = make_report([run], tmp_path / "out")
    assert sorted(p for p in paths if p.endswith(".png")) == ["train_curves.png"]
    assert _size(paths["train_curves.png"]) == (1200, 300)
    text = paths["report.html"].read_text()
    assert "No evaluation logged yet" in text and "no recipe.yaml" in text and "no evaluation yet" in text

    # killed during the first eval: rows on disk, no eval event: heatmap only, and a note saying so
    rows = _eval_rows(np.random.default_rng(4), 1.0)
    (run / "eval" / "6").mkdir(parents=True)
    (run / "eval" / "6" / "rmbench.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows["rmbench"]) + '{"id": "code/99", "dom')
    loaded = load_run(run)
    assert len(loaded.eval_rows[6]["rmbench"]) == len(rows["rmbench"])
    paths = make_report([run], tmp_path / "out2")
    assert sorted(p for p in paths if p.endswith(".png")) == ["rmbench_matrix_step6.png", "train_curves.png"]
    assert "no eval event at step 6" in paths["report.md"].read_text()


def test_two_runs_are_overlaid_and_compared(tmp_path, capsys, monkeypatch):
    run_a, events_a = make_run(tmp_path, "base", seed=0)
    run_b, events_b = make_run(tmp_path, "debiased", seed=5, finished=False)
    out = tmp_path / "cmp"
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["report", str(run_a), str(run_b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "last eval (best @ epoch)" in printed and "debiased" in printed
    paths = {p.name: p for p in out.iterdir()}
    for name in ("train_curves.png", "rmbench_curves.png", "style_bias.png", "judgebias_types.png", "ideation.png"):
        assert name in paths  # one figure per kind, every run drawn in it
    assert _size(paths["rmbench_curves.png"]) == (1600, 300)
    assert {f"rmbench_matrix_{r}_step{s}.png" for r in ("base", "debiased") for s in (6, 12)} <= set(paths)
    assert _size(paths["rmbench_matrix_last.png"]) == (800, 400)
    text = paths["report.html"].read_text()
    table = re.search(r'<table class="comparison">(.*?)</table>', text, re.S).group(1)
    for name, events in (("base", events_a), ("debiased", events_b)):
        cells = dict(re.findall(rf'<tr data-metric="([^"]+)">.*?<td data-run="{name}" data-value="([^"]+)">',
                                table))
        last = last_values(events)
        assert float(cells["eval/ideation/accuracy"]) == last["eval/ideation/accuracy"][1]
        assert float(cells["eval/rmbench/chat/avg_acc"]) == last["eval/rmbench/chat/avg_acc"][1]
    assert len(re.findall(r'<img src="data:image/png;base64,', text)) == len(list(out.glob("*.png")))
    md = paths["report.md"].read_text()
    assert "## Comparison" in md and "| metric | base | debiased | better |" in md


def test_cli_report_prints_the_summary_and_exits_zero(single, tmp_path):
    _, events, _, out, printed = single
    assert "quick: finished; last step 12, epoch 2, 2 eval point(s)" in printed
    assert "eval/rmbench/hard_acc" in printed
    assert f"{last_values(events)['eval/rmbench/hard_acc'][1]:.4f}" in printed
    assert str(out / "report.html") in printed.replace("\n", "")
    assert cli.main(["report", str(tmp_path / "nope")]) == 2


def test_matrix_images_reach_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter
    from transformers.integrations import TensorBoardCallback

    callback = TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(tmp_path / "tb")))
    mats = {"overall": np.eye(3), "chat": np.full((3, 3), 0.5)}
    assert log_matrix_images([callback], mats, step=6) == ["tensorboard"]
    callback.tb_writer.close()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    acc.Reload()
    assert sorted(acc.Tags()["images"]) == ["eval/rmbench/chat/matrix", "eval/rmbench/matrix"]
    image = acc.Images("eval/rmbench/matrix")[0]
    assert (image.step, image.width, image.height) == (6, 400, 400)


def test_matrix_images_reach_wandb_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from transformers.integrations import WandbCallback

    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(mode="offline", dir=str(tmp_path), project="judgetrain-test")
    try:
        assert log_matrix_images([WandbCallback()], {"overall": np.eye(3)}, step=12) == ["wandb"]
        images = list(Path(run.dir).rglob("*.png"))
    finally:
        wandb.finish()
    assert [p for p in images if "matrix" in p.name]


def test_no_active_backend_logs_nothing_and_import_stays_light():
    assert log_matrix_images([], {"overall": np.eye(3)}, step=1) == []
    code = "import sys, judgetrain.report.build; print('matplotlib' in sys.modules, 'rich' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_report_opens_with_the_model_cards_headline_at_the_best_and_last_eval(single):
    from judgetrain.report.card import render_card

    run, events, _, out, printed = single
    evals = {}
    for e in events:
        if any(k.startswith("eval/") for k in e):
            evals.setdefault(e["step"], {}).update(e)
    best = max(evals, key=lambda s: (evals[s]["eval/rmbench/total_avg_acc"], -s))  # the earliest best
    last = max(evals)
    html = (out / "report.html").read_text()
    assert html.index("<h2>Headline: quick</h2>") < html.index("<h2>Runs</h2>") < html.index("<h2>Summary: quick")
    table = re.search(r'<table class="headline" id="headline-quick">(.*?)</table>', html, re.S).group(1)
    cells = re.findall(r'<tr data-metric="([^"]+)">.*?data-value="([^"]+)">.*?data-value="([^"]+)">', table)
    assert [c[0] for c in cells] == ["eval/rmbench/hard_acc", "eval/rmbench/normal_acc", "eval/rmbench/easy_acc",
                                     "eval/rmbench/total_avg_acc", "eval/judgebias/error/accuracy",
                                     "eval/judgebias/represent/accuracy", "eval/ideation/accuracy"]
    for key, at_best, at_last in cells:
        assert float(at_best) == evals[best][key] and float(at_last) == evals[last][key], key
    md = (out / "report.md").read_text()
    assert md.index("## Headline: quick") < md.index("## Runs") < md.index("## Summary: quick")
    # no interval was logged with these figures: the cell says so
    row = (f"| RM-Bench hard accuracy (implicit: log_ratio) | {evals[best]['eval/rmbench/hard_acc']:.4f} [-, -] | "
           f"{evals[last]['eval/rmbench/hard_acc']:.4f} [-, -] |")
    assert row in md
    assert row in render_card(run)  # the model card shows the same figures, from the same function
    head = json.loads((out / "summary.json").read_text())["headline"]["quick"]
    assert head["best_step"] == best and head["last_step"] == last
    assert head["selected_by"] == "eval/rmbench/total_avg_acc"
    assert printed.index("quick: headline") < printed.index("last eval and best epoch")


def test_report_opens_with_what_got_worse_than_the_base_judge_in_red_then_base_vs_trained(tmp_path):
    """An eval with a baseline (the eval before the first step): the figure whose difference is negative with an
    interval excluding 0 is named in red before any table; base = trained - difference; a run without a baseline
    says why there is no comparison."""
    run = tmp_path / "guarded"
    run.mkdir()
    at = {"step": 10, "epoch": 1.0, "eval/evalbiasbench/verdict/single_acc": 0.40,
          "eval/evalbiasbench/verdict/single_acc/ci_low": 0.30, "eval/evalbiasbench/verdict/single_acc/ci_high": 0.50,
          "eval/evalbiasbench/verdict/delta/single_acc": -0.25,
          "eval/evalbiasbench/verdict/delta/single_acc/delta_ci_low": -0.35,
          "eval/evalbiasbench/verdict/delta/single_acc/delta_ci_high": -0.15,
          "eval/evalbiasbench/verdict/delta/single_acc/p_value": 0.0012,
          "eval/evalbiasbench/verdict/delta/single_acc/n_units": 40,
          "eval/evalbiasbench/verdict/agreement": 0.9, "eval/evalbiasbench/verdict/delta/agreement": 0.05,
          "eval/evalbiasbench/verdict/delta/agreement/delta_ci_low": -0.05,
          "eval/evalbiasbench/verdict/delta/agreement/delta_ci_high": 0.15,
          "eval/evalbiasbench/verdict/delta/agreement/p_value": 0.5}
    _write(run, [{"step": 0, "epoch": 0.0, "eval/evalbiasbench/verdict/single_acc": 0.65,
                  "eval/evalbiasbench/verdict/single_acc/ci_low": 0.55,
                  "eval/evalbiasbench/verdict/single_acc/ci_high": 0.75,
                  "eval/evalbiasbench/verdict/agreement": 0.85}, at])
    plain = tmp_path / "plain"
    plain.mkdir()
    _write(plain, [{"step": 6, "epoch": 1.0, "eval/evalbiasbench/verdict/single_acc": 0.5}])
    paths = make_report([run, plain], tmp_path / "out")
    html = paths["report.html"].read_text()
    worse = re.search(r'<p class="worse" id="worse-guarded">(.*?)</p><ul class="worse">(.*?)</ul>', html, re.S)
    assert worse.group(1) == ("Worse than the base judge at step 10 (paired test p &lt; 0.05 after Holm across the "
                              "figures, the interval of the difference excluding 0):")
    assert re.findall(r"<li>(.*?)</li>", worse.group(2)) == ["evalbiasbench/verdict/single_acc (verdict: verdict_logprob)"]
    assert html.index('id="worse-guarded"') < html.index("<table")  # before any table
    assert ".worse{color:#b00020" in html
    table = re.search(r'<table class="versus" id="versus-guarded">(.*?)</table>', html, re.S).group(1)
    rows = {m: re.findall(r"<td[^>]*>(.*?)</td>", r) for m, r in re.findall(r'<tr data-metric="([^"]+)">(.*?)</tr>', table)}
    verdict = " (verdict: verdict_logprob)"
    assert rows["evalbiasbench/verdict/single_acc" + verdict] == [  # the base's interval: the one logged at step 0
        "evalbiasbench/verdict/single_acc" + verdict, "0.6500 [0.5500, 0.7500]", "0.4000 [0.3000, 0.5000]",
        "-0.2500 [-0.3500, -0.1500]", "0.0012"]
    assert rows["evalbiasbench/verdict/agreement" + verdict][1:3] == ["0.8500 [-, -]", "0.9000 [-, -]"]
    assert re.search(r'<p class="no-worse" id="worse-plain">No evaluation against the base judge was logged', html)
    md = paths["report.md"].read_text()
    assert ("**Worse than the base judge at step 10 (paired test p < 0.05 after Holm across the figures, the interval "
            "of the difference excluding 0)**: `evalbiasbench/verdict/single_acc (verdict: verdict_logprob)`") in md
    assert ("| evalbiasbench/verdict/single_acc (verdict: verdict_logprob) | 0.6500 [0.5500, 0.7500] | 0.4000 [0.3000, 0.5000] | "
            "-0.2500 [-0.3500, -0.1500] | 0.0012 |") in md
    # the recipe's margin, as the run's guard used it: a loss of at least 0.2 is not shown by [-0.35, -0.15]
    (run / "recipe.yaml").write_text("eval_regression_margin: 0.2\n")
    html = make_report([run], tmp_path / "out2")["report.html"].read_text()
    assert re.search(r'<p class="no-worse" id="worse-guarded">No category got worse than the base judge at step 10',
                     html)


def test_the_best_of_style_spread_is_its_lowest_and_interval_bounds_are_never_ranked(tmp_path):
    """style_spread is lower-is-better (`judgetrain.config.directions`): its best is the eval where it is lowest, 0.5
    at step 20, not 2.47 at step 10; its interval bounds are no rows of the summary. Against the base judge, a
    category of 2 units lost on both ([-1, -1]) is too few to tell, never worse."""
    run = tmp_path / "spread"
    run.mkdir()
    evals = [(0, 1.0, 0.9, 1.1), (10, 2.47, 2.3, 2.6), (20, 0.5, 0.4, 0.6), (30, 1.2, 1.0, 1.4)]
    events = [{"step": s, "epoch": s / 10, "eval/rmbench/style_spread": v, "eval/rmbench/style_spread/ci_low": lo,
               "eval/rmbench/style_spread/ci_high": hi, "eval/rmbench/hard_acc": 0.5} for s, v, lo, hi in evals]
    events[-1].update({"eval/judgebench/verdict/coding/accuracy": 0.0,
                       "eval/judgebench/verdict/delta/coding/accuracy": -1.0,
                       "eval/judgebench/verdict/delta/coding/accuracy/delta_ci_low": -1.0,
                       "eval/judgebench/verdict/delta/coding/accuracy/delta_ci_high": -1.0,
                       "eval/judgebench/verdict/delta/coding/accuracy/p_value": 0.5,
                       "eval/judgebench/verdict/delta/coding/accuracy/n_units": 2})
    _write(run, events)
    paths = make_report([run], tmp_path / "out")
    html = paths["report.html"].read_text()
    best = _html_cells(html, "summary-spread", "best")
    assert best["eval/rmbench/style_spread"] == 0.5
    assert not [k for k in best if k.endswith(("/ci_low", "/ci_high", "/p_value", "/n_units"))]
    summary = json.loads(paths["summary.json"].read_text())
    row = next(r for r in summary["tables"]["spread"] if r["metric"] == "eval/rmbench/style_spread")
    assert (row["best"], row["best_step"], row["better"]) == (0.5, 20, "lower")
    assert re.search(r'<p class="no-worse" id="worse-spread">No category got worse than the base judge at step 30; '
                     r"too few units to tell: judgebench/verdict/coding/accuracy \(verdict: verdict_logprob\)\.", html)


def test_every_headline_figure_shows_its_interval_in_the_report_the_card_and_the_console(tmp_path):
    """A run that logged each figure with its interval (the base at step 0, two evals after it): the headline (page,
    Markdown, terminal, model card) and the table against the base (page, Markdown, the training log's text) show
    each figure as ``value [ci_low, ci_high]``, the base's interval being the one logged at step 0."""
    from judgetrain.report.card import render_card
    from judgetrain.report.headline import against_base, against_base_text

    run = tmp_path / "ranged"
    run.mkdir()
    (run / "recipe.yaml").write_text("model_name_or_path: tiny-judge\n")
    key, judge = "eval/rmbench/hard_acc", "eval/rmbench/judge/hard_acc"
    events = []
    for step, value, judged in ((0, 0.30, 0.25), (10, 0.55, 0.45), (20, 0.50, 0.60)):
        event = {"step": step, "epoch": step / 10, key: value, f"{key}/ci_low": value - 0.125,
                 f"{key}/ci_high": value + 0.125, judge: judged, f"{judge}/ci_low": judged - 0.0625,
                 f"{judge}/ci_high": judged + 0.0625}
        if step:
            delta = "eval/rmbench/judge/delta/hard_acc"
            event.update({delta: judged - 0.25, f"{delta}/delta_ci_low": judged - 0.3,
                          f"{delta}/delta_ci_high": judged - 0.2, f"{delta}/p_value": 0.004})
        events.append(event)
    _write(run, events)
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setenv("COLUMNS", "200")
        assert cli.main(["report", str(run), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    html = (tmp_path / "out" / "report.html").read_text()
    best_last = "| RM-Bench hard accuracy (implicit: log_ratio) | 0.5500 [0.4250, 0.6750] | 0.5000 [0.3750, 0.6250] |"
    assert best_last in md and best_last in render_card(run)
    headline = re.search(r'<table class="headline" id="headline-ranged">(.*?)</table>', html, re.S).group(1)
    assert re.findall(r'<td class="(?:best|last)"[^>]*>(.*?)</td>', headline) == ["0.5500 [0.4250, 0.6750]",
                                                                             "0.5000 [0.3750, 0.6250]"]
    assert re.search(r"RM-Bench hard accuracy \(implicit: log_ratio\)\s*│\s*0\.5500 \[0\.4250, 0\.6750\]\s*│\s*0\.5000 \[0\.3750, 0\.6250\]",
                     printed.getvalue())
    versus = ("| rmbench/judge/hard_acc (judge: expected_score) | 0.2500 [0.1875, 0.3125] | 0.6000 [0.5375, 0.6625] | "
              "0.3500 [0.3000, 0.4000] | 0.0040 |")
    assert versus in md and versus in render_card(run)
    table = re.search(r'<table class="versus" id="versus-ranged">(.*?)</table>', html, re.S).group(1)
    assert re.findall(r"<td[^>]*>(.*?)</td>", table) == versus.strip("| ").split(" | ")
    text = against_base_text(against_base(read_metrics(run / "metrics.jsonl"))).splitlines()
    assert text[1].split() == ["figure", "(mode:", "reading)", "base", "[95%", "interval]", "trained", "[95%",
                               "interval]", "difference", "[95%", "interval]", "p"]
    assert text[2].split() == ["rmbench/judge/hard_acc", "(judge:", "expected_score)", "0.2500", "[0.1875,", "0.3125]", "0.6000", "[0.5375,",
                               "0.6625]", "0.3500", "[0.3000,", "0.4000]", "0.0040"]


def _judge_rows(run: Path, step: int, scores: dict[str, float], spread: float) -> None:
    """eval/<step>/ judge-mode rows: 6 JudgeBias items per category at ``scores[category]`` (+- ``spread``), and
    4 RM-Bench prompts whose 6 responses sit at the same scores."""
    folder = run / "eval" / str(step)
    folder.mkdir(parents=True)
    rows = [{"perturbation_category": cat, "perturbation_type": "t", "anchor_score": 4.0, "score_chosen": 4.0,
             "score_rejected": 2.5, "judge_score": scores[cat] + (spread if i % 2 else -spread)}
            for cat in ("error", "represent") for i in range(6)]
    (folder / "judgebias.judge.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rm = [{"id": f"chat/{i}", "score_chosen": [scores["error"] + spread] * 3, "score_rejected": [scores["error"] - spread] * 3}
          for i in range(4)]
    (folder / "rmbench.judge.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rm))


@pytest.mark.parametrize("spread, flat", [(0.004, True), (0.8, False)])
def test_a_judge_that_scores_every_item_alike_is_named_as_why_its_figures_moved_together(tmp_path, spread, flat):
    """Judge-mode rows whose scores over the items spread by 0.004 points (a judge that reads every item alike, as
    the tiny judge does): the report, its log text and the model card say why the error and representational figures
    moved together, with the scores at the base and at the eval; spread by 0.8 points, nothing is said."""
    from judgetrain.report.card import render_card
    from judgetrain.report.headline import against_base, against_base_text

    run = tmp_path / "flat"
    run.mkdir()
    (run / "recipe.yaml").write_text("model_name_or_path: tiny-judge\n")
    delta = "eval/judgebias/judge/delta/error/detect_rate"
    _write(run, [{"step": 0, "epoch": 0.0, "eval/judgebias/judge/error/detect_rate": 0.75},
                 {"step": 10, "epoch": 1.0, "eval/judgebias/judge/error/detect_rate": 1.0, delta: 0.25,
                  f"{delta}/delta_ci_low": 0.1, f"{delta}/delta_ci_high": 0.4, f"{delta}/p_value": 0.004}])
    _judge_rows(run, 0, {"error": 3.2, "represent": 3.2}, spread)
    _judge_rows(run, 10, {"error": 2.87, "represent": 2.88}, spread)
    text = against_base_text(against_base(read_metrics(run / "metrics.jsonl"), None, run))
    paths = make_report([run], tmp_path / "out")
    md, html = paths["report.md"].read_text(), paths["report.html"].read_text()
    said = ("JudgeBias in judge mode: the judge gives every item nearly one score (the base: 3.200, sd 0.004; step 10: "
            "2.875, sd 0.006; errors 2.870, rewrites 2.880): it does not tell an error from a rewrite")
    rm = "RM-Bench in judge mode: every response is scored within a sliver of the scale (the base: 3.200, sd 0.004;"
    for page in (text, md, html, render_card(run)):
        assert (said in page and rm in page) is flat and ("Why: " in page or "Why:</b>" in page) is flat
    if flat:
        assert md.index("| judgebias/judge/error/detect_rate (judge: expected_score) |") < md.index("Why: JudgeBias") < md.index("## Runs")


def test_every_figure_of_the_headline_and_of_the_table_against_the_base_names_its_mode_and_reading(tmp_path):
    """The quickstart's case: bare keys in implicit mode (JudgeBias represent accuracy 1.0000 [1.0000, 1.0000]) right
    under a table against the base read in judge mode (represent/accuracy 0.1429, worse). Each figure a person reads
    names the mode and reading it is: the headline's "(implicit: log_ratio)", the table's "(judge: expected_score)",
    on the page, in the Markdown and in the model card; no headline or comparison row goes without one."""
    from judgetrain.report.card import render_card

    run = tmp_path / "quick"
    run.mkdir()
    (run / "recipe.yaml").write_text(yaml.safe_dump({"model_name_or_path": "tiny-judge",
                                                     "eval_scoring": ["implicit", "judge"]}))
    bare, judged = "eval/judgebias/represent/accuracy", "eval/judgebias/judge/represent/accuracy"
    delta = "eval/judgebias/judge/delta/represent/accuracy"
    _write(run, [{"step": 0, "epoch": 0.0, bare: 0.5, judged: 0.5714, f"{judged}/ci_low": 0.2857,
                  f"{judged}/ci_high": 0.8571},
                 {"step": 62, "epoch": 2.0, bare: 1.0, f"{bare}/ci_low": 1.0, f"{bare}/ci_high": 1.0, judged: 0.1429,
                  f"{judged}/ci_low": 0.0, f"{judged}/ci_high": 0.4286, delta: -0.4285,
                  f"{delta}/delta_ci_low": -0.7143, f"{delta}/delta_ci_high": -0.1429, f"{delta}/p_value": 0.0156,
                  f"{delta}/n_units": 7}])
    md = make_report([run], tmp_path / "out")["report.md"].read_text()
    assert "| JudgeBias represent accuracy (implicit: log_ratio) | 1.0000 [1.0000, 1.0000] | 1.0000 [1.0000, 1.0000] |" \
        in md
    assert ("| judgebias/judge/represent/accuracy (judge: expected_score) | 0.5714 [0.2857, 0.8571] | "
            "0.1429 [0.0000, 0.4286] | -0.4285 [-0.7143, -0.1429] | 0.0156 |") in md
    assert "`judgebias/judge/represent/accuracy (judge: expected_score)`" in md  # named among the worse
    rows = [line for line in md.splitlines() if re.match(r"\| (JudgeBias|judgebias)", line)]
    assert len(rows) == 2 and all(re.match(r"\| [^|]+ \((implicit|judge): [a-z_]+\) \|", line) for line in rows)
    card = render_card(run)
    assert "| JudgeBias represent accuracy (implicit: log_ratio) | 1.0000" in card
    assert "| judgebias/judge/represent/accuracy (judge: expected_score) | 0.5714" in card
