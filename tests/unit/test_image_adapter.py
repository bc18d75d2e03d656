"""How images reach Triton: the vLLM adapter's `image` input (one base64 element per image, in order, no
`data:` prefix), the capability read from Triton's config, and protocols without images refusing them."""

from __future__ import annotations

import base64
import json

import pytest

from openai_api.errors import InvalidRequestError
from openai_api.triton.auto import AutoLLMBackend
from openai_api.triton.llm import ImageInput
from openai_api.triton.tensorrt_llm import TensorRTLLMAdapter
from openai_api.triton.vllm import VLLMAdapter
from tests.image_samples import solid
from tests.unit.test_protocol_adapters import (
    TRTLLM_CONFIG,
    VLLM_CONFIG,
    FakeClient,
    FakePool,
    collect,
    make,
    request,
    sent,
    tensor,
    vllm_result,
)


def with_image_input(config: dict[str, object], dtype: str = "STRING") -> dict[str, object]:
    cfg = json.loads(json.dumps(config))
    cfg["config"]["input"].append(tensor("image", dtype, [-1], True))
    return cfg  # type: ignore[no-any-return]


def image(data: bytes, param: str = "messages[0].content[0]") -> ImageInput:
    return ImageInput(data=data, b64=base64.b64encode(data), mime="image/png", width=1, height=1, digest="d",
                      param=param)


async def test_vllm_sends_each_image_as_one_raw_base64_element_in_order() -> None:
    client = FakeClient(with_image_input(VLLM_CONFIG), [vllm_result("ok", 1, "stop")])
    adapter = make(VLLMAdapter, client, "vllm")
    assert adapter.supports("images")
    red, blue = solid(3, 2, "red"), solid(2, 3, "blue", "JPEG")
    await collect(adapter.generate(request(images=[image(red), image(blue)])))
    t = sent(client.requests[0])
    assert t["image"].shape == (2,)  # no batch dim (max_batch_size 0), one element per image
    assert [base64.b64decode(v) for v in t["image"].tolist()] == [red, blue]
    assert not any(v.startswith(b"data:") for v in t["image"].tolist())


async def test_vllm_without_images_sends_no_image_input() -> None:
    client = FakeClient(with_image_input(VLLM_CONFIG), [vllm_result("ok", 1, "stop")])
    await collect(make(VLLMAdapter, client, "vllm").generate(request()))
    assert "image" not in sent(client.requests[0])


@pytest.mark.parametrize("config", [VLLM_CONFIG, with_image_input(VLLM_CONFIG, "INT32"), TRTLLM_CONFIG])
async def test_a_model_without_a_bytes_image_input_takes_no_images(config: dict[str, object]) -> None:
    cls = TensorRTLLMAdapter if config is TRTLLM_CONFIG else VLLMAdapter
    adapter = make(cls, FakeClient(config), "m")
    assert not adapter.supports("images")


async def test_images_reaching_a_backend_first_resolved_at_request_time_are_refused() -> None:
    """Triton was down when the services asked (`supports` said True until the config was read)."""
    client = FakeClient(TRTLLM_CONFIG)
    backend = AutoLLMBackend(FakePool(client), "u", "m", "tensorrt_llm")  # type: ignore[arg-type]
    assert backend.supports("images")
    with pytest.raises(InvalidRequestError) as e:
        await collect(backend.generate(request(images=[image(solid(1, 1, "red"), "messages[2].content[1]")])))
    assert client.requests == [] and not backend.supports("images")
    assert e.value.param == "messages[2].content[1]"  # the part, as the services name it
