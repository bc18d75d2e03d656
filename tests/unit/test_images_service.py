"""Images from request parts to `ImageInput`s (`services.images`), and into chat: data URLs, caps, the cache,
refusals naming the part, templates (image parts or a configured placeholder), the per-image context cost,
and a model without an image input. URL fetches go through a fake fetcher; nothing touches the network."""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
from typing import Any

import pytest

from openai_api.errors import ContextLengthExceededError, InvalidRequestError
from openai_api.images import ImageRefused
from openai_api.observability import Metrics
from openai_api.quota.caller import Caller
from openai_api.quota.keys import ANONYMOUS
from openai_api.schemas.openai import ChatCompletionRequest, ResponsesRequest
from openai_api.services.chat import ChatService
from openai_api.services.context import RequestContext
from openai_api.services.images import ImageLimits, ImageService, ImageSource
from openai_api.services.preprocess import Preprocessor
from openai_api.services.registry import LLMRuntime, ModelRegistry
from openai_api.services.responses import ResponsesService
from openai_api.text.templates import ChatTemplate
from openai_api.text.workers import CPUWorkers
from openai_api.triton.client import TritonClientPool
from tests.helpers import missing_models
from tests.image_samples import data_url, png_bomb, solid
from tests.unit.fakes import MODEL, FakeBackend, llm_only_config

RED = solid(64, 48, "red")
BLUE = solid(10, 20, "blue", "JPEG")


class FakeFetcher:
    """`fetch(url)` from a dict; records every call."""

    def __init__(self, pages: dict[str, bytes | ImageRefused], timeout_s: float = 5.0) -> None:
        self.pages = pages
        self.calls: list[str] = []
        self.timeout_s = timeout_s
        self.hold: asyncio.Event | None = None  # set: every fetch waits for it
        self.cancelled: list[str] = []  # fetches cancelled while they waited

    async def fetch(self, url: str, timeout_s: float | None = None) -> bytes:
        self.calls.append(url)
        await asyncio.sleep(0)
        if self.hold is not None:
            try:
                await self.hold.wait()
            except asyncio.CancelledError:
                self.cancelled.append(url)
                raise
        page = self.pages[url]
        if isinstance(page, ImageRefused):
            raise page
        return page


def service(pages: dict[str, bytes | ImageRefused] | None = None, **limits: Any) -> tuple[ImageService, FakeFetcher]:
    fetcher = FakeFetcher(pages or {})
    return ImageService(ImageLimits(**limits), fetcher, Metrics()), fetcher  # type: ignore[arg-type]


def load(svc: ImageService, *urls: str) -> Any:
    return asyncio.run(svc.load([ImageSource(u, f"messages[0].content[{j}]") for j, u in enumerate(urls)]))


def refusal(svc: ImageService, *urls: str) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        load(svc, *urls)
    assert info.value.status == 400 and info.value.code == "invalid_image"
    return info.value


# --- the service ---------------------------------------------------------------------------------------------


def test_data_urls_and_fetched_urls_become_verified_images_in_order() -> None:
    svc, fetcher = service({"https://img.example.com/b.jpg": BLUE})
    images = load(svc, data_url(RED), "https://img.example.com/b.jpg")
    assert [(i.mime, i.width, i.height) for i in images] == [("image/png", 64, 48), ("image/jpeg", 10, 20)]
    assert base64.b64decode(images[0].b64) == RED and images[1].data == BLUE
    assert fetcher.calls == ["https://img.example.com/b.jpg"]


def test_each_image_names_its_own_part_when_shared_or_cached() -> None:
    """The same image twice in a request (one fetch, shared) and again in a later request (the cache) is one
    verified image, but each `ImageInput` names the part that carried it, so an adapter's refusal names it."""
    svc, fetcher = service({"https://img.example.com/b.jpg": BLUE})
    url = "https://img.example.com/b.jpg"
    first = load(svc, url, data_url(RED), url)
    assert [i.param for i in first] == ["messages[0].content[0]", "messages[0].content[1]", "messages[0].content[2]"]
    again = asyncio.run(svc.load([ImageSource(url, "messages[4].content[1]")]))
    assert [i.param for i in again] == ["messages[4].content[1]"] and again[0].data == BLUE
    assert fetcher.calls == [url]


