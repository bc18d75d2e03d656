"""Images of a request, from the client's parts to what a multimodal backend is sent (`ImageInput`).

Wire contract (what a client sends, what it gets back):

* chat: a user message's content part `{"type": "image_url", "image_url": {"url": URL, "detail":
  "auto" | "low" | "high"}}` (a bare string for `image_url` is taken too); URL an `http(s)` URL or
  `data:image/<type>;base64,<data>`. `detail` is accepted and not used (the model's processor decides the
  resolution). Image parts in any earlier user turn are images of the request as well, in order.
  Their shapes are checked where the content is typed (`services.parts.chat_parts`, at the chat dialect's
  edge); `services.responses` turns `input_image` parts into these; `chat_image_sources` lists a request's
  images with the `param` each refusal names (the client's path: `messages[i].content[j]`).
* `ImageService.load(sources)` -> one `ImageInput` per source, in order, or a 400 naming the first source
  (in order) that was refused, its reason in the message and `code: "invalid_image"`:
  `too_many_images` (more than `max_images` parts; nothing is fetched), `scheme`, `bad_url`,
  `ip_spelling`, `loopback`, `private`, `link_local`, `metadata`, `multicast`, `reserved`,
  `ipv4_mapped`, `not_allowed` (`--image-fetch allowed_only`), `url_off` (`--image-fetch off`: data URLs
  only), `resolve_failed`, `connect_failed`, `http_status`, `redirect`, `bad_response`, `timeout`,
  `too_large`, `data_url` (not `data:image/...;base64,` or not valid base64), `not_image`,
  `too_many_pixels` (see `images.fetch` and `images.decode`). A message names the reason, never the
  address a host resolved to.

How it is bounded: URL fetches run on the event loop as non-blocking I/O (`images.fetch.Fetcher`: one
deadline, a byte cap counted while reading, every hop's address checked), at most `fetch_concurrency`
at once per process; the decode-verify (Pillow) and base64 run on a small thread pool of their own, so
neither a slow host nor a big image holds up other requests. A data URL obeys the same byte and pixel
caps (its size is judged from its length before it is decoded). Verified images are cached by content
hash (data URLs) and by URL for `URL_TTL_S` seconds, within `cache_bytes`; a URL being fetched is fetched
once for every request that asks for it meanwhile, and the fetch is cancelled (its connection closed, its
fetch slot freed) as soon as no request waits for it any more: a client that leaves takes its fetches along.

This module is the one entry point for images: an API other than chat (Anthropic's image blocks) builds
`ImageSource`s (`ImageSource.base64(...)` for a bare base64 payload) and calls `load`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from openai_api.errors import InvalidRequestError
from openai_api.images import ImageRefused
from openai_api.images.decode import verify_image
from openai_api.images.fetch import AddressPolicy, Fetcher, split_url
from openai_api.observability import Metrics
from openai_api.schemas.openai import ChatMessage
from openai_api.services.parts import ChatParts, typed_messages
from openai_api.settings import Settings
from openai_api.triton.llm import ImageInput

# How long a URL's verified image is reused: a conversation's turns come within seconds; a URL's
# content may change, so it is not kept for long.
URL_TTL_S = 60.0


@dataclass(frozen=True, slots=True)
class ImageSource:
    """One image a request names: `url` (http(s) or a data URL) and `param`, the request field a refusal
    names (`messages[2].content[1]`)."""

    url: str
    param: str

    @classmethod
    def base64(cls, data: str, media_type: str, param: str) -> ImageSource:
        """An image given as a bare base64 payload and its media type (Anthropic's `source.type: base64`)."""
        return cls(f"data:{media_type};base64,{data}", param)


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_images: int = 16
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 50_000_000
    fetch_concurrency: int = 16
    cache_bytes: int = 64 * 1024 * 1024
    decode_threads: int = 2
    fetch_urls: bool = True  # False: `--image-fetch off`, data URLs only
    # All of a request's images as sent (base64), below Triton's gRPC message cap (256 MiB, triton.client)
    # with room for the prompt: a request past it would fail inside the RPC instead of as a clear 400.
    max_total_b64: int = 192 * 1024 * 1024


def refusal(param: str, reason: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"The image was refused: {message} (reason: {reason}).", param=param,
                               code="invalid_image")


def chat_image_sources(messages: list[ChatMessage]) -> list[ImageSource]:
    """Every image of a chat request's messages, in prompt order (earlier turns first), each named by its
    client's path (`parts.Image.where`); a list of parts not typed yet is typed first (`parts.typed_messages`)."""
    return [ImageSource(p.url, p.where) for m in typed_messages(messages) if isinstance(m.content, ChatParts)
            for p in m.content.images()]


def _data_bytes(url: str, max_bytes: int) -> bytes:
    """The bytes of a `data:image/...;base64,` URL (ImageRefused `data_url` / `too_large` otherwise); the size
    is judged from the text's length before anything is decoded."""
    head, sep, payload = url.partition(",")
    if not sep:
        raise ImageRefused("data_url", "the data URL has no ',' before its data")
    meta = head[5:].lower().split(";")
    if not meta[0].startswith("image/"):
        raise ImageRefused("data_url", f"the data URL's media type is {meta[0] or 'missing'!r}, not image/...")
    if "base64" not in meta[1:]:
        raise ImageRefused("data_url", "the data URL is not base64-encoded (';base64,' is required)")
    payload = payload.strip()
    if len(payload) // 4 * 3 > max_bytes + 3:
        raise ImageRefused("too_large", f"the image is about {len(payload) // 4 * 3:,} bytes, over the cap of "
                                        f"{max_bytes:,}")
    try:
        data = base64.b64decode(payload.replace("\n", "").replace("\r", ""), validate=True)
    except (binascii.Error, ValueError):
        raise ImageRefused("data_url", "the data URL's data is not valid base64") from None
    if len(data) > max_bytes:
        raise ImageRefused("too_large", f"the image is {len(data):,} bytes, over the cap of {max_bytes:,}")
    return data


def _verified(data: bytes, max_pixels: int) -> ImageInput:
    image = verify_image(data, max_pixels)
    return ImageInput(data=data, b64=base64.b64encode(data), mime=image.mime, width=image.width,
                      height=image.height, digest=hashlib.sha256(data).hexdigest())


def _from_data_url(url: str, max_bytes: int, max_pixels: int) -> tuple[ImageInput, int]:
    data = _data_bytes(url, max_bytes)
    return _verified(data, max_pixels), len(data)


class _Cache:
    """Verified images by key, least recently used out first, within `capacity` bytes (of image data)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 0
        self.items: OrderedDict[str, tuple[ImageInput, float]] = OrderedDict()

    def get(self, key: str) -> ImageInput | None:
        item = self.items.get(key)
        if item is None:
            return None
        if item[1] < time.monotonic():
            self._drop(key)
            return None
        self.items.move_to_end(key)
        return item[0]

    def put(self, key: str, image: ImageInput, ttl_s: float | None = None) -> None:
        cost = len(image.data) + len(image.b64)
        if cost > self.capacity:
            return
        if key in self.items:
            self._drop(key)
        self.items[key] = (image, time.monotonic() + ttl_s if ttl_s is not None else float("inf"))
        self.size += cost
        while self.size > self.capacity:
            self._drop(next(iter(self.items)))

    def _drop(self, key: str) -> None:
        image, _ = self.items.pop(key)
        self.size -= len(image.data) + len(image.b64)


class _Shared:
    """One fetch (or decode) of an image, awaited by every request that asks for it meanwhile: each waits
    shielded, so one request going away does not fail the others; the last to go cancels the work."""

    __slots__ = ("task", "waiters")

    def __init__(self, task: asyncio.Future[tuple[ImageInput, int]]) -> None:
        self.task = task
        self.waiters = 0

    async def wait(self) -> tuple[ImageInput, int]:
        self.waiters += 1
        try:
            return await asyncio.shield(self.task)
        finally:
            self.waiters -= 1
            if not self.waiters and not self.task.done():
                self.task.cancel()  # nobody waits for it: the connection closes, the fetch slot is freed


class ImageService:
    """Loads a request's images (see the module docstring)."""

    def __init__(self, limits: ImageLimits | None = None, fetcher: Fetcher | None = None,
                 metrics: Metrics | None = None) -> None:
        self.limits = limits or ImageLimits()
        self.fetcher = fetcher or Fetcher(max_bytes=self.limits.max_bytes)
        self.metrics = metrics
        self._slots = asyncio.Semaphore(self.limits.fetch_concurrency)
        self._pool: ThreadPoolExecutor | None = None
        self._cache = _Cache(self.limits.cache_bytes)
        self._inflight: dict[str, _Shared] = {}

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics | None = None) -> ImageService:
        limits = ImageLimits(max_images=settings.max_images_per_request, max_bytes=settings.image_max_bytes,
                             max_pixels=settings.image_max_pixels,
                             fetch_concurrency=settings.image_fetch_concurrency,
                             cache_bytes=settings.image_cache_bytes, fetch_urls=settings.image_fetch != "off")
        policy = AddressPolicy.build(settings.image_allowed_hosts, settings.image_allow_private,
                                     allowed_only=settings.image_fetch == "allowed_only")
        fetcher = Fetcher(policy=policy,
                          timeout_s=settings.image_fetch_timeout_s, max_bytes=settings.image_max_bytes,
                          max_redirects=settings.image_max_redirects)
        return cls(limits, fetcher, metrics)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self, fn: Any, *args: Any) -> Awaitable[Any]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.limits.decode_threads, thread_name_prefix="image-decode")
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def refuse_count(self, sources: Sequence[ImageSource]) -> None:
        """A 400 naming the first part past the per-request cap (before anything is fetched)."""
        cap = self.limits.max_images
        if len(sources) > cap:
            self._count("too_many_images")
            raise refusal(sources[cap].param, "too_many_images",
                          f"the request has {len(sources)} images; at most {cap} are taken per request")

    async def load(self, sources: Sequence[ImageSource]) -> list[ImageInput]:
        """One verified image per source, in order; the first refused source (in order) is the 400."""
        if not sources:
            return []
        self.refuse_count(sources)
        tasks = [asyncio.ensure_future(self._one(s)) for s in sources]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
        failures = [e for t in tasks if t.done() and not t.cancelled() and (e := t.exception()) is not None]
        if failures:
            raise failures[0]  # the first failure in the request's own order, not in time
        images = [t.result() for t in tasks]
        total = 0
        for src, image in zip(sources, images, strict=True):
            total += len(image.b64)
            if total > self.limits.max_total_b64:
                self._count("too_large")
                raise refusal(src.param, "too_large", f"the request's images add up to more than "
                                                      f"{self.limits.max_total_b64:,} bytes of base64, over what "
                                                      "one Triton request carries")
        return images

    def _count(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.image_refusals.labels(reason).inc()

    def _taken(self, source: str, size: int) -> None:
        if self.metrics is not None:
            self.metrics.images.labels(source).inc()
            if size:
                self.metrics.image_bytes.labels(source).inc(size)

    async def _one(self, src: ImageSource) -> ImageInput:
        url = src.url
        try:
            if url[:5].lower() == "data:":
                key = "data:" + hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()
                ttl: float | None = None
                source = "data"
            else:
                if not self.limits.fetch_urls:
                    raise ImageRefused("url_off", "this gateway fetches no image URLs; send the image as a "
                                                  "data:image/...;base64 URL")
                split_url(url)  # scheme and shape refused at once, without waiting for a fetch slot
                key, ttl, source = "url:" + url, URL_TTL_S, "url"
            cached = self._cache.get(key)
            if cached is not None:
                self._taken("cache", 0)
                return replace(cached, param=src.param)
            shared = self._inflight.get(key)
            if shared is None:
                task = asyncio.ensure_future(self._data(url) if source == "data" else self._fetch(url))
                shared = self._inflight[key] = _Shared(task)
                task.add_done_callback(functools.partial(self._settled, key, ttl))
            image, size = await shared.wait()
            self._taken(source, size)
            # the cached and shared image is the same for every request; the field naming it is this one's
            return replace(image, param=src.param)
        except ImageRefused as e:
            self._count(e.reason)
            raise refusal(src.param, e.reason, e.message) from None

    def _settled(self, key: str, ttl: float | None, task: asyncio.Future[tuple[ImageInput, int]]) -> None:
        if (shared := self._inflight.get(key)) is not None and shared.task is task:
            del self._inflight[key]
        if not task.cancelled() and task.exception() is None:
            self._cache.put(key, task.result()[0], ttl)

    async def _data(self, url: str) -> tuple[ImageInput, int]:
        result: tuple[ImageInput, int] = await self._run(_from_data_url, url, self.limits.max_bytes,
                                                         self.limits.max_pixels)
        return result

    async def _fetch(self, url: str) -> tuple[ImageInput, int]:
        # The fetch timeout covers the wait for a slot too: a burst of slow hosts delays a URL by at most
        # its own timeout, and then it is refused, never queued without end.
        budget = self.fetcher.timeout_s
        start = time.perf_counter()
        try:
            async with asyncio.timeout(budget):
                await self._slots.acquire()
        except TimeoutError:
            raise ImageRefused("timeout", f"no fetch slot came free within {budget:g} s (the gateway is fetching "
                                          "many images)") from None
        try:
            data = await self.fetcher.fetch(url, max(budget - (time.perf_counter() - start), 0.001))
        finally:
            self._slots.release()
            if self.metrics is not None:
                self.metrics.image_fetch_seconds.observe(time.perf_counter() - start)
        image: ImageInput = await self._run(_verified, data, self.limits.max_pixels)
        return image, len(data)
