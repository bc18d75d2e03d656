"""Images in chat end to end: the `openai` client, LangChain and raw HTTP against the real gateway and the
session's real tritonserver, whose `vision-vllm` model (the vLLM backend's interface with its `image` input)
decodes every image it is sent and answers with facts computed from the pixels ("image 1: 64x48, red.").
The expected answers come from the images the tests make, never from the gateway.

Every URL here is on this machine's loopback: the images are served by small HTTP servers the module
starts on 127.0.0.2 (allowed with `--image-allowed-hosts 127.0.0.2`) and on 127.0.0.1 (refused: its
request counter proves the gateway never reached it). Refusals of non-loopback addresses (private,
metadata, odd spellings, rebinding) are proven in tests/unit/test_image_fetch.py without a network.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.e2e.conftest import (
    API_KEY,
    LLM,
    VISION,
    VISION_PLACEHOLDER,
    VISION_TRTLLM,
    VISION_TRTLLM_PIXELS,
    GatewayServer,
    gateway_config,
)
from tests.image_samples import data_url, mostly, png_bomb, solid

RED = solid(64, 48, "red")
BLUE = solid(10, 20, "blue", "JPEG")
GREEN = solid(33, 7, "green", "WEBP")
YELLOW = mostly(40, 40, "yellow", "black")
GIF = solid(5, 6, "white", "GIF")
MAX_BYTES = 256 * 1024
TIMEOUT_S = 4.0  # the slow host's deadline: long enough that the answers below beat it on a loaded machine
MAX_IMAGES = 4


class Pages(BaseHTTPRequestHandler):
    """Serves the test's images; counts every request per server."""

    pages: dict[str, tuple[int, dict[str, str], bytes]] = {}

    def do_GET(self) -> None:
        server: Any = self.server
        server.hits.append(self.path)
        path = self.path.split("?")[0]
        if path == "/slow.png":  # headers at once, then one byte a second
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(RED)))
            self.end_headers()
            try:
                for b in RED[:30]:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(1)
            except OSError:
                pass  # the gateway hung up at its deadline
            return
        if path == "/hold.png":  # headers at once, then a byte every 0.2 s for a minute; records when it was cut
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(RED) + 300))
            self.end_headers()
            try:
                for _ in range(300):
                    self.wfile.write(b"\0")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                server.cut.append(self.path)  # the gateway closed the fetch's connection
            return
        status, headers, body = server.pages.get(path, (404, {}, b"not found"))
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


def serve(host: str, pages: dict[str, tuple[int, dict[str, str], bytes]],
          family: socket.AddressFamily = socket.AF_INET) -> ThreadingHTTPServer:
    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

    server = Server((host, 0), Pages)
    server.hits = []  # type: ignore[attr-defined]
    server.cut = []  # type: ignore[attr-defined]
    server.pages = pages  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def refused_servers() -> Iterator[list[ThreadingHTTPServer]]:
    """Loopback servers the gateway must never reach (each would serve a valid image)."""
    pages = {"/red.png": (200, {"Content-Type": "image/png"}, RED)}
    servers = [serve("127.0.0.1", pages)]
    try:
        servers.append(serve("::1", pages, socket.AF_INET6))
    except OSError:
        pass  # no IPv6 loopback here: [::1] is still refused before any connection, just not counted
    yield servers
    for s in servers:
        s.shutdown()


@pytest.fixture(scope="module")
def image_host(refused_servers: list[ThreadingHTTPServer]) -> Iterator[ThreadingHTTPServer]:
    """The allowed image host, on 127.0.0.2 (its `hits` and `cut` record what it was asked and when a
    connection was closed on it)."""
    target = refused_servers[0].server_address[1]
    png = {"Content-Type": "image/png"}
    pages = {"/red.png": (200, png, RED), "/blue.jpg": (200, {"Content-Type": "image/jpeg"}, BLUE),
             "/green.webp": (200, {"Content-Type": "image/webp"}, GREEN), "/yellow.png": (200, png, YELLOW),
             "/bomb.png": (200, png, png_bomb()), "/big.png": (200, png, b"\x89PNG" + b"\0" * (MAX_BYTES + 10)),
             "/text.png": (200, png, b"<html>this is not an image</html>"),
             "/to-red.png": (302, {"Location": "/red.png"}, b""),
             "/to-loopback.png": (302, {"Location": f"http://127.0.0.1:{target}/red.png"}, b"")}
    server = serve("127.0.0.2", pages)
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def images(image_host: ThreadingHTTPServer) -> str:
    """The allowed image host's base URL."""
    return f"http://127.0.0.2:{image_host.server_address[1]}"


