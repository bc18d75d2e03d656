"""The batch runner: one task per gateway process that pulls jobs from the batch store and answers their lines
through the app's own routes.

Each line is an in-process ASGI call into the whole app (every middleware included) with the identity of the key
that made the job (`INTERNAL_CALLER` in the scope's state, which no client can set) and the `batch` priority class
(`http.scheduler`), so the key's allow-list, rate limits, token budgets and the in-flight limits apply to a batch
line exactly as to the same request sent over HTTP, and the line never takes more than the batch class's share of
a model's slots. A line refused for load (429, 503) is retried after its `Retry-After` until the job expires; any
other answer (a spent token budget's 429, `x-should-retry: false`, included) is recorded (`stored.batches`: once per
line) before the runner moves on.

Jobs: the runner runs up to `running_jobs` unfinished jobs at a time (`--batch-running-jobs`), each under a lease
(renewed every second: the renewal also reads a cancel made through another gateway; a job runs on one gateway at
a time), claimed fairly between keys (`http.batch_slots`: the keys with the fewest jobs here first, and a key
running several gives one back when another key's job waits). Their unanswered lines run `concurrency` at a time in
all (`FairSlots`: round-robin between keys, then between a key's jobs), then each job is finalized: the output and
error files (OpenAI), the canceled or expired results of lines never run, the final status. When the process
stops, lines in flight are cancelled unrecorded and the leases are given back: the next runner on the store
resumes at the first unanswered line.

Expiry: a job past its `expires_at` starts no more lines and ends `expired` (its unrun lines `batch_expired` in the
error file, or Anthropic's `expired` results); each tick the loop also deletes up to `SWEEP_MOST` expired files
(every process, `--batch-concurrency 0` included). "Now" is `BatchService.clock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
from collections import Counter
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message

from openai_api.errors import BackendUnavailableError as StoreUnavailableError
from openai_api.http.batch_slots import FairSlots, claim_order, victim
from openai_api.http.deps import PRIORITY_CLASS_KEY
from openai_api.http.keys import CALLER_KEY
from openai_api.http.middleware import INTERNAL_CALLER
from openai_api.quota.caller import Caller
from openai_api.quota.keys import ANONYMOUS, API_KEY_NAME
from openai_api.quota.service import QuotaService
from openai_api.services.batches import BatchRecord, BatchService, Line, result_line

logger = logging.getLogger("openai_api.batches")
MAX_JOBS = 8  # without --batch-running-jobs
SWEEP_MOST = 100  # expired files deleted per tick at most (bounded work; the rest next tick)
CANDIDATES = 64  # unclaimed jobs looked at per poll (the fair order is chosen among them)
POLL_S = 1.0
RENEW_S = 1.0
MAX_BACKOFF_S = 30.0
STREAMING = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")


@dataclass
class JobState:
    cancelled: bool = False
    lost: bool = False  # the lease went to another gateway: stop without finishing
    expired: bool = False
    yielded: bool = False  # given back so that another key's job gets the place: stop without finishing

    @property
    def stop(self) -> bool:
        return self.cancelled or self.lost or self.expired or self.yielded


class BatchRunner:
    """See the module docstring. `app` is the whole ASGI app (its middleware included)."""

    def __init__(self, app: ASGIApp, service: BatchService, quota: QuotaService, concurrency: int,
                 running_jobs: int = MAX_JOBS) -> None:
        self.app = app
        self.service = service
        self.store = service.store
        self.quota = quota
        self.concurrency = concurrency
        self.max_jobs = running_jobs
        self.node = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.slots = FairSlots(concurrency)
        self.jobs: dict[str, asyncio.Task[None]] = {}
        self.owners: dict[str, str] = {}  # running job -> its owner, oldest first
        self.wake = asyncio.Event()
        self.states: dict[str, JobState] = {}
        service.wake = self.wake
        service.on_cancel.append(self._cancelled)
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    async def start(self) -> None:
        """The loop: it sweeps expired files, and claims jobs unless `concurrency` is 0."""
        self._task = asyncio.create_task(self._loop(), name="batch-runner")

    async def close(self) -> None:
        """Stop the loop and every job (lines in flight end unrecorded; leases are given back). The loop and the jobs
        also read `_closing`, not only the cancel: Python 3.11's `asyncio.wait_for` swallows a cancel that arrives as
        what it waits for completes (a job ending wakes the loop just as close() cancels it), and the loop would poll
        on for ever with close() waiting for it."""
        self._closing = True
        self.wake.set()
        while tasks := [t for t in (self._task, *self.jobs.values()) if t is not None and not t.done()]:
            for t in tasks:
                t.cancel()
            # gather, not one `await` per task under suppress(CancelledError): a cancel of close() itself
            # propagates. Again while any is left: a claim the loop was making may have started a job meanwhile.
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self) -> None:
        while not self._closing:
            try:
                if self.service.started():
                    await self.service.sweep(SWEEP_MOST)
                    if self.concurrency > 0:
                        await self._claim()
            except StoreUnavailableError:
                pass  # logged by the store; the next poll tries again
            except Exception:  # the loop must outlive any one failure (a file the sweep cannot unlink)
                logger.exception("the batch runner's poll failed; it polls again")
            if self._closing:
                return
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_S):  # (a cancel always propagates, as it may not from wait_for)
                    await self.wake.wait()

    async def _claim(self) -> None:
        """Take unclaimed jobs into free job slots in the fair order, or give one back for a waiting key."""
        waiting = [c for c in await self.store.candidates(CANDIDATES) if c[0] not in self.jobs]
        if not waiting:
            return
        free = self.max_jobs - len(self.jobs)
        if free <= 0:
            if any(self._yielding(j) for j in self.jobs):
                return  # one place is being given back already
            job_id = victim(self.owners, waiting)
            if job_id is not None and job_id in self.states:
                logger.info("batch %s: given back for another key's job", job_id)
                self.states[job_id].yielded = True
            return
        owner_of = dict(waiting)
        for job_id in await self.store.claim(self.node, claim_order(waiting, Counter(self.owners.values())), free):
            self.owners[job_id] = owner_of[job_id]
            task = asyncio.create_task(self._job(job_id), name=f"batch-{job_id[:16]}")
            self.jobs[job_id] = task
            task.add_done_callback(self._ended)

    def _yielding(self, job_id: str) -> bool:
        state = self.states.get(job_id)
        return state is not None and state.yielded

    def _cancelled(self, job_id: str) -> None:
        """A cancel through this process: no new line of the job starts (through another gateway: the renewal
        reads it within `RENEW_S`)."""
        state = self.states.get(job_id)
        if state is not None:
            state.cancelled = True

    def _ended(self, task: asyncio.Task[None]) -> None:
        for job_id, t in list(self.jobs.items()):
            if t is task:
                del self.jobs[job_id]
                self.owners.pop(job_id, None)
                self.wake.set()  # a place is free: claim at once

    async def _job(self, job_id: str) -> None:
        state = self.states[job_id] = JobState()
        renewer = asyncio.create_task(self._renew(job_id, state))
        running: set[asyncio.Task[None]] = set()
        try:
            rec = await self.store.get_batch(None, job_id)
            if rec is None:
                return
            state.cancelled = rec.status == "cancelling"
            checked = await self.service.validate(rec)
            if checked is None:
                logger.info("batch %s failed its input file's checks", job_id)
                return
            lines = checked
            done = await self.store.done(job_id)
            caller = self._caller(rec)
            for idx, custom_id, url, body in lines:
                if idx in done:
                    continue
                if self._stopped(rec, state):
                    break
                await self.slots.acquire(rec.owner)
                if self._stopped(rec, state):  # the wait for a slot may have been long
                    self.slots.release()
                    break
                t = asyncio.create_task(self._line(rec, idx, custom_id, url, body, caller, state))
                running.add(t)
                t.add_done_callback(running.discard)
            if running:
                await asyncio.gather(*running)
            if not state.lost and not state.yielded and not self._closing:  # closing: the next runner resumes it
                await self._finish(rec, lines, state)
        except StoreUnavailableError:
            pass  # the lease runs out; this or another gateway takes the job again
        except Exception:
            logger.exception("batch %s: the runner failed; it resumes at the next claim", job_id)
        finally:
            for t in (*running, renewer):  # a stopping gateway: lines in flight end unrecorded
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer
            self.states.pop(job_id, None)
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release(job_id, self.node))

    def _stopped(self, rec: BatchRecord, state: JobState) -> bool:
        state.expired = state.expired or self.service.clock() >= rec.data["expires_at"]
        return state.stop or self._closing

    async def _renew(self, job_id: str, state: JobState) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            try:
                status = await self.store.renew(job_id, self.node)
            except StoreUnavailableError:
                continue
            if status is None:
                state.lost = True
                return
            if status == "cancelling":
                state.cancelled = True

    def _caller(self, rec: BatchRecord) -> Caller | None:
        """The key that made the job, as it is now (None: a keys file's key that was since removed)."""
        who = rec.data.get("caller", {})
        name, digest = who.get("name", ANONYMOUS), who.get("digest", "")
        table = self.quota.table
        if table is not None and name in table.policies:
            policy = table.policies[name]
            return Caller(name, table.teams.get(name, ""), policy, table.shares.get(policy.priority, 1.0))
        if name in (API_KEY_NAME, ANONYMOUS):
            return Caller(name, key_digest=digest)
        return None

    async def _line(self, rec: BatchRecord, idx: int, custom_id: str, url: str, body: dict[str, Any],
                    caller: Caller | None, state: JobState) -> None:
        try:
            backoff = 0.1
            while True:
                status, headers, payload = await self._call(url, body, caller)
                final = status not in (429, 503) or headers.get("x-should-retry") == "false"  # a spent budget
                if final or state.stop or self.service.clock() >= rec.data["expires_at"]:
                    break
                try:
                    wait = float(headers.get("retry-after", "0"))
                except ValueError:
                    wait = 0.0
                await asyncio.sleep(min(max(wait, backoff), MAX_BACKOFF_S))
                backoff = min(backoff * 2, 5.0)
            if not final and state.stop:
                return  # not run: the cancel or expiry accounts for it
            try:
                answer: Any = json.loads(payload)
            except ValueError:
                answer = payload.decode("utf-8", "replace")
            outcome, line = result_line(rec.kind, custom_id, status, answer, headers.get("x-request-id", ""))
            await self.store.record(rec.id, idx, outcome, line)
        finally:
            self.slots.release()

    async def _call(self, url: str, body: dict[str, Any], caller: Caller | None) -> tuple[int, dict[str, str],
                                                                                           bytes]:
        """One request through the whole app, as the job's key, in the batch class."""
        if caller is None:
            msg = {"error": {"message": "The key that made this batch no longer exists.", "type":
                             "authentication_error", "param": None, "code": "invalid_api_key"}}
            return 401, {}, json.dumps(msg).encode()
        if url in STREAMING and body.get("stream"):
            body = {**body, "stream": False}  # a batch line's answer is one object
        data = json.dumps(body, separators=(",", ":")).encode()
        scope: dict[str, Any] = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": url, "raw_path": url.encode(), "root_path": "",
            "query_string": b"", "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                        (b"host", b"batch.internal")],
            "state": {INTERNAL_CALLER: caller, CALLER_KEY: caller, PRIORITY_CLASS_KEY: "batch"}}
        sent = False
        never = asyncio.Event()
        status = 500
        headers: dict[str, str] = {}
        parts: list[bytes] = []

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            await never.wait()  # the client never leaves
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers.update((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in message["headers"])
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return status, headers, b"".join(parts)

    async def _finish(self, rec: BatchRecord, lines: list[Line],
                      state: JobState) -> None:
        current = await self.store.get_batch(None, rec.id)
        state.cancelled = state.cancelled or (current is not None and current.status == "cancelling")
        final = await self.service.finish(rec, lines, cancelled=state.cancelled, expired=state.expired)
        logger.info("batch %s %s", rec.id, final)
