"""The Batch API and the priority scheduler end to end (issue #39): real gateways (uvicorn in a thread, the way a
user runs them) in front of the session's Triton, driven by the real `openai` and `anthropic` SDKs.

Proven here: `files.create` (with `expires_after`) + `batches.create` (with `output_expires_after`) + polling +
`files.content`, a batch whose input file has a bad line ending `failed` with the line named, and Anthropic's
`messages.batches.create/retrieve/results`; a gateway stopped in the middle of a job and a new one started on the
same batch folder (every line answered exactly once, in order); two gateways sharing one store (Redis and a files
folder: a job made through one that runs no jobs is run by the other); a job cancelled half-way (its answers so far in
its output file, the rest never run); and interactive requests admitted at once while a batch holds its share of
the model's slots and more of its lines wait in the queue, and reach Triton with the priorities their classes map
to (the paced model declares priority levels: Triton's own record of each request's priority, its verbose log, shows
the batch's lines at the lowest level, 3, and the interactive requests at the highest, 1). Lines run on the paced
synthetic LLM (50 ms a token), so a job takes a known few seconds whatever the machine's load. The oracle is what
the test sent: its custom ids and request ids.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from openai_api.config import load_config
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.e2e.conftest import PACED, GatewayServer
from tests.e2e.test_keys_quotas import RedisServer
from tests.e2e.test_reliability_observability import metric
from tests.helpers import MODELS, requires_models

pytestmark = requires_models("smollm2-135m-instruct")

KEY = "batch-test-key"
PACED_NAME, FAST = "paced", "synthetic-llm"
TEMPLATE = ("{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
            "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
PER_MODEL = 4  # in-flight slots per model; the batch class may hold half


def start_gateway(triton: EmbeddedTriton, folder: Path, **settings: Any) -> GatewayServer:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "chat.jinja").write_text(TEMPLATE, encoding="utf-8")
    llm = [{"name": name, "url": triton.grpc_url, "path": str(MODELS / "smollm2-135m-instruct"),
            "triton_model": model, "chat_template": str(folder / "chat.jinja")}
           for name, model in ((PACED_NAME, PACED), (FAST, FAST))]
    path = folder / "model_config.json"
    path.write_text(json.dumps({"model_infos": [{"name": e["name"], "end_id": -1, "max_len": 8192} for e in llm],
                                "llm": llm}), encoding="utf-8")
    config = load_config(path)
    values: dict[str, Any] = {"config_file": path, "api_keys": [KEY], "batch_dir": folder.parent / "batches",
                              "max_in_flight_per_model": PER_MODEL, "batch_slot_share": 0.5,
                              "max_queue_per_model": 64, "batch_concurrency": 8, **settings}
    return GatewayServer(config, [KEY], Settings(**values)).start()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batches-e2e")


@pytest.fixture(scope="module")
def gw(triton: EmbeddedTriton, folder: Path) -> Iterator[GatewayServer]:
    server = start_gateway(triton, folder / "main")
    yield server
    server.stop()


def lines(n: int, model: str, tokens: int, url: str = "/v1/chat/completions") -> bytes:
    return b"".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": url, "body": {
        "model": model, "messages": [{"role": "user", "content": f"say {i}"}], "max_tokens": tokens}}).encode()
        + b"\n" for i in range(n))


def poll(fetch: Callable[[], Any], done: Callable[[Any], bool], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fetch()
        if done(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_openai_sdk_batch(gw: GatewayServer) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY)
    made = client.files.create(file=("in.jsonl", lines(6, FAST, 8)), purpose="batch",
                               expires_after={"anchor": "created_at", "seconds": 3600})
    assert made.purpose == "batch" and made.bytes == len(lines(6, FAST, 8))
    assert made.expires_at == made.created_at + 3600
    batch = client.batches.create(input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"suite": "e2e"},
                                  output_expires_after={"anchor": "created_at", "seconds": 7200})
    assert batch.status == "validating" and batch.request_counts and batch.request_counts.total == 6
    # A file with a bad line: taken at upload, its batch then `failed` with the line named, as on OpenAI.
    bad = client.files.create(file=("bad.jsonl", lines(1, FAST, 8) + b"not json\n"), purpose="batch")
    failing = client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
    assert done.status == "completed" and done.request_counts.completed == 6 and done.output_file_id
    assert done.metadata == {"suite": "e2e"} and done.error_file_id is None
    output = client.files.retrieve(done.output_file_id)
    assert output.purpose == "batch_output" and output.expires_at == output.created_at + 7200
    failed = poll(lambda: client.batches.retrieve(failing.id), lambda b: b.status == "failed")
    assert failed.status == "failed" and failed.failed_at and failed.errors and failed.errors.data
    assert [(e.code, e.line) for e in failed.errors.data] == [("invalid_json_line", 2)]
    out = [json.loads(x) for x in client.files.content(done.output_file_id).content.splitlines()]
    assert [x["custom_id"] for x in out] == [f"line-{i}" for i in range(6)]
    for x in out:
        completion = openai.types.chat.ChatCompletion.model_validate(x["response"]["body"])
        assert x["response"]["status_code"] == 200 and completion.usage and completion.usage.completion_tokens == 8
    assert batch.id in [b.id for b in client.batches.list()]
    assert client.files.delete(made.id).deleted


def test_anthropic_sdk_message_batch(gw: GatewayServer) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key=KEY)
    made = client.messages.batches.create(requests=[
        {"custom_id": f"m{i}", "params": {"model": FAST, "max_tokens": 6,
                                          "messages": [{"role": "user", "content": f"hi {i}"}]}} for i in range(4)])
    assert made.type == "message_batch" and made.processing_status == "in_progress"
    done = poll(lambda: client.messages.batches.retrieve(made.id), lambda b: b.processing_status == "ended")
    assert done.processing_status == "ended" and done.request_counts.succeeded == 4 and done.results_url
    results = list(client.messages.batches.results(made.id))
    assert [r.custom_id for r in results] == [f"m{i}" for i in range(4)]
    for r in results:
        assert r.result.type == "succeeded" and r.result.message.usage.output_tokens == 6
    assert made.id in [b.id for b in client.messages.batches.list()]


def test_restart_mid_job_answers_each_line_once(triton: EmbeddedTriton, folder: Path) -> None:
    first = start_gateway(triton, folder / "restart-a", batch_concurrency=2)
    stopped = False
    try:
        client = openai.OpenAI(base_url=first.url + "/v1", api_key=KEY)
        made = client.files.create(file=("in.jsonl", lines(10, PACED_NAME, 8)), purpose="batch")  # 0.4 s a line
        batch = client.batches.create(input_file_id=made.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        mid = poll(lambda: client.batches.retrieve(batch.id), lambda b: b.request_counts.completed >= 3)
        assert mid.request_counts.completed < 10
        first.stop()  # the gateway goes, with lines in flight
        stopped = True
    finally:
        if not stopped:
            first.stop()
    second = start_gateway(triton, folder / "restart-b", batch_concurrency=4)  # same batch folder
    try:
        client = openai.OpenAI(base_url=second.url + "/v1", api_key=KEY)
        done = poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
        assert done.status == "completed" and done.request_counts.completed == 10
        out = [json.loads(x)["custom_id"] for x in client.files.content(done.output_file_id).content.splitlines()]
        assert out == [f"line-{i}" for i in range(10)]  # each once, in order
    finally:
        second.stop()


def test_cancel_half_way(gw: GatewayServer) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY)
    made = client.files.create(file=("in.jsonl", lines(12, PACED_NAME, 10)), purpose="batch")
    batch = client.batches.create(input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h")
    poll(lambda: client.batches.retrieve(batch.id), lambda b: b.request_counts.completed >= 2)
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "cancelled")
    assert done.status == "cancelled" and done.cancelled_at
    completed = done.request_counts.completed
    assert 2 <= completed < 12
    out = client.files.content(done.output_file_id).content.splitlines()
    assert len(out) == completed


# Triton's verbose log line for each request it takes in (`InferenceRequest::PrepareForInference`): the request's id
# (the gateway's x-request-id), its model and the priority it carries into the model's scheduler queue.
_PREPARED = re.compile(r"\] prepared: \[[^]]*\] request id: ([^,]*), model: ([^,]*), .*?, priority: (\d+),")


@contextlib.contextmanager
def triton_priorities(triton: EmbeddedTriton, model: str) -> Iterator[dict[str, int]]:
    """Request id -> the priority Triton took it at, for the requests to `model` inside the block (filled when it
    ends): Triton's verbose log, switched on for the block through its logging API (runtime, no restart)."""
    base = triton.http_url if "://" in triton.http_url else "http://" + triton.http_url
    log = triton.log_path
    assert log is not None
    start = log.stat().st_size
    found: dict[str, int] = {}
    assert httpx.post(base + "/v2/logging", json={"log_verbose_level": 1}).status_code == 200
    try:
        yield found
    finally:
        httpx.post(base + "/v2/logging", json={"log_verbose_level": 0})
        with open(log, "rb") as fh:
            fh.seek(start)
            text = fh.read().decode("utf-8", "replace")
        found.update((rid, int(level)) for rid, name, level in _PREPARED.findall(text) if name == model)


