"""`judgetrain judge`: items checked before any model loads, judge specifications, the panel rows `judgetrain pairs
build` reads, resume (nothing generated twice, a changed run refused), torn batches cut back, and (slow) a real
process killed with SIGKILL or stopped with SIGTERM mid-run, two processes, and the loop judges -> pairs -> DPO ->
the trained judge."""

from __future__ import annotations

import json
import logging
import re
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from helpers import REPO, read_jsonl, train_on_pairs

JUDGEBIAS_VALIDATION = REPO / "judgetrain" / "data" / "samples" / "judgebias" / "validation.parquet"
PANEL_COLUMNS = ["sample_id", "perturbation_set", "perturbation_category", "perturbation_rate", "judge_model", "prompt",
                 "evaluation"]


def write_items(path: Path, n: int, *, start: int = 0) -> Path:
    """``n`` JudgeBias-shaped items (the bundled validation prompts), one per sample and perturbation set."""
    from judgetrain.judge.items import judgebias_items
    import pyarrow.parquet as pq

    rows, seen = [], set()
    for row in pq.read_table(JUDGEBIAS_VALIDATION).to_pylist():
        item = judgebias_items(row)
        key = (item["sample_id"], item["perturbation_set"])
        if key not in seen:
            seen.add(key)
            rows.append({**item, "prompt": json.loads(item["prompt"]), "domain": "materials"})
    rows = rows[start: start + n]
    assert len(rows) == n
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def judge(*argv) -> int:
    from judgetrain.cli import main  # the entry: bad input is its one line, exit code 2

    return main(["judge", *(str(a) for a in argv)])


# ------------------------------------------------------------------------------------------------ items
def test_bad_items_are_named_by_file_row_and_field_before_any_model_loads(tmp_path, capsys):
    items = tmp_path / "items.jsonl"
    good = {"sample_id": 1, "prompt": [{"role": "user", "content": "Rate this."}]}
    rows = [good, {"prompt": good["prompt"]}, {"sample_id": 2, "prompt": "plain text"},
            {"sample_id": 1, "prompt": [{"role": "user", "content": "Another."}]},
            {"sample_id": 3, "prompt": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}]
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the judge can load (an alias, built only when it loads): the items are refused before it does
    code = judge("--items", items, "--judge", "tiny-judge", "--output_dir", tmp_path / "out")
    err = capsys.readouterr().err
    assert code == 2
    assert f"{items} [split=train] row 1, field 'sample_id': missing column" in err
    assert "4 of 5 rows are bad" in err
    assert not (tmp_path / "out" / "judge_run.json").exists()

    from judgetrain.data.validate import DataValidationError
    from judgetrain.judge.items import read_items

    with pytest.raises(DataValidationError) as info:
        read_items(str(items))
    problems = {(p.row, p.field): p.problem for p in info.value.problems}
    assert problems[(1, "sample_id")] == "missing column"
    assert problems[(2, "prompt")].startswith("not valid JSON") or "JSON" in problems[(2, "prompt")]
    assert problems[(3, "sample_id")] == f"duplicated item: sample_id 1 already at {items} row 0"
    assert problems[(4, "prompt")] == "the last message is the assistant's: the judge writes that turn"

    skipped = read_items(str(items), on_bad_row="skip", rejects_path=str(tmp_path / "rejects.jsonl"))
    assert [i.key for i in skipped.items] == [(1, None)] and skipped.n_rejected == 4 and skipped.n_rows == 5
    rejects = read_jsonl(tmp_path / "rejects.jsonl")
    assert sorted((r["row"], r["field"]) for r in rejects) == [(1, "sample_id"), (2, "prompt"), (3, "sample_id"),
                                                               (4, "prompt")]


def test_judgebias_rows_are_items_one_per_sample_and_perturbation_set():
    import pyarrow.parquet as pq

    from judgetrain.judge.items import read_items

    rows = pq.read_table(JUDGEBIAS_VALIDATION).to_pylist()
    item_set = read_items(str(JUDGEBIAS_VALIDATION))
    keys = {(r["sample_id"], f"{r['perturbation_type']}_{round(r['perturbation_rate'] * 100)}pct") for r in rows}
    assert item_set.judgebias and len(item_set.items) == len(keys) == 96
    assert {i.key for i in item_set.items} == keys
    first = item_set.items[0]
    row = next(r for r in rows if r["sample_id"] == first.key[0])
    assert first.messages == json.loads(row["prompt"])
    assert set(first.columns) == {"sample_id", "perturbation_set", "perturbation_category", "perturbation_rate",
                                  "perturbation_type"}
    assert item_set.digest() == read_items(str(JUDGEBIAS_VALIDATION)).digest()