def test_the_declared_type_is_not_trusted() -> None:
    svc, _ = service()
    [image] = load(svc, data_url(BLUE, "image/png"))  # JPEG bytes declared PNG
    assert image.mime == "image/jpeg"
    assert "not_image" in refusal(svc, data_url(b"GIF89a-not-really", "image/gif")).message


@pytest.mark.parametrize(("url", "reason"), [
    ("data:image/png," + "iVBORw0KGgo=", "data_url"),  # not base64
    ("data:text/plain;base64,aGVsbG8=", "data_url"),
    ("data:image/png;base64,***not base64***", "data_url"),
    ("data:image/png;base64", "data_url"),
    ("data:image/png;base64," + base64.b64encode(b"hello, not an image").decode(), "not_image"),
    (data_url(png_bomb()), "too_many_pixels"),
    ("file:///etc/passwd", "scheme"),
    ("gopher://127.0.0.1:70/", "scheme"),
])
def test_each_refusal_names_the_part_and_its_reason(url: str, reason: str) -> None:
    svc, fetcher = service()
    err = refusal(svc, data_url(RED), url)
    assert err.param == "messages[0].content[1]"
    assert f"(reason: {reason})" in err.message
    assert fetcher.calls == []


def test_data_urls_obey_the_byte_cap_before_decoding() -> None:
    svc, _ = service(max_bytes=1000)
    assert "(reason: too_large)" in refusal(svc, data_url(solid(200, 200, "red", "BMP"))).message


def test_the_pixel_cap_is_a_setting() -> None:
    svc, _ = service(max_pixels=64 * 48 - 1)
    assert "(reason: too_many_pixels)" in refusal(svc, data_url(RED)).message


def test_the_requests_images_together_stay_below_what_one_triton_request_carries() -> None:
    svc, _ = service(max_total_b64=len(data_url(RED)) * 2)
    assert len(load(svc, data_url(RED), data_url(RED))) == 2
    err = refusal(svc, data_url(RED), data_url(RED), data_url(RED))
    assert err.param == "messages[0].content[2]" and "(reason: too_large)" in err.message


def test_more_images_than_the_cap_is_refused_before_any_fetch() -> None:
    svc, fetcher = service({f"https://x.example.com/{k}.png": RED for k in range(4)}, max_images=3)
    err = refusal(svc, *(f"https://x.example.com/{k}.png" for k in range(4)))
    assert err.param == "messages[0].content[3]" and "(reason: too_many_images)" in err.message
    assert fetcher.calls == []


def test_the_first_refused_part_in_order_is_the_one_named() -> None:
    svc, _ = service({"https://a.example.com/1.png": ImageRefused("timeout", "slow"),
                      "https://a.example.com/2.png": ImageRefused("loopback", "no")})
    err = refusal(svc, data_url(RED), "https://a.example.com/1.png", "https://a.example.com/2.png")
    assert err.param == "messages[0].content[1]" and "(reason: timeout)" in err.message


def test_waiting_for_a_fetch_slot_counts_toward_the_timeout() -> None:
    async def scenario() -> str:
        fetcher = FakeFetcher({"https://a.example.com/slow.png": RED, "https://b.example.com/b.png": RED},
                              timeout_s=0.05)
        svc = ImageService(ImageLimits(fetch_concurrency=1), fetcher)  # type: ignore[arg-type]
        fetcher.hold = asyncio.Event()
        slow = asyncio.ensure_future(svc.load([ImageSource("https://a.example.com/slow.png", "a")]))
        await asyncio.sleep(0.01)  # the slow fetch holds the only slot
        try:
            await svc.load([ImageSource("https://b.example.com/b.png", "b")])
        except InvalidRequestError as e:
            assert fetcher.calls == ["https://a.example.com/slow.png"]
            return e.message
        finally:
            fetcher.hold.set()
            await slow
        return ""

    assert "(reason: timeout)" in asyncio.run(scenario())