@pytest.fixture(scope="module")
def gateway(triton: EmbeddedTriton) -> Iterator[GatewayServer]:
    settings = Settings(config_file=Path("."), api_keys=[API_KEY], image_allowed_hosts=["127.0.0.2"],
                        image_fetch_timeout_s=TIMEOUT_S, image_max_bytes=MAX_BYTES, max_images_per_request=MAX_IMAGES)
    server = GatewayServer(gateway_config(triton), [API_KEY], settings).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, timeout=60, max_retries=0)


@pytest.fixture(scope="module")
def http(gateway: GatewayServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as c:
        yield c


def image(url: str, detail: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": url}}
    if detail:
        part["image_url"]["detail"] = detail
    return part


def ask(client: openai.OpenAI, messages: list[dict[str, Any]], stream: bool, model: str = VISION) -> str:
    if not stream:
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=64)  # type: ignore[arg-type]
        assert r.choices[0].finish_reason == "stop"
        return r.choices[0].message.content or ""
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=64,  # type: ignore
                                                 stream=True))
    assert chunks[-1].choices[0].finish_reason == "stop"
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


# --- images reach the model ----------------------------------------------------------------------------------

STREAM = pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])


@STREAM
def test_a_data_url_image(client: openai.OpenAI, stream: bool) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image(data_url(RED))]}]
    assert ask(client, messages, stream) == "image 1: 64x48, red."


@STREAM
def test_an_http_url_image_from_an_allowed_host(client: openai.OpenAI, images: str, stream: bool) -> None:
    messages = [{"role": "user", "content": [image(f"{images}/blue.jpg", "high"), {"type": "text", "text": "?"}]}]
    assert ask(client, messages, stream) == "image 1: 10x20, blue."


@STREAM
def test_two_images_arrive_in_order(client: openai.OpenAI, images: str, stream: bool) -> None:
    messages = [{"role": "user", "content": [image(f"{images}/green.webp"), {"type": "text", "text": "and"},
                                             image(data_url(YELLOW))]}]
    assert ask(client, messages, stream) == "image 1: 33x7, green. image 2: 40x40, yellow."
    messages = [{"role": "user", "content": [image(data_url(YELLOW)), image(f"{images}/green.webp")]}]
    assert ask(client, messages, stream) == "image 1: 40x40, yellow. image 2: 33x7, green."


@STREAM
def test_an_image_in_an_earlier_turn_is_sent_too(client: openai.OpenAI, images: str, stream: bool) -> None:
    messages = [{"role": "user", "content": [image(data_url(GIF)), {"type": "text", "text": "first"}]},
                {"role": "assistant", "content": "image 1: 5x6, white."},
                {"role": "user", "content": [{"type": "text", "text": "now this"}, image(f"{images}/to-red.png")]}]
    assert ask(client, messages, stream) == "image 1: 5x6, white. image 2: 64x48, red."


@STREAM
def test_a_string_template_with_a_configured_placeholder(client: openai.OpenAI, stream: bool) -> None:
    """vision-vllm-placeholder wants "<image>" in the prompt, which smollm2.jinja could not write."""
    messages = [{"role": "user", "content": [image(data_url(BLUE)), {"type": "text", "text": "what?"}]}]
    assert ask(client, messages, stream, VISION_PLACEHOLDER) == "image 1: 10x20, blue."


def test_usage_counts_each_images_configured_tokens(client: openai.OpenAI) -> None:
    text = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    with_image = [{"role": "user", "content": [{"type": "text", "text": "hi"}, image(data_url(RED))]}]
    base = client.chat.completions.create(model=VISION, messages=text, max_tokens=8)  # type: ignore[arg-type]
    more = client.chat.completions.create(model=VISION, messages=with_image, max_tokens=8)  # type: ignore[arg-type]
    assert base.usage and more.usage
    assert more.usage.prompt_tokens >= base.usage.prompt_tokens + 64  # image_tokens: 64 in the e2e config


