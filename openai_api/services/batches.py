"""The Batch API's engine, below the routes: files, jobs and their wire objects, for OpenAI's `/v1/files` +
`/v1/batches` and Anthropic's `/v1/messages/batches` alike (one job store, `stored.batches`).

Wire contract (OpenAI's `openapi.yaml`: `OpenAIFile`, `Batch`, `BatchRequestInput`/`BatchRequestOutput`;
Anthropic's Message Batches):

* an input file (purpose `batch`) is JSONL, one request per line: `{"custom_id": str, "method": "POST", "url": the
  batch's endpoint, "body": {...}}`; `custom_id`s are unique within the file. An upload larger than
  `--batch-max-file-bytes` is a 400; its lines are checked once a batch is made on it (`services.batch_input`): a
  bad line, or more than `--batch-max-lines` lines, makes the batch `failed` with `errors` naming the lines;
* a job answers each line once: the output file (`output_file_id`) holds the 2xx answers, the error file
  (`error_file_id`) the others, each `{"id", "custom_id", "response": {"status_code", "request_id", "body"},
  "error"}`, in input order; Anthropic's results are `{"custom_id", "result": {"type": "succeeded", "message"} |
  {"type": "errored", "error"} | {"type": "canceled"} | {"type": "expired"}}`;
* statuses: `validating` -> `in_progress` -> `finalizing` -> `completed`, or `validating` -> `failed`, or
  `cancelling` -> `cancelled`, or
  `expired` past `expires_at` (24 h); Anthropic's `processing_status` is `in_progress`, `canceling` or `ended`.

Everything is owned by the key that made it: another key's id is the same 404 as an id never issued.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from openai_api.errors import InvalidRequestError, NotFoundError
from openai_api.services.batch_input import Line, batch_error, check_input
from openai_api.settings import Settings
from openai_api.stored.base import new_id
from openai_api.stored.batches import (
    ACTIVE,
    CANCELED,
    ERRORED,
    EXPIRED,
    SUCCEEDED,
    BatchRecord,
    BatchStore,
    FileRecord,
    default_batch_dir,
    iter_lines,
)

__all__ = ["BatchRecord", "BatchService", "Line", "result_line"]

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
MESSAGES = "/v1/messages"
WINDOW_S = 24 * 3600
FILE_PURPOSES = ("batch",)
OUTPUT_PURPOSE = "batch_output"
# The input of an Anthropic job: kept as a file like OpenAI's, never shown by /v1/files.
INTERNAL_PURPOSE = "messages_batch_input"
MAX_METADATA = 16
# Files' expiry (`expires_after` on upload, a batch's `output_expires_after`): OpenAI's bounds, and its default for
# batch files (30 days); an expired file is a 404 at once and deleted by the runner's sweep.
MIN_TTL_S, MAX_TTL_S = 3600, 30 * 86400
FILE_TTL_S = MAX_TTL_S
ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
TERMINAL = ("completed", "failed", "expired", "cancelled")


class BatchService:
    """Files and jobs of one store, with the bounds of the settings (module docstring)."""

    def __init__(self, store: BatchStore, *, max_file_bytes: int, max_lines: int, max_jobs: int) -> None:
        self.store = store
        self.max_file_bytes = max_file_bytes
        self.max_lines = max_lines
        self.max_jobs = max_jobs
        self.wake: asyncio.Event | None = None  # set when a job is made or cancelled (the runner's poll)
        self.on_cancel: list[Callable[[str], None]] = []  # told of each cancel made through this process
        self.clock: Callable[[], float] = time.time  # what "now" is for expiry (a test's own clock)

    @classmethod
    def from_settings(cls, settings: Settings) -> BatchService:
        """Over the SQLite store in `--batch-dir`, which opens on first use (a gateway nobody sends batches
        makes nothing on disk), or with `--batch-store-url` over Redis (files still in `--batch-dir`)."""
        folder = settings.batch_dir or default_batch_dir()
        store = BatchStore(folder)
        if settings.batch_store_url:
            from openai_api.stored.batches_redis import RedisBatchStore  # its client only where used

            store = RedisBatchStore(settings.batch_store_url, folder)
        return cls(store, max_file_bytes=settings.batch_max_file_bytes, max_lines=settings.batch_max_lines,
                   max_jobs=settings.batch_max_jobs_per_key)

    def started(self) -> bool:
        """Whether the store exists yet (the runner polls nothing before)."""
        return self.store.exists()

    async def finish(self, rec: BatchRecord, lines: list[Line], *, cancelled: bool,
                     expired: bool) -> str:
        """End a job whose lines are all answered (or that was cancelled or expired): the results of lines never
        run (Anthropic), the output and error files (OpenAI), the final status, which it returns."""
        now = int(self.clock())
        final, field = ("cancelled", "cancelled_at") if cancelled else ("expired", "expired_at") if expired \
            else ("completed", "completed_at")
        fields: dict[str, Any] = {field: now, "ended_at": now}
        if (rec.kind == "anthropic" and final != "completed") or (rec.kind == "openai" and final == "expired"):
            # OpenAI: an expired job's unrun lines go to its error file (`batch_expired`); a cancelled one's do not
            done = await self.store.done(rec.id)
            outcome = CANCELED if cancelled else EXPIRED
            for idx, custom_id, _, _ in lines:
                if idx not in done:
                    await self.store.record(rec.id, idx, outcome, unanswered_line(rec.kind, custom_id, outcome))
        if rec.kind == "openai":
            await self.store.update(rec.id, "finalizing" if final == "completed" else None, {"finalizing_at": now})
            ttl = int(rec.data.get("output_ttl_s", FILE_TTL_S))
            for which, key in (((SUCCEEDED,), "output_file_id"), ((ERRORED, EXPIRED), "error_file_id")):
                answers = await self.store.results(rec.id, which)
                if answers:
                    content = "".join(a + "\n" for a in answers).encode()
                    file = FileRecord(new_id("file-"), rec.owner, OUTPUT_PURPOSE,
                                      f"{rec.id}_{'output' if key == 'output_file_id' else 'error'}.jsonl",
                                      len(content), len(answers), now, now + ttl)
                    await self.store.put_file(file, content)
                    fields[key] = file.id
        await self.store.update(rec.id, final, fields)
        return final

    async def validate(self, rec: BatchRecord) -> list[Line] | None:
        """The lines of a job's input file, the job moved from `validating` to `in_progress`; None when the file
        fails the checks (`services.batch_input`): the job is then `failed`, its `errors` naming the lines.

        Read again each time a runner takes the job up (a restart resumes it here). The file's `expires_at` does
        not matter: it was live when the job was made, and an unfinished job's input is never swept (pinned,
        `BatchStore.expired_files`; its owner's delete expires it instead, `delete_file`) - a job keeps its input
        for its life, as OpenAI's do; the pin is taken as the job is made, where the file is checked again
        (`BatchStore.create_batch`). A file missing all the same (a store made before the pins) fails the job
        (`file_not_found`)."""
        now = int(self.clock())
        source = await self.store.get_file(rec.owner, rec.data["input_file_id"])
        lines: list[Line] = []
        if source is None:
            errors = [batch_error("file_not_found", "The input file was deleted before the batch could read it.",
                                  "input_file_id")]
        else:
            content = await self.store.read(source.id)
            lines, errors = await asyncio.to_thread(check_input, content, rec.data["endpoint"], self.max_lines)
        if errors:
            await self.store.update(rec.id, "failed", {"errors": {"object": "list", "data": errors}, "failed_at": now,
                                                       "ended_at": now}, only_if=ACTIVE)
            return None
        if rec.status == "validating":
            await self.store.update(rec.id, "in_progress", {"in_progress_at": now}, only_if=("validating",))
        return lines

    async def sweep(self, most: int) -> int:
        """Delete up to `most` expired files (the longest expired first): how many (the runner's loop, each tick)."""
        gone = 0
        now = int(self.clock())
        for file_id, owner in await self.store.expired_files(now, most):
            gone += await self.store.sweep_file(owner, file_id, now)  # unless a job pinned it since the listing
        return gone

    def _live(self, rec: FileRecord) -> bool:
        return rec.expires_at is None or rec.expires_at > self.clock()

    def _poke(self) -> None:
        if self.wake is not None:
            self.wake.set()

    # --- files ------------------------------------------------------------------------------------------------
    @staticmethod
    def file_object(rec: FileRecord) -> dict[str, Any]:
        obj = {"id": rec.id, "object": "file", "bytes": rec.bytes, "created_at": rec.created_at,
               "expires_at": rec.expires_at, "filename": rec.filename, "purpose": rec.purpose, "status": "processed"}
        return {k: v for k, v in obj.items() if v is not None}

    async def upload(self, owner: str, filename: str, purpose: str, content: bytes,
                     expires_after: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A `file` object; `expires_after` ({anchor: "created_at", seconds}: 3600 to 2592000) sets its
        `expires_at` (default 30 days, as OpenAI's batch files)."""
        ttl = ttl_s(expires_after, "expires_after")
        if purpose not in FILE_PURPOSES:
            raise InvalidRequestError(f"purpose {purpose!r} is not supported here; this server takes 'batch' files.",
                                      param="purpose", code="invalid_purpose")
        if len(content) > self.max_file_bytes:
            raise InvalidRequestError(f"The file has {len(content)} bytes; this server takes at most "
                                      f"{self.max_file_bytes}.", param="file", code="file_too_large")
        lines = await asyncio.to_thread(_count_lines, content)
        now = int(self.clock())
        rec = FileRecord(new_id("file-"), owner, purpose, filename[:255] or "upload.jsonl", len(content), lines, now,
                         now + ttl)
        await self.store.put_file(rec, content)
        return self.file_object(rec)

    async def file(self, owner: str, file_id: str) -> FileRecord:
        rec = await self.store.get_file(owner, file_id)
        if rec is None or rec.purpose == INTERNAL_PURPOSE or not self._live(rec):
            raise NotFoundError(f"No such File object: {file_id}", param="id")
        return rec

    async def list_files(self, owner: str, purpose: str | None, limit: int, after: str | None) -> dict[str, Any]:
        recs = [r for r in await self.store.list_files(owner, purpose, 10_000)
                if r.purpose != INTERNAL_PURPOSE and self._live(r)]
        return _page([self.file_object(r) for r in recs], limit, after)

    async def content(self, owner: str, file_id: str) -> bytes:
        return await self.store.read((await self.file(owner, file_id)).id)

    async def delete_file(self, owner: str, file_id: str) -> dict[str, Any]:
        """Gone for its owner at once; an unfinished batch's input keeps its bytes until that batch ends
        (`BatchStore.retire_file`), so the batch still resumes after a restart."""
        await self.file(owner, file_id)
        await self.store.retire_file(owner, file_id, int(self.clock()))
        return {"id": file_id, "object": "file", "deleted": True}

    # --- jobs -------------------------------------------------------------------------------------------------
    async def create(self, owner: str, input_file_id: str, endpoint: str, window: str,
                     metadata: Mapping[str, str] | None, caller: Mapping[str, str],
                     output_expires_after: Mapping[str, Any] | None = None) -> dict[str, Any]:
        if endpoint not in ENDPOINTS:
            raise InvalidRequestError(f"endpoint must be one of {', '.join(ENDPOINTS)}.", param="endpoint",
                                      code="invalid_endpoint")
        if window != "24h":
            raise InvalidRequestError("completion_window must be '24h'.", param="completion_window")
        _check_metadata(metadata)
        ttl = ttl_s(output_expires_after, "output_expires_after")
        rec = await self.store.get_file(owner, input_file_id)
        if rec is None or rec.purpose == INTERNAL_PURPOSE or not self._live(rec):
            raise NotFoundError(f"No such File object: {input_file_id}", param="input_file_id")
        if rec.purpose != "batch":
            raise InvalidRequestError("The input file's purpose must be 'batch'.", param="input_file_id")
        job = await self._create_job("openai", new_id("batch_"), owner, rec.id, endpoint, rec.lines,
                                     dict(metadata or {}), caller, {"output_ttl_s": ttl})
        return await self.batch_object(job)

    async def _create_job(self, kind: str, job_id: str, owner: str, file_id: str, endpoint: str, total: int,
                          metadata: dict[str, str], caller: Mapping[str, str],
                          extra: Mapping[str, Any] | None = None) -> BatchRecord:
        now = int(self.clock())
        data: dict[str, Any] = {"endpoint": endpoint, "input_file_id": file_id, "total": total,
                                "metadata": metadata, "expires_at": now + WINDOW_S, "caller": dict(caller),
                                **(extra or {})}
        job = BatchRecord(job_id, owner, kind, "validating", now, data)
        made = await self.store.create_batch(job, self.max_jobs, self.clock())
        if made == "no_file":  # deleted or expired (and perhaps swept) since the caller looked it up
            raise NotFoundError(f"No such File object: {file_id}", param="input_file_id")
        if made == "too_many":
            raise InvalidRequestError(f"This key has {self.max_jobs} unfinished batches, this server's limit; "
                                      "wait for one to end or cancel one.", code="too_many_batches")
        self._poke()
        return job

    async def job(self, owner: str, job_id: str, kind: str) -> BatchRecord:
        rec = await self.store.get_batch(owner, job_id)
        if rec is None or rec.kind != kind:
            what = "Batch" if kind == "openai" else "message batch"
            raise NotFoundError(f"No such {what}: {job_id}", param="id")
        return rec

    async def batch_object(self, rec: BatchRecord) -> dict[str, Any]:
        counts = await self.store.counts(rec.id)
        d = rec.data
        # Fields not set yet are left out, as OpenAI's description (none of them nullable) has it.
        obj = {"id": rec.id, "object": "batch", "endpoint": d["endpoint"], "errors": d.get("errors"),
                "input_file_id": d["input_file_id"], "completion_window": "24h", "status": rec.status,
                "output_file_id": d.get("output_file_id"), "error_file_id": d.get("error_file_id"),
                "created_at": rec.created_at, "in_progress_at": d.get("in_progress_at"),
                "expires_at": d["expires_at"], "finalizing_at": d.get("finalizing_at"),
                "completed_at": d.get("completed_at"), "failed_at": d.get("failed_at"),
                "expired_at": d.get("expired_at"), "cancelling_at": d.get("cancelling_at"),
                "cancelled_at": d.get("cancelled_at"),
                "request_counts": {"total": d["total"], "completed": counts.get(SUCCEEDED, 0),
                                   "failed": counts.get(ERRORED, 0) + counts.get(EXPIRED, 0)},
                "metadata": d.get("metadata") or None}
        return {k: v for k, v in obj.items() if v is not None or k == "metadata"}

    async def list_batches(self, owner: str, kind: str, limit: int, after: str | None) -> dict[str, Any]:
        recs = await self.store.list_batches(owner, kind, 10_000)
        shape = self.batch_object if kind == "openai" else self.message_batch_object
        page = _page([{"id": r.id, "rec": r} for r in recs], limit, after)
        page["data"] = [await shape(x["rec"]) for x in page["data"]]
        return page

    async def cancel(self, owner: str, job_id: str, kind: str) -> BatchRecord:
        rec = await self.job(owner, job_id, kind)
        now = int(self.clock())
        field = "cancelling_at" if kind == "openai" else "cancel_initiated_at"
        done = await self.store.update(rec.id, "cancelling", {field: now}, only_if=("validating", "in_progress"))
        for listener in self.on_cancel:
            listener(rec.id)
        self._poke()
        return done or rec

    # --- Anthropic --------------------------------------------------------------------------------------------
    async def create_messages(self, owner: str, requests: Any, caller: Mapping[str, str]) -> dict[str, Any]:
        content = await asyncio.to_thread(self._messages_jsonl, requests)
        job_id = new_id("msgbatch_")
        rec = FileRecord(new_id("file-"), owner, INTERNAL_PURPOSE, f"{job_id}.jsonl", len(content),
                         len(requests), int(self.clock()))
        await self.store.put_file(rec, content)
        job = await self._create_job("anthropic", job_id, owner, rec.id, MESSAGES, rec.lines, {}, caller)
        return await self.message_batch_object(job)

    def _messages_jsonl(self, requests: Any) -> bytes:
        if not isinstance(requests, list) or not requests:
            raise InvalidRequestError("requests: a non-empty list of {custom_id, params} is required.",
                                      param="requests")
        if len(requests) > self.max_lines:
            raise InvalidRequestError(f"requests: at most {self.max_lines} per batch on this server.",
                                      param="requests")
        seen: set[str] = set()
        out: list[bytes] = []
        for i, r in enumerate(requests):
            if not isinstance(r, dict) or set(r) - {"custom_id", "params"}:
                raise InvalidRequestError(f"requests.{i}: an object with custom_id and params.",
                                          param=f"requests.{i}")
            cid, params = r.get("custom_id"), r.get("params")
            if not isinstance(cid, str) or not ANTHROPIC_ID.match(cid):
                raise InvalidRequestError(f"requests.{i}.custom_id: 1 to 64 letters, digits, '_' or '-'.",
                                          param=f"requests.{i}.custom_id")
            if cid in seen:
                raise InvalidRequestError(f"requests.{i}.custom_id: {cid!r} appears twice.",
                                          param=f"requests.{i}.custom_id")
            seen.add(cid)
            if not isinstance(params, dict):
                raise InvalidRequestError(f"requests.{i}.params: an object is required.",
                                          param=f"requests.{i}.params")
            out.append(json.dumps({"custom_id": cid, "method": "POST", "url": MESSAGES, "body": params},
                                  separators=(",", ":")).encode())
        data = b"\n".join(out) + b"\n"
        if len(data) > self.max_file_bytes:
            raise InvalidRequestError(f"The batch's requests take {len(data)} bytes; this server takes at most "
                                      f"{self.max_file_bytes}.", param="requests")
        return data

    async def message_batch_object(self, rec: BatchRecord, base_url: str = "") -> dict[str, Any]:
        counts = await self.store.counts(rec.id)
        d = rec.data
        ended = rec.status in TERMINAL
        answered = sum(counts.values())
        return {"id": rec.id, "type": "message_batch",
                "processing_status": "ended" if ended else "canceling" if rec.status == "cancelling"
                else "in_progress",
                "request_counts": {"processing": 0 if ended else d["total"] - answered,
                                   "succeeded": counts.get(SUCCEEDED, 0), "errored": counts.get(ERRORED, 0),
                                   "canceled": counts.get(CANCELED, 0), "expired": counts.get(EXPIRED, 0)},
                "ended_at": _iso(d.get("ended_at")), "created_at": _iso(rec.created_at),
                "expires_at": _iso(d["expires_at"]), "archived_at": None,
                "cancel_initiated_at": _iso(d.get("cancel_initiated_at")),
                "results_url": f"{base_url}/v1/messages/batches/{rec.id}/results" if ended else None}

    async def delete_message_batch(self, owner: str, job_id: str) -> dict[str, Any]:
        """Forget an ended message batch, its results and its input; a 400 while it is still processing."""
        rec = await self.job(owner, job_id, "anthropic")
        if rec.status not in TERMINAL:
            raise InvalidRequestError(f"Message batch {job_id} is still processing; cancel it, and delete it once "
                                      "it has ended.")
        await self.store.delete_batch(owner, rec.id)
        await self.store.delete_file(owner, rec.data["input_file_id"])
        return {"id": rec.id, "type": "message_batch_deleted"}

    async def message_results(self, owner: str, job_id: str) -> bytes:
        rec = await self.job(owner, job_id, "anthropic")
        if rec.status not in TERMINAL:
            raise InvalidRequestError(f"Message batch {job_id} has not ended; its results are not ready.")
        lines = await self.store.results(rec.id)
        return "".join(line + "\n" for line in lines).encode()


# --- the lines' answers, as the runner records them -------------------------------------------------------------
def result_line(kind: str, custom_id: str, status: int, body: Any, request_id: str) -> tuple[int, str]:
    """(outcome, JSONL line) of one answered request."""
    ok = 200 <= status < 300
    if kind == "anthropic":
        result: dict[str, Any] = {"type": "succeeded", "message": body} if ok else {
            "type": "errored", "error": body if isinstance(body, dict) else {
                "type": "error", "error": {"type": "api_error", "message": str(body)}}}
        line: dict[str, Any] = {"custom_id": custom_id, "result": result}
    else:
        line = {"id": new_id("batch_req_"), "custom_id": custom_id,
                "response": {"status_code": status, "request_id": request_id, "body": body}, "error": None}
    return (SUCCEEDED if ok else ERRORED), json.dumps(line, separators=(",", ":"))


def unanswered_line(kind: str, custom_id: str, outcome: int) -> str:
    """The result of a line a cancelled or expired job never ran."""
    if kind == "anthropic":
        return json.dumps({"custom_id": custom_id, "result": {"type": "canceled" if outcome == CANCELED
                                                              else "expired"}})
    code = "batch_cancelled" if outcome == CANCELED else "batch_expired"
    return json.dumps({"id": new_id("batch_req_"), "custom_id": custom_id, "response": None,
                       "error": {"code": code, "message": "This request was not run: the batch "
                                 + ("was cancelled." if outcome == CANCELED else "expired.")}})


def active(status: str) -> bool:
    return status in ACTIVE


def ttl_s(value: Mapping[str, Any] | None, param: str) -> int:
    """The seconds of an `expires_after`-like object ({anchor: "created_at", seconds}); the default without one."""
    if value is None:
        return FILE_TTL_S
    seconds = value.get("seconds")
    if value.get("anchor") != "created_at" or set(value) - {"anchor", "seconds"} or isinstance(seconds, bool) or \
            not isinstance(seconds, int) or not MIN_TTL_S <= seconds <= MAX_TTL_S:
        raise InvalidRequestError(f"{param} must be {{\"anchor\": \"created_at\", \"seconds\": N}} with N from "
                                  f"{MIN_TTL_S} to {MAX_TTL_S}.", param=param)
    return seconds


def _count_lines(content: bytes) -> int:
    return sum(1 for _ in iter_lines(content))


def _check_metadata(metadata: Mapping[str, Any] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA or any(not isinstance(k, str) or len(k) > 64 or not isinstance(v, str)
                                           or len(v) > 512 for k, v in metadata.items()):
        raise InvalidRequestError("metadata: at most 16 string pairs, keys up to 64 and values up to 512 "
                                  "characters.", param="metadata")


def _page(items: list[dict[str, Any]], limit: int, after: str | None) -> dict[str, Any]:
    """OpenAI's cursor page over `items` (newest first): those after the id `after`, at most `limit`."""
    if after is not None:
        ids = [x["id"] for x in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