def test_a_fetch_ends_with_the_last_request_waiting_for_it_and_frees_its_slot() -> None:
    """A request that goes away (its client left) takes its fetch along: the fetch is cancelled and its slot
    is free for the next URL at once. A fetch another request still waits for goes on for that one."""
    async def scenario() -> None:
        url, other = "https://a.example.com/slow.png", "https://b.example.com/b.png"
        fetcher = FakeFetcher({url: RED, other: BLUE}, timeout_s=60)
        svc = ImageService(ImageLimits(fetch_concurrency=1), fetcher)  # type: ignore[arg-type]
        fetcher.hold = asyncio.Event()
        first = asyncio.ensure_future(svc.load([ImageSource(url, "a")]))
        second = asyncio.ensure_future(svc.load([ImageSource(url, "b")]))
        await asyncio.sleep(0.01)
        first.cancel()  # one of the two requests for the URL leaves: the fetch goes on for the other
        await asyncio.sleep(0.01)
        assert fetcher.calls == [url] and not fetcher.cancelled
        second.cancel()  # the last one leaves: the fetch is cancelled, its slot freed
        await asyncio.sleep(0.01)
        assert fetcher.cancelled == [url]
        fetcher.hold.set()
        images = await asyncio.wait_for(svc.load([ImageSource(other, "c")]), 5)  # the only slot is free
        assert images[0].width == 10 and fetcher.calls == [url, other]
        assert not svc._inflight

    asyncio.run(scenario())


def test_with_url_fetching_off_only_data_urls_are_taken() -> None:
    svc, fetcher = service({"https://img.example.com/b.jpg": BLUE}, fetch_urls=False)
    err = refusal(svc, data_url(RED), "https://img.example.com/b.jpg")
    assert err.param == "messages[0].content[1]" and "(reason: url_off)" in err.message and "data:image" in err.message
    assert fetcher.calls == []
    assert load(svc, data_url(RED))[0].width == 64


def test_the_same_image_is_fetched_and_verified_once() -> None:
    url = "https://img.example.com/r.png"
    svc, fetcher = service({url: RED})
    first = load(svc, url, url, data_url(RED))
    again = load(svc, url, data_url(RED))
    assert fetcher.calls == [url]
    assert first[0].data is first[1].data is again[0].data  # one verified image; each names its own part
    assert again[1].data is first[2].data


def test_refusals_are_counted_by_reason_in_the_metrics() -> None:
    svc, _ = service()
    refusal(svc, "file:///x")
    refusal(svc, data_url(png_bomb()))
    text = svc.metrics.render().decode() if svc.metrics else ""
    assert 'openai_api_image_refusals_total{reason="scheme"} 1.0' in text
    assert 'openai_api_image_refusals_total{reason="too_many_pixels"} 1.0' in text


# --- into chat -----------------------------------------------------------------------------------------------

VISION_TEMPLATE = ChatTemplate(
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for p in m.content %}{% if p.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ p.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class ImageBackend(FakeBackend):
    def __init__(self, script: list[list[int]], images: bool) -> None:
        super().__init__(script)
        self.images = images

    def supports(self, param: str) -> bool:
        return self.images if param == "images" else True


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> ModelRegistry:
    if reason := missing_models(MODEL):
        pytest.skip(reason)
    return ModelRegistry(llm_only_config(tmp_path_factory.mktemp("config")), TritonClientPool(), Metrics())


def chat_service(registry: ModelRegistry, *, images: bool = True, template: ChatTemplate | None = VISION_TEMPLATE,
                 **config: Any) -> tuple[ChatService, FakeBackend]:
    base = registry.llm(MODEL)
    backend = ImageBackend([[42]], images)
    rt: LLMRuntime = dataclasses.replace(base, backend=backend, template=template or base.template,
                                         config=base.config.model_copy(update=config))
    reg = copy.copy(registry)
    reg.llms = {rt.name: rt}
    svc, _ = service({"https://img.example.com/blue.jpg": BLUE})
    return ChatService(reg, Preprocessor(CPUWorkers(1)), svc), backend


def request(**kw: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": MODEL, "max_tokens": 4, **kw})


CONVERSATION = [
    {"role": "user", "content": [{"type": "text", "text": "first:"},
                                 {"type": "image_url", "image_url": {"url": data_url(RED), "detail": "low"}}]},
    {"role": "assistant", "content": "a red one"},
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://img.example.com/blue.jpg"}},
                                 {"type": "text", "text": "and this?"}]},
]