def test_responses_input_image(client: openai.OpenAI, images: str) -> None:
    content = [{"type": "input_text", "text": "What are these?"},
               {"type": "input_image", "image_url": f"{images}/red.png", "detail": "auto"},
               {"type": "input_image", "image_url": data_url(BLUE)}]
    r = client.responses.create(model=VISION, input=[{"role": "user", "content": content}],  # type: ignore
                                max_output_tokens=64)
    assert r.output_text == "image 1: 64x48, red. image 2: 10x20, blue."
    with client.responses.stream(model=VISION, input=[{"role": "user", "content": content}],  # type: ignore
                                 max_output_tokens=64) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "image 1: 64x48, red. image 2: 10x20, blue."


def test_responses_refusal_names_the_input_part(http: httpx.Client) -> None:
    body = {"model": VISION, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "?"}, {"type": "input_image", "image_url": "file:///etc/passwd"}]}]}
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "input[0].content[1]"


def test_langchain_human_message_with_an_image_part(gateway: GatewayServer, images: str) -> None:
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, model=VISION,  # type: ignore[arg-type]
                     max_tokens=64, max_retries=0)
    message = HumanMessage(content=[{"type": "text", "text": "Describe these."},
                                    {"type": "image_url", "image_url": {"url": data_url(YELLOW)}},
                                    {"type": "image_url", "image_url": {"url": f"{images}/blue.jpg"}}])
    assert llm.invoke([message]).content == "image 1: 40x40, yellow. image 2: 10x20, blue."
    assert "".join(str(c.content) for c in llm.stream([message])) == "image 1: 40x40, yellow. image 2: 10x20, blue."


def test_models_say_which_take_images(client: openai.OpenAI, http: httpx.Client) -> None:
    client.chat.completions.create(model="smollm2-135m-instruct-vllm", max_tokens=1,
                                   messages=[{"role": "user", "content": "hi"}])  # Triton's config read
    cards = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert cards[VISION]["capabilities"]["images"] is True
    assert cards["smollm2-135m-instruct-vllm"]["capabilities"]["images"] is False
    # TensorRT-LLM: the multimodal ensemble declares image_url_input; the plain ensemble no image input.
    client.chat.completions.create(model=VISION_TRTLLM, max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    client.chat.completions.create(model="smollm2-135m-instruct-trtllm-text", max_tokens=1,
                                   messages=[{"role": "user", "content": "hi"}])
    cards = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert cards[VISION_TRTLLM]["capabilities"]["images"] is True
    assert cards["smollm2-135m-instruct-trtllm-text"]["capabilities"]["images"] is False


@pytest.mark.parametrize("model", [LLM, "smollm2-135m-instruct-vllm"])
def test_a_model_without_image_input_refuses_the_part_by_name(http: httpx.Client, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                                         {"role": "user", "content": [{"type": "text", "text": "see"},
                                                                      image(data_url(RED))]}]}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages[2].content[1]"


# --- refusals ------------------------------------------------------------------------------------------------


def refusals(images: str, loopback_port: int) -> dict[str, tuple[str, str]]:
    p = loopback_port
    return {
        "loopback": (f"http://127.0.0.1:{p}/red.png", "loopback"),
        "ipv6-loopback": (f"http://[::1]:{p}/red.png", "loopback"),
        "localhost": (f"http://localhost:{p}/red.png", "loopback"),
        "redirect-to-loopback": (f"{images}/to-loopback.png", "loopback"),
        "file": ("file:///etc/passwd", "scheme"),
        "gopher": (f"gopher://127.0.0.1:{p}/_GET", "scheme"),
        "oversize": (f"{images}/big.png", "too_large"),
        "bomb": (f"{images}/bomb.png", "too_many_pixels"),
        "bomb-data-url": (data_url(png_bomb()), "too_many_pixels"),
        "not-an-image": (f"{images}/text.png", "not_image"),
        "data-not-base64": ("data:image/png,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk", "data_url"),
        "slow": (f"{images}/slow.png", "timeout"),
    }


