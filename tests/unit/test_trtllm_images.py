"""How images reach TensorRT-LLM's multimodal ensemble (`tensorrt_llm_text` protocol): `image_url_input` as
JPEG data URLs (the only form its preprocessing decodes without fetching), else `image_bytes_input` pixels,
`prompt_table_extra_id` when KV reuse is on, and the capability read from the model's config. The expected
values come from Pillow decoding the test's own images, never from the gateway's encoder."""

from __future__ import annotations

import base64
import copy
import hashlib
import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from openai_api.errors import InvalidRequestError
from openai_api.triton.detect import protocol_mismatches
from openai_api.triton.llm import ImageInput
from openai_api.triton.text import TensorRTLLMTextAdapter, TextAdapter, TextWire
from openai_api.triton.wire import parse_model_config
from tests.image_samples import COLOURS, solid
from tests.unit.test_protocol_adapters import FakeClient, collect, make, request, sent, tensor
from tests.unit.test_text_protocols import ENSEMBLE, text_result

PREFIX = b"data:image/jpeg;base64,"


def ensemble(*inputs: dict[str, Any], **parameters: str) -> dict[str, Any]:
    """The ensemble config with the multimodal ensemble's extra inputs (all_models/multimodal/ensemble)."""
    cfg: dict[str, Any] = copy.deepcopy(ENSEMBLE)
    cfg["config"]["input"] = [*cfg["config"]["input"], *inputs]
    cfg["config"]["parameters"] = {k: {"string_value": v} for k, v in parameters.items()}
    return cfg


URL = tensor("image_url_input", "STRING", [-1], True)
PIXELS = tensor("image_bytes_input", "UINT8", [-1, -1, -1, -1], True)
EXTRA_ID = tensor("prompt_table_extra_id", "UINT64", [1], True)


def image(data: bytes, part: int = 0) -> ImageInput:
    with Image.open(io.BytesIO(data)) as im:
        mime, (w, h) = Image.MIME[str(im.format)], im.size
    return ImageInput(data=data, b64=base64.b64encode(data), mime=mime, width=w, height=h,
                      digest=hashlib.sha256(data).hexdigest(), param=f"messages[0].content[{part}]")


def decode(url: bytes) -> Image.Image:
    assert url.startswith(PREFIX)
    im = Image.open(io.BytesIO(base64.b64decode(url[len(PREFIX):], validate=True)))
    assert im.format == "JPEG"
    return im.convert("RGB")


def near(pixel: Any, colour: str) -> bool:
    return all(abs(a - b) <= 12 for a, b in zip(pixel, COLOURS[colour], strict=True))


async def send(config: dict[str, Any], images: list[bytes]) -> dict[str, np.ndarray[Any, Any]]:
    client = FakeClient(config, [text_result("ok", 1)])
    await collect(make(TensorRTLLMTextAdapter, client, "ensemble").generate(
        request(images=[image(d, j) for j, d in enumerate(images)])))
    return sent(client.requests[0])


async def test_images_go_as_jpeg_data_urls_in_order_with_the_batch_dim() -> None:
    png, gif, jpeg = solid(6, 4, "red"), solid(3, 5, "blue", "GIF"), solid(7, 2, "green", "JPEG")
    t = await send(ensemble(URL, PIXELS), [png, gif, jpeg])
    assert "image_bytes_input" not in t and "prompt_table_extra_id" not in t  # the URL input wins; no reuse
    urls = t["image_url_input"]
    assert urls.shape == (1, 3)
    ims = [decode(u) for u in urls[0].tolist()]
    assert [im.size for im in ims] == [(6, 4), (3, 5), (7, 2)]
    assert [near(im.getpixel((1, 1)), c) for im, c in zip(ims, ("red", "blue", "green"), strict=True)] == [True] * 3
    assert urls[0][2] == PREFIX + base64.b64encode(jpeg)  # a client's RGB JPEG goes as it came


async def test_a_model_taking_pixels_gets_them_for_one_image_and_refuses_two() -> None:
    data = solid(5, 3, "yellow", "WEBP")
    t = await send(ensemble(PIXELS), [data])
    assert "image_url_input" not in t
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.uint8)
    assert t["image_bytes_input"].dtype == np.uint8 and t["image_bytes_input"].shape == (1, 1, 3, 5, 3)
    assert np.array_equal(t["image_bytes_input"][0, 0], expected)
    with pytest.raises(InvalidRequestError) as e:
        await send(ensemble(PIXELS), [data, data])
    assert e.value.code == "too_many_images" and "one per request" in e.value.message
    assert e.value.param == "messages[0].content[1]"  # the first image past the cap, as the services name parts


