"""Requests of many clients scored together: the queue and batcher in front of a `JudgeReward` (`judgetrain serve`).

    batcher = RewardBatcher(reward, max_batch_texts=256)
    await batcher.start()                       # in the server's event loop
    rewards = await batcher.score(prompts, completions, references)   # from each request handler
    await batcher.stop()                        # the requests queued still get their answer

A request is checked before it is queued (`judgetrain.rewards.reward.check_inputs`: BadInputError to its client
alone) and cut into parts of at most ``max_batch_texts`` texts. One worker takes the oldest part and every part queued
behind it while their texts fit ``max_batch_texts`` (after a short ``gather_s`` wait that lets concurrent clients
arrive), scores them in one call of the reward (one engine call: a prompt shared by several requests runs once) in a
worker thread, and hands each part its slice; a request is answered when all its parts are. Parts asking for verdict
references and parts without are never mixed in one call. When a call fails, its parts are scored again one by one,
so only the part that cannot be scored gets the error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from judgetrain.rewards.reward import JudgeReward, check_inputs

logger = logging.getLogger(__name__)


@dataclass
class _Job:
    prompts: list[Any]
    completions: list[Any]
    references: list[Any] | None
    done: asyncio.Future = field(repr=False)


@dataclass
class BatcherStats:
    requests: int = 0  # client requests answered: with their rewards or with an error
    failed_requests: int = 0  # answered with an error (or given up by their client)
    pending: int = 0  # requests taken and not answered yet (queued or being scored)
    texts: int = 0
    batches: int = 0  # calls of the reward that scored
    largest_batch_requests: int = 0  # most request parts scored in one call
    largest_batch_texts: int = 0  # most texts scored in one call (at most max_batch_texts)
    failed_batches: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class RewardBatcher:
    """The queue and its one worker (see the module doc)."""

    def __init__(self, reward: JudgeReward, *, max_batch_texts: int = 256, gather_s: float = 0.005) -> None:
        self.reward = reward
        self.max_batch_texts = int(max_batch_texts)
        self.gather_s = float(gather_s)
        self.stats = BatcherStats()
        self._queue: asyncio.Queue[_Job] | None = None
        self._worker: asyncio.Task | None = None
        self._held: _Job | None = None  # a part taken from the queue that did not fit the last batch

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Answer every request taken, then stop the worker."""
        if self._worker is None:
            return
        while self.stats.pending:
            await asyncio.sleep(0.01)
        self._worker.cancel()
        try:
            await self._worker
        except asyncio.CancelledError:
            pass
        self._worker = None

    async def score(self, prompts: Sequence[Any], completions: Sequence[Any],
                    references: Sequence[Any] | None = None) -> list[float | None]:
        """The rewards of one client's texts (BadInputError, before queuing, for texts that cannot be scored)."""
        check_inputs(prompts, completions, references, self.reward.mode)
        if self._queue is None:
            raise RuntimeError("the batcher is not started")
        loop, step = asyncio.get_running_loop(), self.max_batch_texts
        parts = [_Job(list(prompts[a: a + step]), list(completions[a: a + step]),
                      None if references is None else list(references[a: a + step]), loop.create_future())
                 for a in range(0, max(len(completions), 1), step)]
        self.stats.pending += 1
        failed = True
        try:
            for part in parts:
                self._queue.put_nowait(part)
            answers = await asyncio.gather(*(part.done for part in parts), return_exceptions=True)
            error = next((a for a in answers if isinstance(a, BaseException)), None)
            if error is not None:
                raise error
            failed = False
        finally:
            self.stats.pending -= 1
            self.stats.requests += 1
            self.stats.failed_requests += int(failed)
        return [r for answer in answers for r in answer]

    async def _next_batch(self) -> list[_Job]:
        first = self._held or await self._queue.get()
        self._held = None
        if self.gather_s > 0:
            await asyncio.sleep(self.gather_s)
        jobs, texts = [first], len(first.completions)
        while not self._queue.empty():
            job = self._queue.get_nowait()
            same_kind = (job.references is None) == (first.references is None)
            if not same_kind or texts + len(job.completions) > self.max_batch_texts:
                self._held = job
                break
            jobs.append(job)
            texts += len(job.completions)
        return jobs

    async def _run(self) -> None:
        while True:
            await self._answer(await self._next_batch())

    async def _answer(self, jobs: list[_Job]) -> None:
        """Score ``jobs`` in one call and hand each its slice; a failed call of several parts is scored again part by
        part, so the error reaches only the part that fails alone."""
        prompts = [p for j in jobs for p in j.prompts]
        completions = [c for j in jobs for c in j.completions]
        references = None if jobs[0].references is None else [r for j in jobs for r in j.references]
        try:
            call = await asyncio.to_thread(self.reward.score, prompts, completions, references)
        except Exception as err:  # noqa: BLE001 - the server goes on; only the part that fails alone gets the error
            self.stats.failed_batches += 1
            logger.error("reward batch of %d request parts failed: %s: %s%s", len(jobs), type(err).__name__, err,
                         "; scoring them one by one" if len(jobs) > 1 else "")
            if len(jobs) > 1:
                for job in jobs:
                    await self._answer([job])
            elif not jobs[0].done.done():
                jobs[0].done.set_exception(err)
            return
        self.stats.batches += 1
        self.stats.texts += len(completions)
        self.stats.largest_batch_requests = max(self.stats.largest_batch_requests, len(jobs))
        self.stats.largest_batch_texts = max(self.stats.largest_batch_texts, len(completions))
        at = 0
        for j in jobs:
            n = len(j.completions)
            if not j.done.done():  # a client that went away has its future cancelled
                j.done.set_result(call.rewards[at: at + n])
            at += n
