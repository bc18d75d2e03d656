"""LoRA adapters without a server: PEFT -> TensorRT-LLM conversion (layout checked against a delta computed here
from the PEFT tensors, written by the `safetensors` package), the checks against the base model, the config's
adapters (scan, multi_lora.json, collisions), and the TensorRT-LLM adapter's weights-once / resend-on-miss."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from openai_api.config import BUNDLED_CONFIG, ConfigError, load_config
from openai_api.errors import BackendError, InvalidRequestError
from openai_api.lora import (
    BaseShape,
    LoraAdapter,
    cast_weights,
    from_trtllm,
    read_adapter,
    read_safetensors,
    to_trtllm,
)
from openai_api.triton.tensorrt_llm import TensorRTLLMAdapter
from tests.helpers import MODELS
from tests.unit.test_protocol_adapters import TRTLLM_CONFIG, FakeClient, make, pb_result, request, sent, tensor

# A tiny Llama-shaped base: hidden 8, 2 heads of 4 (q 8), 1 KV head (k, v 4), MLP 12, 3 layers.
SHAPE = BaseShape(3, {"q_proj": (8, 8), "k_proj": (8, 4), "v_proj": (8, 4), "o_proj": (8, 8),
                      "gate_proj": (8, 12), "up_proj": (8, 12), "down_proj": (12, 8)})
MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
# TensorRT-LLM's module ids for them (its docs' table; its hf_lora_convert.py maps gate_proj -> mlp_h_to_4h,
# up_proj -> mlp_gate, down_proj -> mlp_4h_to_h).
IDS = {"q_proj": 1, "k_proj": 2, "v_proj": 3, "o_proj": 4, "gate_proj": 5, "down_proj": 6, "up_proj": 7}


def peft_folder(folder: Path, r: int = 2, alpha: float = 4.0, modules: tuple[str, ...] = ("q_proj", "v_proj",
                "down_proj"), layers: tuple[int, ...] = (0, 2), rslora: bool = False, dtype: Any = np.float32,
                shape: BaseShape = SHAPE, **cfg: Any) -> dict[str, np.ndarray]:
    """A PEFT adapter folder as peft's save_pretrained writes one; returns its tensors."""
    rng = np.random.default_rng(7)
    tensors = {}
    for layer in layers:
        for m in modules:
            d_in, d_out = shape.dims[m]
            key = f"base_model.model.model.layers.{layer}.{MODULES[m]}.{m}"
            tensors[f"{key}.lora_A.weight"] = rng.standard_normal((r, d_in)).astype(dtype)
            tensors[f"{key}.lora_B.weight"] = rng.standard_normal((d_out, r)).astype(dtype)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "use_rslora": rslora, "target_modules": list(modules),
              "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct", "bias": "none", **cfg}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return tensors


def test_peft_to_trtllm_layout(tmp_path: Path) -> None:
    tensors = peft_folder(tmp_path / "a", r=2, alpha=4.0)
    adapter = read_adapter(tmp_path / "a", "a", "base", SHAPE)
    adapter.check(SHAPE, 64)
    weights, config = adapter.trtllm_tensors("FP32")
    # One row per (layer, module), layer order then module id; [module id, layer, r].
    assert config.tolist() == [[1, 0, 2], [3, 0, 2], [6, 0, 2], [1, 2, 2], [3, 2, 2], [6, 2, 2]]
    assert config.dtype == np.int32 and weights.dtype == np.float32
    # Width: the widest row, r * (in + out): down_proj 2 * (12 + 8) = 40; q 2 * 16 = 32, v 2 * 12 = 24 (padded).
    assert weights.shape == (6, 40)
    for row, (module_id, layer, r) in zip(weights, config.tolist(), strict=True):
        name = next(m for m, i in IDS.items() if i == module_id)
        d_in, d_out = SHAPE.dims[name]
        key = f"base_model.model.model.layers.{layer}.{MODULES[name]}.{name}"
        a, b = tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"]
        np.testing.assert_array_equal(row[: r * d_in], a.reshape(-1))
        np.testing.assert_allclose(row[r * d_in: r * (d_in + d_out)], (b * 2.0).reshape(-1))  # alpha / r = 2
        assert not row[r * (d_in + d_out):].any()  # zero padding
        # The delta the row stands for is PEFT's: scale * B @ A @ x.
        x = np.arange(d_in, dtype=np.float32)
        a_row = row[: r * d_in].reshape(r, d_in)
        b_row = row[r * d_in: r * (d_in + d_out)].reshape(d_out, r)
        np.testing.assert_allclose(b_row @ (a_row @ x), 2.0 * (b @ (a @ x)), rtol=1e-5)