async def test_max_num_images_in_the_config_caps_the_images_sent_by_url() -> None:
    red = solid(2, 2, "red")
    assert (await send(ensemble(URL, max_num_images="2"), [red, red]))["image_url_input"].shape == (1, 2)
    with pytest.raises(InvalidRequestError) as e:
        await send(ensemble(URL, max_num_images="2"), [red, red, red])
    assert e.value.code == "too_many_images" and "at most 2 image(s)" in e.value.message
    assert e.value.param == "messages[0].content[2]"
    assert (await send(ensemble(URL, max_num_images="${max_num_images}"), [red] * 3))["image_url_input"].shape == (1, 3)


async def test_the_prompt_table_id_is_sent_with_kv_reuse_and_follows_the_images() -> None:
    red, blue = solid(4, 4, "red"), solid(4, 4, "blue")
    config = ensemble(URL, EXTRA_ID, enable_kv_cache_reuse="true")
    ids = [int((await send(config, imgs))["prompt_table_extra_id"].reshape(-1)[0])
           for imgs in ([red], [red], [blue], [red, blue], [blue, red])]
    assert (await send(config, [red]))["prompt_table_extra_id"].shape == (1, 1)
    assert ids[0] == ids[1] and len(set(ids[1:])) == 4 and min(ids) >= 1
    assert "prompt_table_extra_id" not in await send(ensemble(URL, EXTRA_ID), [red])  # reuse not on
    client = FakeClient(config, [text_result("ok", 1)])
    await collect(make(TensorRTLLMTextAdapter, client, "ensemble").generate(request()))
    assert "prompt_table_extra_id" not in sent(client.requests[0]) and "image_url_input" not in sent(client.requests[0])


@pytest.mark.parametrize("inputs", [(), (tensor("image_url_input", "INT32", [-1], True),),
                                    (tensor("image_bytes_input", "UINT8", [-1, -1], True),)])
async def test_an_ensemble_without_a_usable_image_input_takes_no_images(inputs: tuple[dict[str, Any], ...]) -> None:
    client = FakeClient(ensemble(*inputs), [text_result("ok", 1)])
    adapter = make(TensorRTLLMTextAdapter, client, "ensemble")
    assert not adapter.supports("images")
    with pytest.raises(InvalidRequestError) as e:
        await collect(adapter.generate(request(images=[image(solid(2, 2, "red"))])))
    assert e.value.param == "images" and not client.requests


# TensorRT-LLM's LLM-API model (all_models/llmapi/tensorrt_llm): a `text` model whose block names `image_url`.
LLMAPI_BLOCK = {"input": "text_input", "output": "text_output", "max_tokens": "sampling_param_max_tokens",
                "stream": "streaming", "image_url": "image_url"}


def llmapi(*inputs: dict[str, Any]) -> dict[str, Any]:
    return {"config": {
        "name": "tensorrt_llm", "backend": "python", "max_batch_size": 64,
        "input": [tensor("text_input", "STRING", [-1]), tensor("streaming", "BOOL", [1], True),
                  tensor("sampling_param_max_tokens", "INT32", [1], True), *inputs],
        "output": [tensor("text_output", "STRING", [-1])]}}


async def test_the_llmapi_image_url_input_gets_jpeg_data_urls_when_the_block_names_it() -> None:
    client = FakeClient(llmapi(tensor("image_url", "STRING", [-1], True)), [text_result("ok")])
    adapter = TextAdapter(client, parse_model_config(client.config),  # type: ignore[arg-type]
                          wire=TextWire.configured(LLMAPI_BLOCK), model="m", triton_model="tensorrt_llm")
    assert adapter.supports("images")
    png, jpeg = solid(3, 2, "white"), solid(2, 3, "black", "JPEG")
    await collect(adapter.generate(request(images=[image(png), image(jpeg)])))
    urls = sent(client.requests[0])["image_url"]
    assert urls.shape == (1, 2) and [decode(u).size for u in urls[0].tolist()] == [(3, 2), (2, 3)]
    assert protocol_mismatches("text", parse_model_config(llmapi()), TextWire.configured(LLMAPI_BLOCK)) == [
        "no input 'image_url' (text_protocol.image_url)"]
    plain = TextAdapter(client, parse_model_config(client.config),  # type: ignore[arg-type]
                        wire=TextWire.configured({k: v for k, v in LLMAPI_BLOCK.items() if k != "image_url"}),
                        model="m", triton_model="tensorrt_llm")
    assert not plain.supports("images")
