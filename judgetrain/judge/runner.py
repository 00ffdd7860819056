"""The loop of `judgetrain judge`: every judge over every item not yet done, committed a batch at a time.

- Work: per judge, the items the done index (`judgetrain.judge.output`) does not list, longest prompt first, in
  chunks of ``chunk_size`` items per process; process r takes items r, r + world, ... of each chunk, so every item
  is generated once per judge. A local judge runs on `judgetrain.eval.generate.Generator` (length-sorted, left-padded
  batches, the shared prompt prefix once per batch, merged LoRA; the transformers engine or vLLM) with ``sync``: every
  process makes the same number of generate calls, as `generate_sharded` does, but each keeps its own texts (there
  is nothing to gather: each writes its own shard). An endpoint judge (`judgetrain.judge.endpoint`) sends its share
  of each chunk as concurrent requests. On vLLM a local judge loads no transformers copy of its weights
  (`disk_generator`, `judgetrain.judge.fit`): the engine reads them, and the adapter as a LoRA request, from disk.
- Forced score prefix (``force_score_prefix``): the judge's turn starts with judge mode's forced prefix
  (`judgetrain.eval.scoring.DEFAULT_JUDGE_PREFIX`, the JSON up to ``"overall_score": ``), its first token is one of the
  score tokens judge mode reads (`ScoringEngine.score_token_ids`), then it writes a few tokens; the evaluation written
  is the prefix, the score it wrote (``4``, ``4.5``) and the JSON block's end (`evaluation_text`).
- Refusals: a prompt an endpoint refuses is a row with reason ``endpoint_rejected``; a judge whose ``retry_rejected``
  is on (``--retry_rejected``) generates those rows again, on a resume too (the new row replaces the refusal in the
  merge). An endpoint that refuses its first prompts alike (`judgetrain.judge.endpoint.RequestRefused`: an option
  of the request, not a prompt) stops the command, nothing committed for them.
- Stop: SIGTERM or Ctrl-C is checked before every generate call and between chunks (OR-ed over the processes); the
  batches committed stay, the one in flight is dropped, and the command ends with 143 (`EXIT_PREEMPTED`).
"""

from __future__ import annotations

import logging
import re
import signal
import time
from pathlib import Path
from typing import Any

from judgetrain.data.chat import judge_turn
from judgetrain.data.scoreparse import parse_overall_score_result
from judgetrain.eval.generate import Generator
from judgetrain.eval.vllm import resolve_backend
from judgetrain.eval.scoring import DEFAULT_JUDGE_PREFIX, EvalStopped, ScoringEngine
from judgetrain.eval.sequences import judge_prompt_ids
from judgetrain.judge.endpoint import REJECTED_REASON, EndpointError, EndpointGenerator, Rejected
from judgetrain.judge.items import Item
from judgetrain.judge.fit import LoadPlan, adapter_config, auto_batch_tokens, engine_weights, gpu_share, load_plan
from judgetrain.judge.judges import JudgeSpec, endpoint_settings, load_files, load_local
from judgetrain.judge.options import Options
from judgetrain.judge.output import (ShardWriter, check_identity, done_items, merge, merged_bytes, read_done,
                                     rejected_items, summarize, write_summary)
from judgetrain.judge.resume import record_items
from judgetrain.trainer.callbacks import GracefulStop
from judgetrain.utils.ranks import decided_on_main

logger = logging.getLogger(__name__)

CLOSE_BLOCK = "\n}\n```"
VLLM_BATCH_TOKENS = 8192  # vLLM schedules its own batches: the generator's budget only groups the prompts it is sent
_FORCED_SCORE = re.compile(r"[ \t]*([0-9](?:\.[0-9])?)")  # one class per quantifier, nothing to backtrack into


class JudgeStopped(Exception):
    """SIGTERM / Ctrl-C: the committed batches stay, the rest is left for the next run."""


class StopFlag(GracefulStop):
    """Training's graceful stop (`judgetrain.trainer.callbacks.GracefulStop`: its SIGTERM / SIGINT handlers) as a
    flag the loop reads between generate calls; a second Ctrl-C gives up at once."""

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not self.requested:
            self.signal_name = signal.Signals(signum).name
            logger.warning("%s received: keeping the committed batches and stopping", self.signal_name)
        self.requested = True