CASES = ["loopback", "ipv6-loopback", "localhost", "redirect-to-loopback", "file", "gopher", "oversize", "bomb",
         "bomb-data-url", "not-an-image", "data-not-base64", "slow"]


@pytest.mark.parametrize("case", CASES)
def test_each_refusal_is_a_quick_400_naming_the_part_and_its_reason(
        http: httpx.Client, images: str, refused_servers: list[ThreadingHTTPServer], case: str) -> None:
    port = refused_servers[0].server_address[1]
    if case == "ipv6-loopback" and len(refused_servers) > 1:
        port = refused_servers[1].server_address[1]
    url, reason = refusals(images, port)[case]
    body = {"model": VISION, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, image(data_url(RED)), image(url)]}]}
    start = time.monotonic()
    r = http.post("/v1/chat/completions", json=body)
    elapsed = time.monotonic() - start
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[0].content[2]" and err["code"] == "invalid_image"
    assert f"(reason: {reason})" in err["message"], err["message"]
    assert elapsed < TIMEOUT_S + 3  # the slow host is cut at the deadline; every other refusal is at once
    assert all(s.hits == [] for s in refused_servers), [s.hits for s in refused_servers]  # type: ignore[attr-defined]


def test_more_images_than_the_cap(http: httpx.Client, images: str) -> None:
    parts = [image(f"{images}/red.png") for _ in range(MAX_IMAGES + 1)]
    r = http.post("/v1/chat/completions", json={"model": VISION, "messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == f"messages[0].content[{MAX_IMAGES}]" and "(reason: too_many_images)" in err["message"]


def test_a_slow_image_holds_up_no_other_request(gateway: GatewayServer, http: httpx.Client, images: str,
                                                client: openai.OpenAI) -> None:
    """While one request waits on a host sending a byte a second, /health and a short chat answer at once."""
    body = {"model": VISION, "messages": [{"role": "user", "content": [image(f"{images}/slow.png?again")]}]}
    result: dict[str, Any] = {}

    def slow() -> None:
        with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30) as c:
            result["response"] = c.post("/v1/chat/completions", json=body)

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.3)  # the slow fetch is under way
    start = time.monotonic()
    assert http.get("/health").status_code == 200
    answer = ask(client, [{"role": "user", "content": [image(data_url(GIF))]}], stream=False)
    elapsed = time.monotonic() - start
    assert answer == "image 1: 5x6, white."
    assert thread.is_alive(), "both answers came while the slow fetch was still waiting on its host"
    assert elapsed < TIMEOUT_S - 1
    thread.join()
    assert result["response"].status_code == 400 and "(reason: timeout)" in result["response"].text


def test_a_client_that_leaves_takes_its_image_fetch_along(triton: EmbeddedTriton, images: str,
                                                          image_host: Any) -> None:
    """One fetch slot, a minute's fetch timeout: a client that gives up on a request whose image host is slow
    closes the gateway's connection to that host, and the slot is free for the next request at once (it was
    held until the fetch timed out, a minute later, with the next request refused meanwhile)."""
    settings = Settings(config_file=Path("."), api_keys=[API_KEY], image_allowed_hosts=["127.0.0.2"],
                        image_fetch_timeout_s=60, image_fetch_concurrency=1)
    server = GatewayServer(gateway_config(triton), [API_KEY], settings).start()
    host = image_host
    try:
        body = {"model": VISION, "messages": [{"role": "user", "content": [image(f"{images}/hold.png?leaves")]}]}
        with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=server.url, timeout=2, headers={
                "Authorization": f"Bearer {API_KEY}"}) as c:
            c.post("/v1/chat/completions", json=body)
        deadline = time.monotonic() + 30
        while "/hold.png?leaves" not in host.cut and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "/hold.png?leaves" in host.cut, "the fetch went on after its client left"
        fresh = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, timeout=30, max_retries=0)
        answer = ask(fresh, [{"role": "user", "content": [image(f"{images}/red.png?after")]}], stream=False)
        assert answer == "image 1: 64x48, red."
    finally:
        server.stop()