def test_interactive_gets_through_while_batch_holds_its_share(gw: GatewayServer, triton: EmbeddedTriton) -> None:
    with triton_priorities(triton, PACED) as taken:
        batch, interactive = _interactive_beside_a_batch(gw)
    # Triton's priority (synthetic-llm-paced: priority_levels 3): the batch's lines at 3, its lowest; interactive 1.
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY)
    done = client.batches.retrieve(batch)
    ran = [json.loads(x)["response"]["request_id"] for x in client.files.content(done.output_file_id).content
           .splitlines()] if done.output_file_id else []
    assert {rid: taken.get(rid) for rid in interactive} == dict.fromkeys(interactive, 1), taken
    assert {rid: taken.get(rid) for rid in ran} == dict.fromkeys(ran, 3), taken
    others = {rid: level for rid, level in taken.items() if rid not in interactive}
    assert len(others) >= PER_MODEL // 2 and set(others.values()) == {3}, taken  # every line, done or cut


def _interactive_beside_a_batch(gw: GatewayServer) -> tuple[str, list[str]]:
    """The batch's id and the interactive requests' ids."""
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY)
    made = client.files.create(file=("in.jsonl", lines(8, PACED_NAME, 40)), purpose="batch")  # 2 s a line
    batch = client.batches.create(input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h")
    headers = {"Authorization": f"Bearer {KEY}"}
    ids = [f"interactive-{i}-{time.monotonic_ns()}" for i in range(PER_MODEL // 2)]

    def batch_in_flight() -> float:
        return metric(httpx.get(gw.url + "/metrics", headers=headers).text, "openai_api_model_requests_in_flight",
                      model=PACED_NAME)

    assert poll(batch_in_flight, lambda n: n >= PER_MODEL // 2, timeout=20) == PER_MODEL // 2
    seen: list[float] = []
    statuses: list[int] = []

    def interactive(request_id: str) -> None:
        with httpx.stream("POST", gw.url + "/v1/chat/completions", headers={**headers, "x-request-id": request_id},
                          timeout=30, json={
                "model": PACED_NAME, "messages": [{"role": "user", "content": "now"}], "max_tokens": 20,
                "stream": True, "service_tier": "priority"}) as r:
            statuses.append(r.status_code)
            for _ in r.iter_lines():
                pass

    threads = [threading.Thread(target=interactive, args=(rid,)) for rid in ids]
    for t in threads:
        t.start()
    seen.append(poll(batch_in_flight, lambda n: n >= PER_MODEL, timeout=10))
    for t in threads:
        t.join()
    # Both interactive streams ran beside the batch's 2 lines (every slot taken), while 6 batch lines waited.
    assert statuses == [200] * (PER_MODEL // 2) and seen == [PER_MODEL]
    state = client.batches.retrieve(batch.id)
    assert state.request_counts.completed < 8
    client.batches.cancel(batch.id)
    poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "cancelled")
    return batch.id, ids


def test_two_gateways_share_one_store(triton: EmbeddedTriton, folder: Path) -> None:
    (folder / "redis").mkdir()
    redis = RedisServer(folder / "redis").start()
    shared = {"batch_store_url": redis.url, "batch_dir": folder / "shared-files"}
    front = start_gateway(triton, folder / "front", batch_concurrency=0, **shared)  # takes jobs, runs none
    worker = start_gateway(triton, folder / "worker", batch_concurrency=4, **shared)
    try:
        client = openai.OpenAI(base_url=front.url + "/v1", api_key=KEY)
        made = client.files.create(file=("in.jsonl", lines(6, FAST, 4)), purpose="batch")
        batch = client.batches.create(input_file_id=made.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        done = poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
        assert done.status == "completed" and done.request_counts.completed == 6
        out = [json.loads(x)["custom_id"] for x in client.files.content(done.output_file_id).content.splitlines()]
        assert out == [f"line-{i}" for i in range(6)]
        other = openai.OpenAI(base_url=worker.url + "/v1", api_key=KEY)
        assert other.batches.retrieve(batch.id).status == "completed"  # one job, seen alike through both
    finally:
        front.stop()
        worker.stop()
        redis.kill()


def test_one_batch_start_at_a_time_still_overlaps_the_lines(triton: EmbeddedTriton, folder: Path) -> None:
    """--batch-prefills-per-model 1 through the real tritonserver: a line's next one starts at its first token
    (the line is a whole answer, so the gateway asks Triton for per-token responses to see it), not at its end -
    the job's lines still fill the batch class's 2 slots while each takes ~2 s."""
    server = start_gateway(triton, folder / "starts", batch_prefills_per_model=1)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY)
        made = client.files.create(file=("in.jsonl", lines(4, PACED_NAME, 40)), purpose="batch")  # 2 s a line
        batch = client.batches.create(input_file_id=made.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        headers = {"Authorization": f"Bearer {KEY}"}

        def in_flight() -> float:
            return metric(httpx.get(server.url + "/metrics", headers=headers).text,
                          "openai_api_model_requests_in_flight", model=PACED_NAME)

        assert poll(in_flight, lambda n: n >= PER_MODEL // 2, timeout=20) == PER_MODEL // 2
        done = poll(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
        assert done.request_counts is not None and done.request_counts.completed == 4
        assert done.output_file_id is not None
        out = [json.loads(x) for x in client.files.content(done.output_file_id).content.splitlines()]
        assert [x["response"]["body"]["usage"]["completion_tokens"] for x in out] == [40] * 4
    finally:
        server.stop()
