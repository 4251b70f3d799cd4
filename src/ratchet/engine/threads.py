"""Threads for plain ``def`` steps.

A worker's own pool, sized from its concurrency rather than asyncio's default executor (a
handful of threads shared with everything else in the process). Python cannot stop a
thread: a ``def`` step that times out or is cancelled keeps running until its code returns,
and its result is dropped. Such an abandoned thread does not count against the pool's size,
so steps stuck past their timeout cannot starve the others. The threads are daemons: a worker
that exits does not wait for a step it has already given up on.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any


class StepJob:
    """One call of a ``def`` step: ``started`` resolves when a thread picks it up (a step's
    timeout counts from then), ``done`` with its result or exception."""

    __slots__ = ("abandoned", "call", "done", "loop", "running", "started")

    def __init__(self, loop: asyncio.AbstractEventLoop, call: Callable[[], Any]) -> None:
        self.loop = loop
        self.call = call
        self.started: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[Any] = loop.create_future()
        self.abandoned = False
        self.running = False


def _resolve(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class StepThreads:
    """At most ``size`` threads run steps that someone still waits for."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self._jobs: queue.SimpleQueue[StepJob] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._pending = 0
        self._abandoned_running = 0

    def submit(self, call: Callable[[], Any]) -> StepJob:
        job = StepJob(asyncio.get_running_loop(), call)
        with self._lock:
            self._pending += 1
            spawn = (
                self._idle < self._pending and self._threads - self._abandoned_running < self.size
            )
            if spawn:
                self._threads += 1
        self._jobs.put(job)
        if spawn:
            threading.Thread(target=self._serve, name="ratchet-step", daemon=True).start()
        return job

    def abandon(self, job: StepJob) -> None:
        """The caller stopped waiting (timeout, cancel): the thread no longer counts."""
        with self._lock:
            if not job.abandoned:
                job.abandoned = True
                if job.running:
                    self._abandoned_running += 1

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            job = self._jobs.get()
            with self._lock:
                self._idle -= 1
                self._pending -= 1
                job.running = not job.abandoned  # given up before it began: skip it
            if not job.running:
                continue
            self._run(job)
            with self._lock:
                job.running = False
                if job.abandoned:
                    self._abandoned_running -= 1
                if self._threads - self._abandoned_running > self.size:
                    self._threads -= 1  # the pool grew past its size while steps hung
                    return

    @staticmethod
    def _run(job: StepJob) -> None:
        loop = job.loop
        try:
            loop.call_soon_threadsafe(_resolve, job.started, True, None)
        except RuntimeError:
            return  # the loop is gone: nobody waits for this job
        try:
            value, ok = job.call(), True
        except BaseException as e:  # SystemExit too: it is the step's outcome, not ours
            value, ok = e, False
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, job.done, ok, value)