def test_image_parts_of_every_turn_reach_the_backend_in_order_with_the_templates_placeholders(
        registry: ModelRegistry) -> None:
    svc, _ = chat_service(registry)
    prepared = asyncio.run(svc.prepare(request(messages=CONVERSATION), RequestContext("r1")))
    text = prepared.greqs[0].prompt_text
    assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == 2
    assert text.index("first:") < text.index("<|vision_start|>") < text.index("a red one")
    assert [(i.width, i.height) for i in prepared.greqs[0].images] == [(64, 48), (10, 20)]


def test_a_configured_placeholder_stands_in_for_each_image_where_the_template_reads_strings(
        registry: ModelRegistry) -> None:
    svc, _ = chat_service(registry, template=None, image_placeholder="<image>\n")
    assert not svc.registry.llm(MODEL).template.content_as_parts  # type: ignore[union-attr]
    prepared = asyncio.run(svc.prepare(request(messages=CONVERSATION), RequestContext("r2")))
    text = prepared.greqs[0].prompt_text
    assert "first:<image>\n<|im_end|>" in text and "<image>\nand this?" in text


def test_a_string_template_without_a_placeholder_refuses_the_image_part(registry: ModelRegistry) -> None:
    svc, _ = chat_service(registry, template=None)
    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(svc.prepare(request(messages=CONVERSATION), RequestContext("r3")))
    assert info.value.param == "messages[0].content[1]" and info.value.code == "unsupported_content"


def test_a_model_without_image_input_refuses_the_first_image_part_by_name(registry: ModelRegistry) -> None:
    svc, backend = chat_service(registry, images=False)
    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(svc.prepare(request(messages=CONVERSATION), RequestContext("r4")))
    assert info.value.param == "messages[0].content[1]" and info.value.status == 400
    assert "does not take images" in info.value.message and backend.requests == []


def test_images_only_in_user_messages_and_detail_checked(registry: ModelRegistry) -> None:
    svc, _ = chat_service(registry)
    part = {"type": "image_url", "image_url": {"url": data_url(RED)}}
    for messages, param in (
            ([{"role": "system", "content": [part]}, {"role": "user", "content": "hi"}], "messages[0].content[0]"),
            ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(RED),
                                                                                 "detail": "huge"}}]}],
             "messages[0].content[0].image_url.detail"),
            ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
             "messages[0].content[0].image_url.url")):
        with pytest.raises(InvalidRequestError) as info:
            asyncio.run(svc.prepare(request(messages=messages), RequestContext("r5")))
        assert info.value.param == param


def test_each_image_costs_its_configured_tokens_of_context(registry: ModelRegistry) -> None:
    svc, _ = chat_service(registry)
    plain = asyncio.run(svc.prepare(request(messages=CONVERSATION), RequestContext("r6"))).prompt_tokens
    svc, _ = chat_service(registry, image_tokens=1000)
    assert asyncio.run(svc.prepare(request(messages=CONVERSATION), RequestContext("r7"))).prompt_tokens == plain + 2000
    context = svc.registry.llm(MODEL).context_length
    svc, _ = chat_service(registry, image_tokens=context // 2)
    with pytest.raises(ContextLengthExceededError):
        asyncio.run(svc.prepare(request(messages=CONVERSATION), RequestContext("r8")))


def test_responses_input_image_becomes_an_image_and_a_refusal_names_the_input_field(
        registry: ModelRegistry) -> None:
    svc, _ = chat_service(registry)
    responses = ResponsesService(svc, None)
    ok = ResponsesRequest.model_validate({"model": MODEL, "instructions": "be brief", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "what?"},
                                     {"type": "input_image", "image_url": data_url(RED), "detail": "auto"}]}]})
    messages = asyncio.run(responses._conversation(ok, Caller(ANONYMOUS)))
    prepared = asyncio.run(svc.prepare(ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": messages}), RequestContext("r9")))
    assert [(i.width, i.height) for i in prepared.greqs[0].images] == [(64, 48)]
    bad = ResponsesRequest.model_validate({"model": MODEL, "instructions": "be brief", "input": [
        {"role": "user", "content": "hello"},
        {"role": "user", "content": [{"type": "input_image", "image_url": "file:///etc/passwd"}]}]})
    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(responses.create(bad, RequestContext("r10", Caller(ANONYMOUS))))
    assert info.value.param == "input[1].content[0]" and "(reason: scheme)" in info.value.message