def test_rslora_scale_and_round_trip(tmp_path: Path) -> None:
    tensors = peft_folder(tmp_path / "a", r=4, alpha=8.0, rslora=True, modules=("gate_proj", "up_proj"))
    adapter = read_adapter(tmp_path / "a", "a", "base", SHAPE)
    key = "base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight"
    gate = next(m for m in adapter.modules if m.layer == 0 and m.module == "gate_proj")
    np.testing.assert_allclose(gate.b, tensors[key] * (8.0 / 2.0))  # rsLoRA: alpha / sqrt(r)
    weights, config = to_trtllm(adapter.modules, "FP32")
    assert sorted({row[0] for row in config.tolist()}) == [5, 7]  # gate -> mlp_h_to_4h, up -> mlp_gate
    back = from_trtllm(weights[np.newaxis], config[np.newaxis], SHAPE)  # the .npy files' [1, N, ...] shapes
    assert len(back) == len(adapter.modules)
    for m in back:
        orig = next(o for o in adapter.modules if (o.layer, o.module) == (m.layer, m.module))
        np.testing.assert_array_equal(m.a, orig.a)
        np.testing.assert_array_equal(m.b, orig.b)


def test_trtllm_npy_folder(tmp_path: Path) -> None:
    peft_folder(tmp_path / "peft")
    peft = read_adapter(tmp_path / "peft", "p", "base", SHAPE)
    w, c = peft.trtllm_tensors("FP32")
    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / "model.lora_weights.npy", w[np.newaxis].astype(np.float16))
    np.save(tmp_path / "npy" / "model.lora_config.npy", c[np.newaxis])
    npy = read_adapter(tmp_path / "npy", "n", "base", SHAPE)
    assert npy.format == "trtllm" and len(npy.modules) == len(peft.modules)
    w2, c2 = npy.trtllm_tensors("FP32")
    np.testing.assert_array_equal(c2, c)
    np.testing.assert_allclose(w2, w, rtol=1e-3, atol=1e-3)  # through FP16


def test_dtypes() -> None:
    w = np.asarray([[1.0, -2.5, 3.14159, 0.0]], dtype=np.float32)
    assert cast_weights(w, "FP16").dtype == np.float16
    bf16 = cast_weights(w, "BF16")
    assert bf16.dtype == np.uint16
    back = (bf16.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_allclose(back, w, rtol=1e-2)
    assert back[0, 0] == 1.0 and back[0, 1] == -2.5


def test_safetensors_bf16_and_f16(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file as save_torch

    values = torch.tensor([[0.5, -1.25], [3.0, 100.0]])
    save_torch({"x": values.to(torch.bfloat16), "y": values.to(torch.float16)}, str(tmp_path / "t.safetensors"))
    got = read_safetensors(tmp_path / "t.safetensors")
    np.testing.assert_array_equal(got["x"], values.numpy())
    np.testing.assert_array_equal(got["y"], values.numpy())


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"r": 128}, "rank 128"),                             # over max_lora_rank
    ({"shape": BaseShape(3, {**SHAPE.dims, "q_proj": (16, 16)})}, "hidden size mismatch"),  # another model's
    ({"layers": (0, 5)}, "layer 5 does not exist"),
])
def test_checks_against_the_base(tmp_path: Path, kwargs: dict[str, Any], words: str) -> None:
    peft_folder(tmp_path / "a", **kwargs)
    adapter = read_adapter(tmp_path / "a", "a", "base", SHAPE)
    with pytest.raises(ValueError, match=words):
        adapter.check(SHAPE, 64)


@pytest.mark.parametrize(("edit", "words"), [
    (lambda f: (f / "adapter_model.safetensors").unlink(), "adapter_model.safetensors is missing"),
    (lambda f: (f / "adapter_config.json").write_text(json.dumps({"r": 3, "peft_type": "LORA"})), "says r=3"),
    (lambda f: (f / "adapter_config.json").write_text(json.dumps({"r": 2, "use_dora": True})), "use_dora"),
    (lambda f: (f / "adapter_config.json").write_text("{not json"), "cannot be read"),
])
def test_unreadable_adapters(tmp_path: Path, edit: Any, words: str) -> None:
    peft_folder(tmp_path / "a")
    edit(tmp_path / "a")
    with pytest.raises(ValueError, match=words):
        read_adapter(tmp_path / "a", "a", "base", SHAPE)


# ------------------------------------------------------------------ config
def config_with(tmp_path: Path, llm_extra: dict[str, Any]) -> Path:
    data = json.loads(BUNDLED_CONFIG.read_text())
    for kind in ("llm", "embedding", "rerank"):
        for m in data[kind]:
            m["path"] = str((BUNDLED_CONFIG.parent / m["path"]).resolve())
            if m.get("chat_template"):
                m["chat_template"] = str((BUNDLED_CONFIG.parent / m["chat_template"]).resolve())
    data["llm"] = [data["llm"][0] | llm_extra, data["llm"][1]]
    data["model_infos"] = [i for i in data["model_infos"] if i["name"] in {m["name"] for m in data["llm"]}]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