# ------------------------------------------------------------------------------------------------ judges
def test_judge_specifications():
    from judgetrain.judge.judges import JudgeSpecError, judge_specs, parse_judge

    assert parse_judge("tiny-judge").name == "tiny-judge"
    spec = parse_judge("endpoint=http://127.0.0.1:8000/v1,model=gpt-x,key_env=MY_KEY")
    assert (spec.is_endpoint, spec.name, spec.model, spec.key_env) == (True, "gpt-x", "gpt-x", "MY_KEY")
    assert parse_judge("model=Qwen/Qwen3-8B,name=q").name == "q"
    for bad, message in (("model=a,colour=red", "unknown key(s) colour"), ("endpoint=http://x", "needs model=NAME"),
                         ("model=a,key_env=K", "key_env is for endpoint judges"), ("name=x", "a judge needs model=M")):
        with pytest.raises(JudgeSpecError, match=re.escape(message)):
            parse_judge(bad)
    spec = parse_judge("endpoint=http://h/v1,model=m,timeout_s=30,max_retries=5,wait_budget_s=900")
    assert (spec.timeout_s, spec.max_retries, spec.wait_budget_s) == (30.0, 5, 900.0)
    for bad, message in (("endpoint=http://h/v1,model=m,max_retries=many", "max_retries='many' is not an integer"),
                         ("endpoint=http://h/v1,model=m,max_retries=-1", "max_retries must be at least 0"),
                         ("endpoint=http://h/v1,model=m,timeout_s=0", "timeout_s must be > 0"),
                         ("model=a,wait_budget_s=5", "wait_budget_s is for endpoint judges")):
        with pytest.raises(JudgeSpecError, match=re.escape(message)):
            parse_judge(bad)
    with pytest.raises(JudgeSpecError, match="both named 'tiny-judge'"):
        judge_specs(["tiny-judge", "model=tiny-judge"], None)
    with pytest.raises(JudgeSpecError, match="has no adapter_config.json"):
        judge_specs(["model=tiny-judge,adapter=/nonexistent"], None)