# ------------------------------------------------------------------------------------------------ generators
class ForcedScoreGenerator(Generator):
    """A Generator whose prompts end with the forced score prefix and whose first token is a score token."""

    def __init__(self, model, tokenizer, *, prefix: str, score_ids: list[int], **kwargs):
        super().__init__(model, tokenizer, **kwargs)
        self.prefix = prefix
        vocab = max(int(getattr(model.config, "vocab_size", 0) or 0), len(tokenizer))
        keep = set(score_ids)
        self.suppress = [i for i in range(vocab) if i not in keep]

    def prompt_ids(self, prompt) -> list[int]:
        return judge_prompt_ids(self.tokenizer, prompt, self.prefix)

    def generation_config(self, max_new_tokens: int | None = None):
        config = super().generation_config(max_new_tokens)
        config.begin_suppress_tokens = self.suppress
        return config


def local_generator(spec: JudgeSpec, opts: Options, device, stop_check=None) -> tuple[Any, str | None]:
    """(generator, forced prefix or None) of a local judge. On the vLLM backend no transformers model of the weights
    is loaded (`judgetrain.judge.fit.load_plan`): the engine reads them from disk."""

    plan = load_plan(spec, resolve_backend(opts.backend), adapter_config(spec))
    if not plan.transformers_weights:
        return disk_generator(spec, plan, opts, stop_check), None
    model, tokenizer = load_local(spec, dtype=opts.dtype, trust_remote_code=opts.trust_remote_code, device=device)
    batch_tokens = opts.batch_tokens
    if batch_tokens is None:
        batch_tokens, how = auto_batch_tokens(model, device)
        logger.info("judge %s: batch_tokens auto: %d (%s)", spec.name, batch_tokens, how)
    kwargs = dict(max_new_tokens=opts.max_new_tokens, max_length=opts.max_length, batch_tokens=batch_tokens,
                  max_batch_size=opts.max_batch_size, do_sample=opts.do_sample, temperature=opts.temperature,
                  top_p=opts.top_p, seed=opts.seed, backend=opts.backend, stop_check=stop_check)
    if not opts.force_score_prefix:
        return Generator(model, tokenizer, **kwargs), None
    engine = ScoringEngine(model, tokenizer, scoring="judge")
    score_ids, values = engine.score_token_ids()  # the tokens judge mode reads; the prefix as it reads them
    logger.info("judge %s: forced prefix %r, first token one of the scores %s", spec.name, engine.judge_prefix, values)
    return ForcedScoreGenerator(model, tokenizer, prefix=engine.judge_prefix, score_ids=score_ids, **kwargs), engine.judge_prefix


def disk_generator(spec: JudgeSpec, plan: LoadPlan, opts: Options, stop_check=None) -> Generator:
    """The Generator of a judge whose vLLM engine loads its weights from disk: the tokenizer and the config's numbers
    from the model's files, the judge's gpu_memory_utilization for the engine."""
    tokenizer, config, path = load_files(spec, plan.base, revision=plan.revision,
                                         trust_remote_code=opts.trust_remote_code)
    weights, context = engine_weights(plan, path, config, opts)
    logger.info("judge %s: vLLM reads %s%s from disk (%s, context %d, gpu_memory_utilization %g); no transformers "
                "copy of the weights", spec.name, path, f" and the adapter {plan.adapter}" if plan.adapter else "",
                weights.dtype, context, gpu_share(spec, opts))
    return Generator(None, tokenizer, max_new_tokens=opts.max_new_tokens, max_length=context,
                     batch_tokens=opts.batch_tokens or VLLM_BATCH_TOKENS, max_batch_size=opts.max_batch_size,
                     do_sample=opts.do_sample,
                     temperature=opts.temperature, top_p=opts.top_p, seed=opts.seed, backend=plan.engine,
                     vllm_kwargs={"gpu_memory_utilization": gpu_share(spec, opts)}, vllm_weights=weights,
                     stop_check=stop_check)


def endpoint_generator(spec: JudgeSpec, opts: Options) -> tuple[Any, str | None]:

    prefix = DEFAULT_JUDGE_PREFIX if opts.force_score_prefix else None
    gen = EndpointGenerator(base_url=spec.endpoint, model=spec.model, api_key_env=spec.key_env,
                            max_new_tokens=opts.max_new_tokens, temperature=opts.temperature if opts.do_sample else 0.0,
                            seed=opts.seed, force_prefix=prefix, **endpoint_settings(spec, opts))
    return gen, prefix


def evaluation_text(text: str, prefix: str | None) -> str:
    """The evaluation as written into the panel: the judge's text; after a forced prefix, the prefix, the score the
    judge wrote (a digit and, when it writes one, a decimal: ``4``, ``4.5``) and the block's end. What a forced judge
    writes after its score is not kept (a pair built from the row trains on this short answer). A forced judge that
    writes no digit first (an endpoint, which cannot be held to the score tokens) keeps its text after the prefix."""
    if prefix is None:
        return text
    score = _FORCED_SCORE.match(text)
    return prefix + (score.group(1) if score else text) + CLOSE_BLOCK