needs_base = pytest.mark.skipif(not (MODELS / "smollm2-135m-instruct" / "config.json").is_file(),
                                reason="the prepared SmolLM2 folder (scripts/setup.sh)")
SMOL = BaseShape.from_folder(MODELS / "smollm2-135m-instruct")


@needs_base
def test_config_scan_listing_and_collisions(tmp_path: Path) -> None:
    assert SMOL is not None
    root = tmp_path / "adapters"
    peft_folder(root / "scanned", shape=SMOL, layers=(0, 29))
    peft_folder(tmp_path / "listed", shape=SMOL)
    (root / "multi_lora.json").write_text(json.dumps({"backend-only": "/nowhere/on/this/machine"}))
    cfg = load_config(config_with(tmp_path, {"adapters_dir": str(root), "adapters": [
        {"name": "listed", "source": str(tmp_path / "listed"), "base": "smollm2-135m-instruct"}]}))
    from openai_api.config import adapters_of

    loaded = {a.name: a for a in adapters_of(cfg.llm[0])}
    assert set(loaded) == {"listed", "scanned", "backend-only"}
    assert loaded["scanned"].base == "smollm2-135m-instruct" and loaded["scanned"].source == root / "scanned"
    assert not loaded["backend-only"].modules and loaded["backend-only"].root == "backend-only"
    # Names collide with a model, with another base's adapter, or fail the base check: one line naming both.
    with pytest.raises(ConfigError, match="'smollm2-135m-instruct-vllm' of model 'smollm2-135m-instruct' has the "
                                          "same name as model 'smollm2-135m-instruct-vllm'"):
        load_config(config_with(tmp_path, {"adapters": [{"name": "smollm2-135m-instruct-vllm"}]}))
    with pytest.raises(ConfigError, match="not 'llama-3'"):
        load_config(config_with(tmp_path, {"adapters": [{"name": "x", "source": str(tmp_path / "listed"),
                                                         "base": "llama-3"}]}))
    bad = tmp_path / "bad"
    shutil.copytree(tmp_path / "listed", bad)
    peft_folder(bad, shape=SHAPE)  # an adapter of another (smaller) model
    with pytest.raises(ConfigError, match=r"adapters\[0\].*hidden size mismatch"):
        load_config(config_with(tmp_path, {"adapters": [{"name": "x", "source": str(bad)}]}))


# ------------------------------------------------------------------ the TensorRT-LLM adapter
LORA_CONFIG = {"config": {**TRTLLM_CONFIG["config"], "input": [
    *TRTLLM_CONFIG["config"]["input"], tensor("lora_task_id", "UINT64", [1], True),
    tensor("lora_weights", "FP16", [-1, -1], True), tensor("lora_config", "INT32", [-1, 3], True)]}}


class MissingClient(FakeClient):
    """A Triton whose LoRA cache holds nothing it was not just sent: an id-only request fails as TensorRT-LLM's."""

    async def _miss(self, req: Any) -> Any:
        raise BackendError("failed", detail=f"LoRA task {sent(req)['lora_task_id'].item()} not found in cache. "
                                            "Please send LoRA weights with request")
        yield

    def stream(self, request: Any, **kw: Any) -> Any:
        if "lora_task_id" in request.inputs() and "lora_weights" not in request.inputs() and self.forget:
            self.requests.append(request)
            return self._miss(request)
        return super().stream(request, **kw)

    forget = False


def tiny_adapter(tmp_path: Path) -> LoraAdapter:
    peft_folder(tmp_path / "a")
    return read_adapter(tmp_path / "a", "a", "m", SHAPE)


async def drain(adapter: Any, req: Any) -> list[int]:
    return [t for c in [c async for c in adapter.generate(req)] for t in c.token_ids]


async def test_weights_once_then_id_then_resend_on_miss(tmp_path: Path) -> None:
    lora = tiny_adapter(tmp_path)
    events: list[str] = []
    lora.on_event = events.append
    client = MissingClient(LORA_CONFIG, [pb_result(output_ids=np.asarray([[[9]]], dtype=np.int32))])
    adapter = make(TensorRTLLMAdapter, client, "tensorrt_llm")
    assert adapter.supports("lora")
    assert await drain(adapter, request(lora=lora)) == [9]
    first = sent(client.requests[-1])
    assert first["lora_task_id"].tolist() == [[lora.task_id]] and first["lora_weights"].dtype == np.float16
    w, c = lora.trtllm_tensors("FP16")
    assert first["lora_weights"].shape == (1, *w.shape) and first["lora_config"].tolist() == [c.tolist()]
    await drain(adapter, request(lora=lora))
    assert set(client.requests[-1].inputs()) >= {"lora_task_id"} and "lora_weights" not in client.requests[-1].inputs()
    assert events == ["weights_sent"]
    client.forget = True  # evicted: the id alone fails, the gateway resends the weights once, the client sees tokens
    n = len(client.requests)
    assert await drain(adapter, request(lora=lora)) == [9]
    assert ["lora_weights" in r.inputs() for r in client.requests[n:]] == [False, True]
    assert events == ["weights_sent", "cache_misses", "weights_sent"]