def test_with_url_fetching_off_only_data_urls_are_taken(triton: EmbeddedTriton, images: str,
                                                        image_host: Any) -> None:
    settings = Settings(config_file=Path("."), api_keys=[API_KEY], image_allowed_hosts=["127.0.0.2"],
                        image_fetch="off")
    server = GatewayServer(gateway_config(triton), [API_KEY], settings).start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, timeout=30, max_retries=0)
        assert ask(client, [{"role": "user", "content": [image(data_url(RED))]}], stream=False) == \
            "image 1: 64x48, red."
        with pytest.raises(openai.BadRequestError) as info:
            ask(client, [{"role": "user", "content": [image(data_url(RED)), image(f"{images}/red.png?off")]}],
                stream=False)
        err: Any = info.value.body
        assert err["param"] == "messages[0].content[1]" and "(reason: url_off)" in err["message"]
        assert "/red.png?off" not in image_host.hits
    finally:
        server.stop()


def test_metrics_count_images_bytes_fetches_and_refusals(http: httpx.Client, client: openai.OpenAI,
                                                         images: str) -> None:
    ask(client, [{"role": "user", "content": [image(f"{images}/yellow.png")]}], stream=False)
    refused = {"model": VISION, "messages": [{"role": "user", "content": [image("http://127.0.0.1:9/x.png")]}]}
    assert http.post("/v1/chat/completions", json=refused).status_code == 400
    text = http.get("/metrics").text
    assert 'openai_api_images_total{source="url"}' in text
    assert 'openai_api_image_bytes_total{source="url"}' in text
    assert "openai_api_image_fetch_seconds_count" in text
    assert 'openai_api_image_refusals_total{reason="loopback"}' in text


# --- TensorRT-LLM's multimodal ensemble --------------------------------------------------------------------
# vision-trtllm speaks the ensemble's interface (image_url_input, the batch dim, "<|image|>" markers) and, like
# TensorRT-LLM's preprocessing model, takes only data:image/jpeg;base64 URLs without fetching: any other URL
# (the client's http URL, a PNG data URL) would be an error there, so these prove the gateway fetched,
# verified and re-encoded every image itself.

@STREAM
def test_trtllm_ensemble_gets_url_and_data_url_images_in_order(client: openai.OpenAI, images: str,
                                                               stream: bool) -> None:
    messages = [{"role": "user", "content": [image(data_url(RED)), {"type": "text", "text": "and"},
                                             image(f"{images}/green.webp")]}]
    assert ask(client, messages, stream, VISION_TRTLLM) == "image 1: 64x48, red. image 2: 33x7, green."
    messages = [{"role": "user", "content": [image(f"{images}/blue.jpg"), {"type": "text", "text": "this?"}]}]
    assert ask(client, messages, stream, VISION_TRTLLM) == "image 1: 10x20, blue."


@STREAM
def test_trtllm_ensemble_taking_pixels_gets_one_image(client: openai.OpenAI, http: httpx.Client, images: str,
                                                      stream: bool) -> None:
    """vision-trtllm-pixels declares image_bytes_input only: uint8 [1, 1, h, w, 3] through Triton's own shape
    checks; a second image is the gateway's 400 (the preprocessing reads one image per batch entry)."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "what?"}, image(f"{images}/green.webp")]}]
    assert ask(client, messages, stream, VISION_TRTLLM_PIXELS) == "image 1: 33x7, green."
    if not stream:
        body = {"model": VISION_TRTLLM_PIXELS, "messages": [{"role": "user", "content": [
            image(data_url(RED)), image(data_url(BLUE))]}]}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_images", r.text
        assert r.json()["error"]["param"] == "messages[0].content[1]", r.text


def test_trtllm_ensemble_refusals_are_the_gateways(http: httpx.Client, images: str) -> None:
    """A refused image never reaches the model (which would fetch it, being TensorRT-LLM's preprocessing)."""
    for url, reason in ((f"{images}/to-loopback.png", "loopback"), ("file:///etc/passwd", "scheme")):
        body = {"model": VISION_TRTLLM, "messages": [{"role": "user", "content": [image(url)]}]}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and f"(reason: {reason})" in r.text, r.text
        assert r.json()["error"]["param"] == "messages[0].content[0]"