def output_row(item: Item, judge: str, evaluation: str, g, opts: Options) -> dict:
    """One panel row (`judgetrain.data.pairs` reads it): the item's columns, then the judge's evaluation and what
    the score parser read from it (the parse `judgetrain pairs build` makes)."""
    row = {"sample_id": item.key[0], "perturbation_set": None, "perturbation_category": None,
           "perturbation_rate": None}
    row.update(item.columns)
    if isinstance(g, Rejected):  # the server refused the prompt: a row that says so, nothing to parse
        row.update(judge_model=judge, prompt=item.messages, evaluation="", score=None, reason=REJECTED_REASON,
                   n_tokens=0, stopped=False, error=f"HTTP {g.status}: {g.message}")
        return row
    turn, fake = judge_turn(evaluation)
    parsed = None if fake else parse_overall_score_result(turn, key=opts.score_key, lo=opts.scale[0], hi=opts.scale[1])
    row.update(judge_model=judge, prompt=item.messages, evaluation=evaluation,
               score=parsed.score if parsed else None, reason=parsed.reason if parsed else "fake_turn",
               n_tokens=int(g.n_tokens), stopped=bool(g.stopped), error=None)
    return row


# ------------------------------------------------------------------------------------------------ the loop
class Progress:
    """Items done / total, evaluations/s and ETA, logged by the main process at most every ``every`` seconds."""

    def __init__(self, total: int, done: int, main: bool, every: float = 10.0):
        self.total, self.done, self.main, self.every = total, done, main, every
        self.start_done, self.t0, self.last, self.logged = done, time.monotonic(), 0.0, -1

    def add(self, n: int, judge: str, force: bool = False) -> None:
        self.done += n
        now = time.monotonic()
        if not self.main or (not force and now - self.last < self.every) or (force and self.done == self.logged):
            return
        self.last, self.logged = now, self.done
        rate = (self.done - self.start_done) / max(now - self.t0, 1e-9)
        left = self.total - self.done
        eta = f"{left / rate / 60:.1f} min" if rate > 0 else "?"
        logger.info("%s: %d/%d evaluations done (%.1f%%), %.2f evaluations/s, ETA %s", judge, self.done, self.total,
                    100 * self.done / max(self.total, 1), rate, eta)

    def rate(self) -> float:
        return (self.done - self.start_done) / max(time.monotonic() - self.t0, 1e-9)


def _chunks(order: list[int], size: int) -> list[list[int]]:
    return [order[i: i + size] for i in range(0, len(order), size)]


def judge_one(spec: JudgeSpec, items: list[Item], missing: list[int], opts: Options, writer: ShardWriter, state,
              stop, progress: Progress) -> int:
    """Generate ``missing`` (item indices) with one judge; returns the evaluations this process committed."""

    rank, world = state.process_index, state.num_processes
    # a local judge's stop check is OR-ed over the processes (the flag itself in one process)
    gen, prefix = endpoint_generator(spec, opts) if spec.is_endpoint else \
        local_generator(spec, opts, state.device, stop.any_requested)
    # longest prompt first: each chunk holds prompts of like length, so its batches pad little
    order = sorted(missing, key=lambda i: (-sum(len(m["content"]) for m in items[i].messages), i))
    committed = 0
    try:
        for chunk in _chunks(order, opts.chunk_size * world):
            if stop.any_requested():
                raise JudgeStopped
            mine = chunk[rank::world]
            t0 = time.perf_counter()
            prompts = [items[i].messages for i in mine]
            try:
                outs = gen.generate(prompts) if spec.is_endpoint else gen.generate(prompts, sync=world > 1)
            except EndpointError as e:  # the answers that came back are committed before the error goes on
                got = [(i, g) for i, g in zip(mine, e.partial or []) if g is not None]
                if got:
                    commit(spec, [i for i, _ in got], [g for _, g in got], prefix, items, opts, writer,
                           time.perf_counter() - t0)
                raise
            committed += commit(spec, mine, outs, prefix, items, opts, writer, time.perf_counter() - t0)
            progress.add(len(chunk), spec.name)
    except EvalStopped:
        raise JudgeStopped from None
    finally:
        if hasattr(gen, "stats") and spec.is_endpoint and state.is_main_process:
            logger.info("judge %s: endpoint requests %s", spec.name, dict(gen.stats))
        gen.close()
    progress.add(0, spec.name, force=True)
    return committed