def test_judges_file_is_read_safely(tmp_path):
    from judgetrain.judge.judges import JudgeSpecError, judge_specs

    path = tmp_path / "judges.yaml"
    path.write_text("- model: tiny-judge\n  name: a\n- tiny-judge\n- endpoint: http://127.0.0.1:1/v1\n  model: m\n"
                    "  max_retries: 3\n  wait_budget_s: 1200\n")
    specs = judge_specs(["model=tiny-judge,name=c"], str(path))
    assert [s.name for s in specs] == ["a", "tiny-judge", "m", "c"]
    assert (specs[2].max_retries, specs[2].wait_budget_s, specs[2].timeout_s) == (3, 1200.0, None)
    path.write_text("- !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(JudgeSpecError, match="cannot read it"):
        judge_specs(None, str(path))


# ------------------------------------------------------------------------------------------------ runs
def test_panel_rows_resume_and_refusal(tmp_path, tiny_judge, capsys, caplog):
    """Two judges over 6 items with the forced prefix: 12 rows in the panel schema that pairs build scores; the same
    command again generates nothing; another option is refused naming it."""
    items = write_items(tmp_path / "items.jsonl", 6)
    out = tmp_path / "panel"
    args = ["--items", items, "--judge", "tiny-judge", "--judge", f"model={tiny_judge},name=second",
            "--output_dir", out, "--force_score_prefix", "--chunk_size", 4]
    assert judge(*args) == 0
    rows = read_jsonl(out / "evaluations.jsonl")
    assert len(rows) == 12
    assert list(rows[0])[:4] == PANEL_COLUMNS[:4] and set(PANEL_COLUMNS) <= set(rows[0])
    assert [(r["sample_id"], r["judge_model"]) for r in rows[:2]] == [(rows[0]["sample_id"], "tiny-judge"),
                                                                      (rows[0]["sample_id"], "second")]
    assert rows[0]["domain"] == "materials" and rows[0]["perturbation_category"] in ("error", "represent")
    assert all(r["evaluation"].startswith('```json\n{\n  "overall_score": ') for r in rows)
    assert all(r["reason"] == "ok" and r["score"] in (1.0, 2.0, 3.0, 4.0, 5.0) for r in rows)
    from judgetrain.data.pairs import load_table, score_evaluations

    evals, rejects = score_evaluations(load_table(out / "evaluations.jsonl"))
    assert len(evals) == 12 and rejects == []
    assert [e.score for e in evals] == [r["score"] for r in rows]  # the parse pairs build makes
    summary = json.loads((out / "summary.json").read_text())
    assert summary["second"]["rows"] == 6 and summary["second"]["parse_rate"] == 1.0
    assert summary["second"]["reasons"] == {"ok": 6}

    index = (out / "shards" / "rank-0.index").read_bytes()
    capsys.readouterr()
    assert judge(*args) == 0
    assert (out / "shards" / "rank-0.index").read_bytes() == index  # nothing generated again
    assert read_jsonl(out / "evaluations.jsonl") == rows
    check_nothing_left_is_decided_before_torch(args, items, out, rows, caplog)
    assert judge(*args[:-2], "--max_new_tokens", 3) == 2
    assert "option max_new_tokens: 4 -> 3" in capsys.readouterr().err
    other = write_items(tmp_path / "other.jsonl", 6, start=1)
    assert judge("--items", other, *args[2:]) == 2
    assert "What changed: items:" in capsys.readouterr().err


def check_nothing_left_is_decided_before_torch(args, items: Path, out: Path, rows: list[dict], caplog):
    """A finished run started again exits 0 without importing torch or accelerate, the summary printed; an items
    file touched, or a merged file cut short, sends the start down the full path, which writes them again; a
    zero-filled done index is named in one line and every evaluation generated again, to the same rows."""
    from judgetrain.judge.resume import ITEMS_FILE, nothing_left
    from judgetrain.judge.judges import judge_specs
    from judgetrain.judge.options import Options

    code = ("import sys; from judgetrain.cli.judge import main; rc = main(sys.argv[1:]); "
            "print('imported', sorted(m for m in ('torch', 'accelerate', 'transformers', 'datasets') if m in sys.modules)); "
            "sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "imported []" in proc.stdout and "parse rate" in proc.stdout
    assert "nothing left to do" in proc.stderr and "12/12 evaluations done, 0 to generate" in proc.stderr
    record = json.loads((out / ITEMS_FILE).read_text())
    assert record["path"] == str(items.resolve()) and record["n_items"] == 6 and record["size"] == items.stat().st_size

    specs = judge_specs([str(args[3]), str(args[5])], None)
    opts = Options(max_new_tokens=4, force_score_prefix=True)
    assert nothing_left(out, str(items), specs, opts) is not None
    assert nothing_left(out, str(items), specs, Options(max_new_tokens=5, force_score_prefix=True)) is None
    assert nothing_left(out, str(items), specs[:1], opts) is None
    os.utime(items, ns=(items.stat().st_atime_ns, items.stat().st_mtime_ns + 10**9))  # same bytes, touched
    assert nothing_left(out, str(items), specs, opts) is None
    assert judge(*args) == 0  # the full start: the items compared, the stamp written again
    assert nothing_left(out, str(items), specs, opts) is not None
    final = out / "evaluations.jsonl"
    final.write_bytes(final.read_bytes()[:-50])  # a merged file cut short
    assert nothing_left(out, str(items), specs, opts) is None
    assert judge(*args) == 0
    assert read_jsonl(final) == rows
    index = out / "shards" / "rank-0.index"  # a done index zero-filled (a write the disk never completed)
    index.write_bytes(bytes(index.stat().st_size))
    assert nothing_left(out, str(items), specs, opts) is None
    caplog.clear()
    assert judge(*args) == 0  # every evaluation generated again
    [torn] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"done index {index} is torn at byte 0 (zero bytes" in torn and "0 committed batch(es)" in torn
    assert "generated again" in torn and read_jsonl(final) == rows


TEARS = {  # how the done index of three batches of two rows is torn -> the batches it still commits
    "a half-written last line": (lambda d: d + b'{"end": 999, "judge": "j", "ite', 3, "without its newline"),
    "cut to half its size": (lambda d: d[:len(d) // 2], 1, "without its newline"),
    "zero-filled": (lambda d: bytes(len(d)), 0, "zero bytes"),
    "a line of the wrong shape": (lambda d: d.replace(b'"items": [2, 3]', b'"items": "2, 3"'), 1,
                                  "without its judge name and item indices"),
    "rows past the shard": (lambda d: d.replace(b'"end": 54', b'"end": 9999'), 2, "past the shard's 54"),
}


@pytest.mark.parametrize("how", list(TEARS))
def test_a_torn_done_index_is_named_once_and_only_its_items_are_generated_again(tmp_path, caplog, how):
    from judgetrain.judge.output import ShardWriter, done_items, merge, read_done

    out = tmp_path / "run"
    batches = [([{"i": 2 * k}, {"i": 2 * k + 1}], [2 * k, 2 * k + 1]) for k in range(3)]
    writer = ShardWriter(out, 0)
    for rows, items in batches:
        writer.append(rows, "j", items, {"score": [1.0, 2.0]})
    writer.close()
    shard, index = out / "shards" / "rank-0.jsonl", out / "shards" / "rank-0.index"
    assert shard.stat().st_size == 54  # (the batch ends the tears name)
    change, kept, why = TEARS[how]
    index.write_bytes(change(index.read_bytes()))
    done = done_items(read_done(out))
    assert done.get("j", set()) == set(range(2 * kept))  # what every process reads before any cut
    with caplog.at_level(logging.INFO, logger="judgetrain"):
        writer = ShardWriter(out, 0)
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"done index {index} is torn" in line and why in line and f"its {kept} committed batch(es)" in line
    assert shard.stat().st_size == 18 * kept  # the rows past the last trusted batch are cut off
    for rows, items in batches[kept:]:  # the runner generates what the index does not hold
        writer.append(rows, "j", items, {"score": [1.0, 2.0]})
    writer.close()
    path, n = merge(out, ["j"], 6, read_done(out))
    assert n == 6 and [r["i"] for r in read_jsonl(path)] == list(range(6))  # each once, none torn


def test_a_batch_cut_mid_write_is_dropped_and_never_duplicated(tmp_path):
    """What a SIGKILL between the two appends leaves: rows without their index line, a torn index line."""
    from judgetrain.judge.output import ShardWriter, done_items, merge, read_done

    out = tmp_path / "run"
    writer = ShardWriter(out, 0)
    writer.append([{"i": 0}, {"i": 1}], "j", [0, 1], {"score": [1.0, 2.0]})
    writer.close()
    shard, index = out / "shards" / "rank-0.jsonl", out / "shards" / "rank-0.index"
    committed = shard.read_bytes()
    with shard.open("ab") as f:
        f.write(b'{"i": 2}\n{"i": 3')  # the next batch's rows, torn, and no index line
    with index.open("ab") as f:
        f.write(b'{"end": 999, "judge": "j", "ite')
    assert done_items(read_done(out)) == {"j": {0, 1}}
    writer = ShardWriter(out, 0)  # cuts both back
    assert shard.read_bytes() == committed
    writer.append([{"i": 2}, {"i": 3}], "j", [2, 3], {})
    writer.close()
    path, n = merge(out, ["j"], 4, read_done(out))
    assert n == 4 and [r["i"] for r in read_jsonl(path)] == [0, 1, 2, 3]
    from judgetrain.utils.files import LockBusy

    holder = ShardWriter(out, 0)
    with pytest.raises(LockBusy):
        ShardWriter(out, 0)
    holder.close()
    with pytest.raises(RuntimeError, match="1 evaluation\\(s\\) missing"):
        merge(out, ["j"], 5, read_done(out))


def test_the_merge_streams_rows_in_item_order(tmp_path, monkeypatch):
    """Two shards whose batches hold items in any order, a row committed twice, a judge not in the panel: the merge
    writes each item x judge once, by item then judge, the lines as they were; its Python allocations peak far
    below the rows' size (a 64 KiB read block, about 14 bytes of place per row): it streams."""
    import tracemalloc

    from judgetrain.judge import output
    from judgetrain.judge.output import ShardWriter, merge, read_done

    monkeypatch.setattr(output, "MERGE_BLOCK", 1 << 16)
    out = tmp_path / "run"
    n_items, filler = 300, "x" * 4000
    for rank, (lo, hi) in enumerate(((0, 160), (140, 300))):  # items 140-159 committed twice, by both shards
        writer = ShardWriter(out, rank)
        for judge in ("b", "a", "old"):
            order = list(range(lo, hi))[::-1]  # longest first: not item order
            for start in range(0, len(order), 37):
                batch = order[start: start + 37]
                writer.append([{"i": i, "judge": judge, "rank": rank, "text": filler} for i in batch], judge, batch,
                              {})
        writer.close()
    committed = read_done(out)
    shard_bytes = sum(c.end for c in committed)
    tracemalloc.start()
    try:
        path, n = merge(out, ["a", "b"], n_items, committed)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rows = read_jsonl(path)
    assert n == 600 and [(r["i"], r["judge"]) for r in rows] == [(i, j) for i in range(n_items) for j in "ab"]
    assert {r["rank"] for r in rows if 140 <= r["i"] < 160} == {0}  # the first commit kept
    assert shard_bytes > 3_000_000 and peak < shard_bytes / 10, (peak, shard_bytes)
    assert path.read_bytes().count(b"\n") == 600
    places, twice = output._row_places(["a", "b"], n_items, committed, block=4096)  # lines longer than a block
    assert twice == 40 and places[0].count(-1) == 0
    with pytest.raises(RuntimeError, match=r"2 evaluation\(s\) missing from the shards, first \[\('c', 0\), \('c', 1\)\]"):
        merge(out, ["a", "c"], 2, committed)


def test_forced_evaluation_text():
    from judgetrain.judge.runner import evaluation_text

    prefix = '```json\n{\n  "overall_score": '
    assert evaluation_text("4.5,\n  \"x\": 1", prefix) == prefix + "4.5\n}\n```"
    assert evaluation_text("55555555", prefix) == prefix + "5\n}\n```"
    assert evaluation_text("free text", None) == "free text"


# ------------------------------------------------------------------------------------------------ kills (slow)
def _start(args, log: Path) -> subprocess.Popen:
    """A real `judgetrain judge` (or accelerate launch of it) in its own process group."""
    return subprocess.Popen([str(a) for a in args], cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _committed(out: Path) -> Counter:
    from judgetrain.judge.output import read_done

    return Counter((b["judge"], i) for c in read_done(out) for b in c.batches for i in b["items"])


def _wait_for_batches(proc, out: Path, n: int, timeout: float = 240) -> None:
    t0 = time.monotonic()
    while sum(_committed(out).values()) < n:
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {n} evaluations were committed"
        assert time.monotonic() - t0 < timeout, "no batch committed in time"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["one process", "two processes", "two processes, the launcher alone killed"])
def test_sigkill_mid_run_then_the_same_command_generates_only_what_is_missing(tmp_path, tiny_judge, launch):
    # 48 evaluations of 32 tokens: a run on a loaded machine cannot finish between the 4th commit and the kill
    n_items, judges = 24, ["tiny-judge", f"model={tiny_judge},name=second"]
    items = write_items(tmp_path / "items.jsonl", n_items)
    out = tmp_path / "panel"
    tail = ["--items", items, "--judge", judges[0], "--judge", judges[1], "--output_dir", out, "--chunk_size", 2,
            "--max_new_tokens", 32]
    cli = [sys.executable, "-m", "judgetrain.cli.judge"]
    if launch.startswith("two processes"):
        from helpers import free_port

        cli = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", REPO / "accelerate_configs" /
               "cpu.yaml", "--main_process_port", free_port(), "-m", "judgetrain.cli.judge"]
    proc = _start(cli + tail, tmp_path / "first.log")
    _wait_for_batches(proc, out, 4)
    import psutil

    tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    if launch.endswith("killed"):  # as a scheduler kills the job's command: torchrun's workers, in sessions of
        os.killpg(proc.pid, signal.SIGKILL)  # their own, must not run on (they get SIGTERM: stop after a batch)
        proc.wait()
        gone, alive = psutil.wait_procs([psutil.Process(p) for p in tree[1:] if psutil.pid_exists(p)], timeout=60)
        assert not alive, f"workers still running 60 s after their launcher was killed: {alive}"
    for pid in tree:  # every process of the run (torchrun's workers too), mid-batch
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    before = _committed(out)
    assert max(before.values()) == 1 and 0 < sum(before.values()) < n_items * 2
    assert not (out / "evaluations.jsonl").exists()
    # resumed in one process, whatever ran before
    second = subprocess.run([*map(str, [sys.executable, "-m", "judgetrain.cli.judge", *tail])], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    missing = n_items * 2 - sum(before.values())
    assert f"{sum(before.values())}/{n_items * 2} evaluations done, {missing} to generate" in second.stderr
    after = _committed(out)
    assert max(after.values()) == 1 and len(after) == n_items * 2  # each (judge, item) committed exactly once
    rows = read_jsonl(out / "evaluations.jsonl")
    assert len(rows) == n_items * 2
    keys = Counter((r["judge_model"], r["sample_id"], r["perturbation_set"]) for r in rows)
    assert max(keys.values()) == 1 and len(keys) == n_items * 2
    for judge_name in ("tiny-judge", "second"):
        assert json.loads((out / "summary.json").read_text())[judge_name]["rows"] == n_items


@pytest.mark.slow
def test_sigterm_ends_with_143_keeping_the_committed_batches(tmp_path, tiny_judge):
    items = write_items(tmp_path / "items.jsonl", 16)
    out = tmp_path / "panel"
    args = [sys.executable, "-m", "judgetrain.cli.judge", "--items", items, "--judge", "tiny-judge", "--output_dir",
            out, "--chunk_size", 1, "--max_new_tokens", 32]
    proc = _start(args, tmp_path / "run.log")
    _wait_for_batches(proc, out, 2)
    proc.send_signal(signal.SIGTERM)
    at_signal = sum(_committed(out).values())  # read after the signal: at least what was committed when it arrived
    assert proc.wait(timeout=60) == 143
    log = (tmp_path / "run.log").read_text()
    assert "SIGTERM received" in log and "run the same command to continue" in log
    done = sum(_committed(out).values())
    assert 2 <= done <= at_signal + 1  # the batch in flight is finished and kept; no batch starts after the signal
    final = subprocess.run([str(a) for a in args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]
    assert f"{done}/16 evaluations done, {16 - done} to generate" in final.stderr
    assert len(read_jsonl(out / "evaluations.jsonl")) == 16


# ------------------------------------------------------------------------------------------------ endpoint judges
def test_an_endpoint_judge_writes_panel_rows_through_the_command_and_its_key_stays_out(tmp_path, monkeypatch):
    """`--judge endpoint=...` runs the OpenAI-compatible client inside `judgetrain judge` against a real HTTP server
    on localhost: one row per item, the server's text as the evaluation, a 429 retried, the key in no output file."""
    from openai_server import ScriptedServer

    items = write_items(tmp_path / "items.jsonl", 5)
    monkeypatch.setenv("JT_TEST_KEY", "sk-test-secret-123")
    out = tmp_path / "out"
    with ScriptedServer(model="hosted-judge", key="sk-test-secret-123", script=["429"], retry_after="0") as server:
        code = judge("--items", items, "--output_dir", out, "--max_new_tokens", 16,
                     "--judge", f"endpoint={server.base_url},model=hosted-judge,key_env=JT_TEST_KEY,name=hosted")
        assert code == 0
        assert server.statuses.count(429) == 1 and server.statuses.count(200) == 5
        sent = {json.dumps(r["messages"]) for r in server.requests}
    rows = read_jsonl(out / "evaluations.jsonl")
    assert len(rows) == 5 and {r["judge_model"] for r in rows} == {"hosted"}
    assert all(c in rows[0] for c in PANEL_COLUMNS + ["score", "reason", "n_tokens", "stopped"])
    by_prompt = {json.dumps(r["prompt"] if isinstance(r["prompt"], list) else json.loads(r["prompt"])): r for r in rows}
    assert set(by_prompt) == sent  # every item's prompt went to the server once
    for prompt, row in by_prompt.items():
        last_user = [m for m in json.loads(prompt) if m["role"] == "user"][-1]["content"]
        assert row["evaluation"] == " ".join(reversed(last_user.split()))[: len(row["evaluation"])]
    for path in out.rglob("*"):
        if path.is_file():
            assert "sk-test-secret-123" not in path.read_text(encoding="utf-8", errors="replace"), path


def _endpoint_judge(server, name: str = "hosted", **extra) -> str:
    return ",".join([f"endpoint={server.base_url}", "model=hosted-judge", "key_env=JT_TEST_KEY", f"name={name}"]
                    + [f"{k}={v}" for k, v in extra.items()])


def test_a_rejected_prompt_is_a_row_and_the_run_goes_on(tmp_path, monkeypatch):
    """The server refuses one item's prompt (400, over its context): that item's row says endpoint_rejected with the
    status and the server's words (the key redacted), the summary counts it, every other item is answered."""
    from openai_server import ScriptedServer

    items = write_items(tmp_path / "items.jsonl", 5)
    rows = read_jsonl(items)
    rows[2]["prompt"][-1]["content"] += " TOOLONG"
    items.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("JT_TEST_KEY", "sk-test-secret-123")
    out = tmp_path / "out"
    with ScriptedServer(model="hosted-judge", key="sk-test-secret-123", reject_word="TOOLONG") as server:
        assert judge("--items", items, "--output_dir", out, "--max_new_tokens", 16, "--judge", _endpoint_judge(server)) == 0
    panel = read_jsonl(out / "evaluations.jsonl")
    assert len(panel) == 5 and [r["reason"] == "endpoint_rejected" for r in panel] == [False, False, True, False, False]
    bad = panel[2]
    assert bad["evaluation"] == "" and bad["score"] is None and bad["n_tokens"] == 0
    assert bad["error"].startswith("HTTP 400: This model's maximum context length is 32 tokens")
    assert "Bearer ***" in bad["error"] and all(r["error"] is None for i, r in enumerate(panel) if i != 2)
    summary = json.loads((out / "summary.json").read_text())["hosted"]
    assert summary["rows"] == 5 and summary["reasons"]["endpoint_rejected"] == 1
    for path in out.rglob("*"):
        if path.is_file():
            assert "sk-test-secret-123" not in path.read_text(encoding="utf-8", errors="replace"), path


def test_retries_run_out_the_answers_received_stay_and_a_new_host_resumes(tmp_path, monkeypatch, capsys):
    """--endpoint_max_retries 1 and a server that fails the third prompt twice: exit 1, the two answers received are
    committed; the same command against the same model on another server (another port) resumes them; a server that
    lists the model under another id is refused, naming it."""
    from openai_server import ScriptedServer

    items = write_items(tmp_path / "items.jsonl", 5)
    monkeypatch.setenv("JT_TEST_KEY", "k")
    out = tmp_path / "out"
    args = ["--items", items, "--output_dir", out, "--max_new_tokens", 16, "--concurrency", 1]
    with ScriptedServer(model="hosted-judge", key="k", script=["ok", "ok", "503", "503"]) as server:
        assert judge(*args, "--endpoint_max_retries", 1, "--judge", _endpoint_judge(server)) == 1
    err = capsys.readouterr().err
    assert "prompt 2 failed after 1 retries; last: HTTP 503" in err and "run the same command to continue" in err
    assert Counter(j for j, _ in _committed(out)) == {"hosted": 2}
    with ScriptedServer(model="org/hosted-judge", key="k") as renamed:
        assert judge(*args, "--judge", _endpoint_judge(renamed)) == 2
        assert renamed.requests == []
    assert "judge 'hosted' served model: the server lists it as 'org/hosted-judge', the run's was 'hosted-judge'" \
        in capsys.readouterr().err
    with ScriptedServer(model="hosted-judge", key="k") as other:
        assert judge(*args, "--judge", _endpoint_judge(other)) == 0
        assert len(other.requests) == 3  # only the three missing
    assert len(read_jsonl(out / "evaluations.jsonl")) == 5
    identity = json.loads((out / "judge_run.json").read_text())["judges"][0]
    assert identity == {"name": "hosted", "model": "hosted-judge", "kind": "endpoint", "served_model": "hosted-judge"}


def test_every_endpoint_judge_is_checked_before_any_model_loads(tmp_path, monkeypatch, capsys):
    """A missing key variable, a refused key, an unknown model, a server that is down: each exit 2 with one line
    naming the judge, the URL and the answer, before the local judge listed first (a folder that does not exist)
    is loaded and before any prompt is sent."""
    from helpers import free_port
    from openai_server import ScriptedServer

    items = write_items(tmp_path / "items.jsonl", 2)
    missing = f"model={tmp_path / 'no-such-model'},name=local"
    monkeypatch.setenv("JT_TEST_KEY", "good")
    monkeypatch.delenv("JT_TEST_KEY_2", raising=False)
    with ScriptedServer(model="hosted-judge", key="good") as server:
        cases = [
            (_endpoint_judge(server).replace("JT_TEST_KEY", "JT_TEST_KEY_2"), "environment variable JT_TEST_KEY_2 is not set"),
            (_endpoint_judge(server).replace("hosted-judge", "nope"), "model 'nope' not found (404)"),
            (_endpoint_judge(server).replace("JT_TEST_KEY", "JT_TEST_KEY_3"), "HTTP 401, the key in $JT_TEST_KEY_3"),
            (f"endpoint=http://127.0.0.1:{free_port()}/v1,model=m,name=down", "did not answer in 3 tries"),
        ]
        monkeypatch.setenv("JT_TEST_KEY_3", "bad-key-456")
        for spec, answer in cases:
            code = judge("--items", items, "--output_dir", tmp_path / "out", "--judge", missing, "--judge", spec)
            err = capsys.readouterr().err.strip().splitlines()
            assert code == 2 and len(err) == 1, err
            assert answer in err[0] and "judge '" in err[0] and "bad-key-456" not in err[0]
            assert "127.0.0.1:" in err[0]
        assert server.requests == [] and not (tmp_path / "out").exists()


def test_a_local_judge_retrained_in_place_is_refused_on_resume(tmp_path, capsys):
    """The weights fingerprint: the same folder rebuilt with other weights is another judge."""
    from judgetrain.cli import main as cli

    items = write_items(tmp_path / "items.jsonl", 2)
    folder = tmp_path / "judge"
    assert cli(["tiny", "build", "--seed", "1", "--out", str(folder)]) == 0
    args = ["--items", items, "--output_dir", tmp_path / "out", "--judge", f"model={folder},name=j", "--max_new_tokens", 2]
    assert judge(*args) == 0
    weights = json.loads((tmp_path / "out" / "judge_run.json").read_text())["judges"][0]["weights"]
    assert weights.startswith("sha256:") and len(weights) == 71
    assert judge(*args) == 0  # unchanged: nothing left to do
    import shutil

    shutil.rmtree(folder)
    assert cli(["tiny", "build", "--seed", "2", "--out", str(folder)]) == 0
    capsys.readouterr()
    assert judge(*args) == 2
    assert "judge 'j' weights changed (sha256:" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ the loop (slow)
def judgebias_items(parquet: Path, path: Path, samples: set | None = None, n: int | None = None) -> Path:
    """Items of a bundled JudgeBias split (one per sample and perturbation set): those of ``samples``, or the first
    ``n``."""
    from judgetrain.judge.items import read_items

    items = [i for i in read_items(str(parquet)).items if samples is None or i.key[0] in samples][:n]
    path.write_text("".join(json.dumps({**i.columns, "prompt": i.messages}) + "\n" for i in items), encoding="utf-8")
    return path


@pytest.mark.slow
def test_the_loop_judges_pairs_dpo_then_the_trained_judge_on_held_out_items(tmp_path, tiny_judge, capsys):
    """Three tiny judges (seeds 0, 1, 2) over the perturbed items of one sample -> pairs build -> a DPO LoRA run of
    4 steps on those pairs -> the trained adapter and its base over held-out items (other samples). The tiny judges
    write nothing parseable by themselves (checked first), so every stage runs with --force_score_prefix."""
    from judgetrain.cli import main as cli

    heldout = judgebias_items(REPO / "judgetrain" / "data" / "samples" / "judgebias" / "train.parquet",
                              tmp_path / "heldout.jsonl", n=4)
    assert judge("--items", heldout, "--judge", "tiny-judge", "--output_dir", tmp_path / "free", "--max_new_tokens",
                 8) == 0
    assert json.loads((tmp_path / "free" / "summary.json").read_text())["tiny-judge"]["parse_rate"] == 0.0

    for seed in (1, 2):
        assert cli(["tiny", "build", "--seed", str(seed), "--out", str(tmp_path / f"tiny-seed{seed}")]) == 0
    items = judgebias_items(JUDGEBIAS_VALIDATION, tmp_path / "items.jsonl", samples={1001})
    panel = tmp_path / "panel"
    assert judge("--items", items, "--judge", "tiny-judge", "--judge", f"model={tmp_path / 'tiny-seed1'},name=seed1",
                 "--judge", f"model={tmp_path / 'tiny-seed2'},name=seed2", "--force_score_prefix",
                 "--output_dir", panel) == 0
    n_items = len(read_jsonl(items))
    summary = json.loads((panel / "summary.json").read_text())
    assert [s["rows"] for s in summary.values()] == [n_items] * 3 and n_items >= 6
    assert all(s["parse_rate"] == 1.0 for s in summary.values())
    assert len({s["mean_score"] for s in summary.values()}) > 1  # judges that differ: pairs to build

    capsys.readouterr()
    assert cli(["pairs", "build", "--evaluations", str(panel / "evaluations.jsonl"), "--out", str(tmp_path / "pairs"),
                "--validation-fraction", "0"]) == 0
    stats = json.loads((tmp_path / "pairs" / "stats.json").read_text())
    assert stats["scored_rows"] == 3 * n_items and stats["rejected_rows"] == 0 and stats["skipped_samples"] == 0
    import pyarrow.parquet as pq

    pairs = pq.read_table(tmp_path / "pairs" / "train.parquet").to_pylist()
    assert len(pairs) >= 4 and {p["sample_id"] for p in pairs} == {1001}

    run = tmp_path / "run"
    proc = train_on_pairs(tmp_path / "pairs", run)
    assert "mixture: %d rows (judgebias %d)" % (len(pairs), len(pairs)) in proc.stderr

    out = tmp_path / "heldout"
    assert judge("--items", heldout, "--judge", "tiny-judge", "--judge", f"model=tiny-judge,adapter={run},name=trained",
                 "--force_score_prefix", "--output_dir", out) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trained"]["rows"] == 4 and summary["trained"]["parse_rate"] == 1.0
    identity = json.loads((out / "judge_run.json").read_text())
    assert identity["judges"][1]["adapter"] == str(run) and len(identity["judges"][1]["adapter_sha256"]) == 64
    rows = read_jsonl(out / "evaluations.jsonl")
    assert [r["judge_model"] for r in rows[:2]] == ["tiny-judge", "trained"]
    assert {r["sample_id"] for r in rows}.isdisjoint({1001})  # held out: samples the pairs never saw