async def test_lora_refused_by_a_model_without_lora_inputs(tmp_path: Path) -> None:
    adapter = make(TensorRTLLMAdapter, FakeClient(TRTLLM_CONFIG), "tensorrt_llm")
    assert not adapter.supports("lora")
    with pytest.raises(InvalidRequestError, match="takes no LoRA"):
        await drain(adapter, request(lora=tiny_adapter(tmp_path)))


def test_task_id_stable_and_content_bound(tmp_path: Path) -> None:
    one = tiny_adapter(tmp_path)
    again = read_adapter(tmp_path / "a", "a", "m", SHAPE)
    assert one.task_id == again.task_id and 0 < one.task_id < 2**63
    peft_folder(tmp_path / "b", r=3)
    assert read_adapter(tmp_path / "b", "a", "m", SHAPE).task_id != one.task_id  # same name, new weights


def test_adapters_travel_to_worker_processes(tmp_path: Path) -> None:
    import pickle

    one = tiny_adapter(tmp_path)
    one.trtllm_tensors("FP16")
    one.on_event = print
    copy = pickle.loads(pickle.dumps(one))
    assert copy.task_id == one.task_id and copy.on_event is None
    np.testing.assert_array_equal(copy.trtllm_tensors("FP16")[0], one.trtllm_tensors("FP16")[0])


# ------------------------------------------------------------------ a full LoRA cache
# The words each backend uses (TensorRT-LLM's peftCacheManager.cpp, current and older; vLLM's LoRA manager).
CACHE_FULL = ["PEFT Cache is full. Could not store taskId=7",
              "Encountered an error when fetching new request: Error storing task=1 in PEFT cache -- Cache is full. "
              "There are no done tasks to evict",
              "No free lora slots",
              "Number of requested LoRAs (3) is greater than the number of GPU LoRA slots (2)."]


@pytest.mark.parametrize("words", CACHE_FULL)
def test_a_full_lora_cache_is_a_retryable_503_in_both_shapes(words: str) -> None:
    from openai_api.errors import AdapterCacheFullError, anthropic_error_body, error_body
    from openai_api.triton.errors import map_triton_error
    from openai_api.triton.rpc import ResponseError

    err = map_triton_error(ResponseError(f"[TensorRT-LLM][ERROR] {words}"), "m")
    assert isinstance(err, AdapterCacheFullError) and err.status == 503 and err.headers == {"Retry-After": "1"}
    assert error_body(err)["error"]["code"] == "lora_cache_full" and error_body(err)["error"]["type"] == "server_error"
    assert "full" in err.message and "m" in err.message and "taskId" not in err.message  # Triton's words: the log
    assert anthropic_error_body(err)["error"]["type"] == "overloaded_error"  # Anthropic's 529, which its SDKs retry


def test_a_cache_miss_is_not_a_full_cache() -> None:
    from openai_api.triton.errors import map_triton_error
    from openai_api.triton.rpc import ResponseError

    err = map_triton_error(ResponseError("LoRA task 5 not found in cache. Please send LoRA weights with request"), "m")
    assert type(err) is BackendError


class FullClient(FakeClient):
    """A Triton whose LoRA cache is full of adapters in use: every request on an adapter fails as TensorRT-LLM's."""

    async def _full(self) -> Any:
        from openai_api.triton.errors import map_triton_error
        from openai_api.triton.rpc import ResponseError

        raise map_triton_error(ResponseError("PEFT Cache is full. Could not store taskId=3"), "m")
        yield

    def stream(self, request: Any, **kw: Any) -> Any:
        self.requests.append(request)
        return self._full()


async def test_a_full_cache_reaches_the_client_once_without_a_resend_loop(tmp_path: Path) -> None:
    from openai_api.errors import AdapterCacheFullError

    client = FullClient(LORA_CONFIG)
    adapter = make(TensorRTLLMAdapter, client, "tensorrt_llm")
    with pytest.raises(AdapterCacheFullError):
        await drain(adapter, request(lora=tiny_adapter(tmp_path)))
    assert len(client.requests) == 1  # not retried as a cache miss: the weights were in the request