def commit(spec: JudgeSpec, mine: list[int], outs: list, prefix: str | None, items: list[Item], opts: Options,
           writer: ShardWriter, seconds: float) -> int:
    """One batch of a judge's evaluations (items ``mine``, their results ``outs``) committed; returns its rows."""
    rows = [output_row(items[i], spec.name, evaluation_text(g.text, prefix), g, opts) for i, g in zip(mine, outs)]
    writer.append(rows, spec.name, mine, {
        "score": [r["score"] for r in rows], "reason": [r["reason"] for r in rows],
        "n_tokens": [r["n_tokens"] for r in rows], "stopped": [r["stopped"] for r in rows],
        "truncated": sum(bool(getattr(g, "truncated", False)) for g in outs), "seconds": seconds})
    return len(rows)


def generate_missing(specs: list[JudgeSpec], items: list[Item], done: dict, opts: Options, out, state,
                     progress: Progress) -> int | None:
    """Every judge over the items ``done`` does not hold; the evaluations this process committed, or None when a
    signal stopped it (the committed batches stay)."""
    stop = StopFlag().install()
    writer = ShardWriter(out, state.process_index)
    generated = 0
    try:
        for spec in specs:
            missing = [i for i in range(len(items)) if i not in done.get(spec.name, ())]
            if missing:
                generated += judge_one(spec, items, missing, opts, writer, state, stop, progress)
    except JudgeStopped:
        if state.is_main_process:
            logger.warning("stopped by %s: %d/%d evaluations committed to %s; run the same command to continue",
                           stop.signal_name or "a stop request of another process", progress.done, progress.total,
                           out)
        return None
    finally:
        writer.close()
        stop.uninstall()
    return generated


def kept_items(out, specs: list[JudgeSpec], opts: Options, main: bool) -> dict[str, set[int]]:
    """judge name -> the items whose committed row stays: a row its endpoint refused does not when the judge's
    ``retry_rejected`` is on (it is generated again)."""
    committed = read_done(out)
    done, refused = done_items(committed), rejected_items(committed)
    for spec in specs:
        again = refused.get(spec.name, set()) if spec.retries_rejected(opts) else set()
        if again:
            done[spec.name] = done[spec.name] - again
            if main:
                logger.info("judge %s: %d row(s) its endpoint refused are generated again (retry_rejected)", spec.name,
                            len(again))
    return done


def identity(item_set, specs: list[JudgeSpec], opts: Options) -> dict:
    return {"items": {"source": item_set.source, "digest": item_set.digest(), "n_items": len(item_set.items)},
            "judges": [s.identity() for s in specs], "options": opts.identity()}


def confirmed(out, item_set, ident: dict) -> str:
    """`check_identity`, then the items file's stamp for the next start (`judgetrain.judge.resume`)."""

    start = check_identity(out, ident)
    record_items(out, item_set)
    return start


def run_panel(item_set, specs: list[JudgeSpec], opts: Options, out, state) -> dict:
    """Every judge over every item into ``out`` (see the module doc), resuming what is there. Returns
    ``{"status": "finished" | "stopped", "generated": this process's rows, "summary": ..., "evaluations": path}``;
    RecipeError when ``out`` holds another run's rows."""

    out = Path(out)
    items = item_set.items
    names = [s.name for s in specs]
    start = decided_on_main(lambda: confirmed(out, item_set, identity(item_set, specs, opts)))
    done = kept_items(out, specs, opts, state.is_main_process)
    total = len(items) * len(specs)
    n_done = sum(len(done.get(n, set()) & set(range(len(items)))) for n in names)
    main = state.is_main_process
    final = out / "evaluations.jsonl"
    if main:
        logger.info("%s %s: %d/%d evaluations done, %d to generate (%d item(s) x %d judge(s))", start, out, n_done,
                    total, total - n_done, len(items), len(specs))
    state.wait_for_everyone()  # every process has read the index before any shard is cut back
    progress = Progress(total, n_done, main)
    generated = generate_missing(specs, items, done, opts, out, state, progress) if n_done < total else 0
    if generated is None:
        return {"status": "stopped", "generated": 0}
    state.wait_for_everyone()
    result: dict[str, Any] = {"status": "finished", "generated": generated, "evaluations": str(final),
                              "evaluations_per_s": progress.rate()}
    if main:
        committed = read_done(out)
        merged = merged_bytes(committed, names, len(items))  # the size of a merge of the committed rows, each once
        if generated or progress.done > n_done or not final.exists() or final.stat().st_size != merged:
            merge(out, names, len(items), committed)
        else:
            logger.info("nothing left to do: %s holds every evaluation", final)
        result["summary"] = summarize(committed, names, len(items))
        write_summary(out, result["summary"])
    state.wait_for_everyone()
    return result
