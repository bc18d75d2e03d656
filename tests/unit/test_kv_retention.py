"""Anthropic `cache_control` -> TensorRT-LLM KV-cache retention (`services.retention`): breakpoints become token
ranges ending where their blocks end in the prompt's own tokens, the prompt itself never changes, a backend
without the retention inputs is sent none, and bad or too many breakpoints are Anthropic's 400.

The oracle for a range's end is SmolLM2's tokenizer (`tokenizers`, not the gateway's) over the prompt's prefix
written out by hand in the ChatML the model's template renders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from tokenizers import Tokenizer

from openai_api.app import create_app
from openai_api.services.retention import MARK_START, mark_block, retained_ranges, strip_marks, token_offset
from openai_api.settings import Settings
from openai_api.text.templates import ChatTemplate
from openai_api.triton.llm import GenerationRequest, RetainedRange
from openai_api.triton.tensorrt_llm import RETENTION_PRIORITY, TensorRTLLMAdapter
from tests.unit.fakes import MODEL, FakeBackend, llm_only_config, script
from tests.unit.test_protocol_adapters import TRTLLM_CONFIG, FakeClient, make, sent, tensor

SYSTEM = "You answer questions about the store room. The red box holds 12 marbles."
QUESTION = "How many marbles are in the red box?"
HOUR, FIVE_MINUTES = 3_600_000, 300_000


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    return create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    config = llm_only_config(tmp_path_factory.mktemp("cfg"))
    return Tokenizer.from_file(str(Path(config.llm[0].path) / "tokenizer.json"))


def count(tok: Tokenizer, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False).ids)


async def messages(app: FastAPI, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, **body})


def marked(ttl: str | None = None) -> dict[str, Any]:
    return {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}


async def test_breakpoints_become_ranges_that_end_where_their_blocks_end(app: FastAPI, tokenizer: Tokenizer) -> None:
    fake = script(app, "Twelve.")
    r = await messages(app, {
        "system": [{"type": "text", "text": SYSTEM, "cache_control": marked("1h")}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION, "cache_control": marked()}]}]})
    assert r.status_code == 200, r.text
    system_end = count(tokenizer, f"<|im_start|>system\n{SYSTEM}")
    question_end = count(tokenizer, f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{QUESTION}")
    [sent_req] = fake.requests
    assert sent_req.retention == (RetainedRange(0, system_end, HOUR), RetainedRange(system_end, question_end,
                                                                                    FIVE_MINUTES))
    whole = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n"
             "<|im_start|>assistant\n")
    assert sent_req.prompt_ids == tokenizer.encode(whole, add_special_tokens=False).ids  # no marker reached it


async def test_the_prompt_is_the_same_with_and_without_breakpoints(app: FastAPI) -> None:
    fake = script(app, "Twelve.")
    plain = {"system": SYSTEM, "messages": [
        {"role": "user", "content": QUESTION}, {"role": "assistant", "content": "Let me look."},
        {"role": "user", "content": [{"type": "text", "text": "Well?  \n"}]}]}
    await messages(app, plain)
    marked_body = json.loads(json.dumps(plain))
    marked_body["system"] = [{"type": "text", "text": SYSTEM, "cache_control": marked("1h")}]
    marked_body["messages"][2]["content"][0]["cache_control"] = marked()  # ends in whitespace
    marked_body["messages"][1]["content"] = [{"type": "text", "text": "Let me look.", "cache_control": marked()}]
    await messages(app, marked_body)
    unmarked, with_marks = fake.requests
    assert unmarked.prompt_ids == with_marks.prompt_ids and unmarked.prompt_text == with_marks.prompt_text
    assert unmarked.retention == () and len(with_marks.retention) == 3
    ends = [r.end for r in with_marks.retention]
    assert ends == sorted(ends) and ends[-1] < len(with_marks.prompt_ids)
    assert [r.duration_ms for r in with_marks.retention] == [HOUR, FIVE_MINUTES, FIVE_MINUTES]


class NoRetention(FakeBackend):
    def supports(self, param: str) -> bool:
        return param != "kv_retention"


async def test_a_backend_without_the_retention_inputs_gets_none(app: FastAPI) -> None:
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.backend = fake = NoRetention([[i] for i in rt.tokenizer.encode("Twelve.")])
    r = await messages(app, {"system": [{"type": "text", "text": SYSTEM, "cache_control": marked()}],
                             "messages": [{"role": "user", "content": QUESTION}]})
    assert r.status_code == 200
    assert fake.requests[0].retention == () and MARK_START not in fake.requests[0].prompt_text


@pytest.mark.parametrize(("control", "param"), [
    ("yes", "system[0].cache_control"), ({"type": "persistent"}, "system[0].cache_control"),
    ({"type": "ephemeral", "ttl": "2h"}, "system[0].cache_control.ttl")])
async def test_a_bad_cache_control_is_a_400_naming_it(app: FastAPI, control: Any, param: str) -> None:
    script(app, "x")
    r = await messages(app, {"system": [{"type": "text", "text": SYSTEM, "cache_control": control}],
                             "messages": [{"role": "user", "content": QUESTION}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert param in r.json()["error"]["message"]


async def test_a_longer_ttl_after_a_shorter_one_is_a_400(app: FastAPI) -> None:
    """Anthropic requires a 1-hour breakpoint before every 5-minute one, in its order: tools, system, messages."""
    script(app, "x")
    r = await messages(app, {"system": [{"type": "text", "text": SYSTEM, "cache_control": marked()}],
                             "messages": [{"role": "user", "content": [
                                 {"type": "text", "text": QUESTION, "cache_control": marked("1h")}]}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert "messages[0].content[0].cache_control.ttl" in r.json()["error"]["message"]
    assert "system[0].cache_control comes first" in r.json()["error"]["message"]
    script(app, "x")
    tool = {"name": "t", "input_schema": {"type": "object"}, "cache_control": marked("1h")}
    r = await messages(app, {"tools": [tool],
                             "system": [{"type": "text", "text": SYSTEM, "cache_control": marked("1h")}],
                             "messages": [{"role": "user", "content": [
                                 {"type": "text", "text": QUESTION, "cache_control": marked()}]}]})
    assert r.status_code == 200, r.text


async def test_more_than_four_breakpoints_is_a_400(app: FastAPI) -> None:
    script(app, "x")
    blocks = [{"type": "text", "text": f"Part {i}.", "cache_control": marked()} for i in range(3)]
    tools = [{"name": f"t{i}", "input_schema": {"type": "object"}, "cache_control": marked()} for i in range(2)]
    r = await messages(app, {"system": blocks, "tools": tools, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "A maximum of 4 blocks with cache_control may be provided. Found 5."
    r = await messages(app, {"system": blocks, "tools": tools[:1], "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text


def test_a_block_whose_last_token_merges_with_what_follows_ends_at_the_token_before() -> None:
    assert token_offset([1, 2, 3], [1, 2, 3, 4]) == 3
    assert token_offset([1, 2, 9], [1, 2, 3, 4]) == 2  # the prefix's last token is not the prompt's
    text, marks = strip_marks("ab")
    assert (text, marks) == ("ab", [])
    ids = [10, 11, 12, 13]
    ranges = retained_ranges([(2, "5m"), (2, "1h"), (4, "1h")], ids, lambda k: ids[:k])
    assert ranges == (RetainedRange(0, 2, FIVE_MINUTES), RetainedRange(2, 4, HOUR))  # an empty range is dropped


@pytest.mark.parametrize(("render", "prompt", "marks"), [
    ("{{ c }}", "Hello world  ", [(11, "1h")]),
    ("{{ c | trim }}!", "Hello world!", [(11, "1h")]),
    ("{{ c | tojson }}", '"Hello world  "', [(12, "1h")]),
    ("{{ c | upper }}", "HELLO WORLD  ", []),  # rewritten: no range, as for any marker not intact
])
def test_a_marker_passes_through_what_templates_do_to_content(render: str, prompt: str,
                                                               marks: list[tuple[int, str]]) -> None:
    rendered = ChatTemplate.from_string("{% set c = messages[0]['content'] %}" + render).render(
        [{"role": "user", "content": mark_block("Hello world  ", "1h")}])
    text, found = strip_marks(rendered)
    if marks:
        assert (text, found) == (prompt, marks)
    else:  # "1h" became "1H": the marker is left as the template wrote it
        assert found == [] and text.replace(MARK_START.upper() + "1H\x7f", "") == prompt
    assert text.isascii()  # an ASCII conversation's prompt stays ASCII (one byte a character) all the way


RETAINING_CONFIG = {"config": {**TRTLLM_CONFIG["config"], "input": [
    *TRTLLM_CONFIG["config"]["input"],  # type: ignore[index]
    *(tensor(f"retention_token_range_{n}", "INT32", [-1], True) for n in ("starts", "ends", "priorities",
                                                                           "durations_ms")),
    tensor("retention_decode_priority", "INT32", [1], True)]}}


def test_the_adapter_sends_the_ranges_only_to_a_model_that_declares_them() -> None:
    ranges = (RetainedRange(0, 40, HOUR), RetainedRange(40, 64, FIVE_MINUTES))
    adapter = make(TensorRTLLMAdapter, FakeClient(RETAINING_CONFIG), "trt")
    assert adapter.supports("kv_retention")
    got = sent(adapter._request(GenerationRequest(prompt_ids=list(range(70)), max_tokens=4, retention=ranges), True))
    assert got["retention_token_range_starts"].tolist() == [[0, 40]]
    assert got["retention_token_range_ends"].tolist() == [[40, 64]]
    assert got["retention_token_range_priorities"].tolist() == [[RETENTION_PRIORITY] * 2]
    assert got["retention_token_range_durations_ms"].tolist() == [[HOUR, FIVE_MINUTES]]
    assert got["retention_token_range_starts"].dtype == np.int32 and "retention_decode_priority" not in got
    plain = make(TensorRTLLMAdapter, FakeClient(TRTLLM_CONFIG), "trt")
    assert not plain.supports("kv_retention")
    got = sent(plain._request(GenerationRequest(prompt_ids=[1, 2], max_tokens=4, retention=ranges), True))
    assert not any(name.startswith("retention_") for name in got)


async def test_a_long_prompts_breakpoints_cost_no_second_tokenizing_of_new_text(app: FastAPI,
                                                                                  tokenizer: Tokenizer) -> None:
    """A long prompt goes through the prompt cache. A breakpoint inside a segment that request tokenized anew
    (Claude Code's on the newest tool result; SmolLM2's template wraps it in <tool_response>) ends at that
    segment's start: tokenizing its head again doubled the tokenizing of every such turn. A breakpoint in a
    segment the cache already held (a system prompt that stays) ends exactly at its block's end, and that head
    is cached in turn: a third request tokenizes nothing."""
    long_system = "You answer questions about the store room. " * 200
    result = "The red box holds 12 marbles. " * 60
    body = {"system": [{"type": "text", "text": long_system, "cache_control": marked("1h")}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": QUESTION}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "look", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": result,
                                      "cache_control": marked()}]}],
        "tools": [{"name": "look", "input_schema": {"type": "object"}}]}
    cache = app.state.gateway.services.preprocess.cache
    assert cache is not None

    def lcp(prefix: str, whole: list[int]) -> int:  # the prompt's token boundary at the prefix's end
        ids = tokenizer.encode(prefix, add_special_tokens=False).ids
        n = min(len(ids), len(whole))
        return next((i for i in range(n) if ids[i] != whole[i]), n)

    sent = []
    for _ in range(3):
        fake = script(app, "Twelve.")
        misses = cache.stats.miss_tokens
        r = await messages(app, body)
        assert r.status_code == 200, r.text
        sent.append((fake.requests[0], cache.stats.miss_tokens - misses))
    text = sent[0][0].prompt_text
    whole = tokenizer.encode(text, add_special_tokens=False).ids
    assert all(list(req.prompt_ids) == whole for req, _ in sent)  # the prompt never changes
    tool_start = count(tokenizer, text[:text.rindex("<|im_start|>tool")])
    system_end = lcp(text[:text.index(long_system.rstrip()) + len(long_system.rstrip())], whole)
    result_end = lcp(text[:text.index(result.rstrip()) + len(result.rstrip())], whole)
    # First: both segments new - the system breakpoint has no cut before its block but 0 (no range), the tool
    # result's ends where its message starts.
    assert sent[0][0].retention == (RetainedRange(0, tool_start, FIVE_MINUTES),)
    # Then both segments are cached: exact ends, the heads tokenized once, then never again.
    exact = (RetainedRange(0, system_end, HOUR), RetainedRange(system_end, result_end, FIVE_MINUTES))
    assert sent[1][0].retention == exact and sent[1][1] > 0
    assert sent[2][0].retention == exact and sent[2][1] == 0
