"""A vision-language stand-in for Triton's Python backend, speaking TensorRT-LLM's multimodal ensemble interface.

What it proves: the images a client sent reach a TensorRT-LLM multimodal deployment whole, decodable, in
prompt order and in the only forms its preprocessing model takes without reaching the network. It decodes
every image it gets and answers as ``vision-vllm`` does (its ``dominant`` colour finder, loaded from
``../../vision-vllm/1/model.py`` or the config's ``vision_vllm_model`` path), one sentence per image in order::

    image 1: 64x48, red. image 2: 10x20, blue.

(``no images.`` without any).

Wire (``max_batch_size: 8``: every tensor has a leading batch dim of 1; decoupled):

* ``text_input`` BYTES [1, 1]; ``max_tokens`` INT32 [1, 1] (the answer's words, at most);
* ``image_url_input`` BYTES [1, n]: each element must be ``data:image/jpeg;base64,<JPEG>``, what
  tensorrtllm_backend's preprocessing decodes itself (it would fetch any other string with ``requests.get``;
  this model refuses it instead, so a gateway that lets Triton fetch fails);
* ``image_bytes_input`` UINT8 [1, n, height, width, 3]: the pixels (only one of the two image inputs);
* ``prompt_table_extra_id`` UINT64 [1, 1]: at least 1, and required with images when the config's
  ``enable_kv_cache_reuse`` is true (as the real ensemble requires it then);
* ``stream`` BOOL: one response per word (deltas, as the ensemble's postprocessing decodes each response's
  tokens on their own), the last FINAL; else one FINAL response holding the prompt and then the answer (the
  multimodal ensemble has no ``exclude_input_in_output``); other sampling inputs accepted and ignored.
* the prompt must hold exactly one ``image_placeholder`` (config parameter) per image, as mllama's processor
  requires; any mismatch or undecodable image is a FINAL ``TritonError``.
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
JPEG_PREFIX = "data:image/jpeg;base64,"


def _load_vision_vllm(where: str) -> Any:
    """vision-vllm's model module (its colour finder), under its own name: both files are `model.py`."""
    path = Path(where) if where else Path(__file__).resolve().parents[2] / "vision-vllm" / "1" / "model.py"
    spec = importlib.util.spec_from_file_location("vision_vllm_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RequestError(Exception):
    pass


def _array(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _text(raw: Any) -> str:
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


def images_from_urls(urls: list[Any]) -> list[Image.Image]:
    out = []
    for k, raw in enumerate(urls, 1):
        url = _text(raw)
        if not url.startswith(JPEG_PREFIX):
            raise RequestError(f"image {k}: image_url_input {url[:40]!r} is not a data:image/jpeg;base64 URL "
                               "(the TensorRT-LLM preprocessing model would fetch it from the network)")
        try:
            data = base64.b64decode(url[len(JPEG_PREFIX):], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise RequestError(f"image {k}: not base64 ({exc})") from None
        try:
            with Image.open(io.BytesIO(data)) as im:
                if im.format != "JPEG":
                    raise RequestError(f"image {k}: the data URL says JPEG but holds {im.format}")
                out.append(im.convert("RGB"))
        except RequestError:
            raise
        except Exception as exc:  # noqa: BLE001 - any decoder failure is the request's error
            raise RequestError(f"image {k}: cannot be decoded ({type(exc).__name__}: {exc})") from None
    return out


def images_from_pixels(pixels: np.ndarray) -> list[Image.Image]:
    if pixels.ndim != 5 or pixels.shape[0] != 1 or pixels.shape[-1] != 3:
        raise RequestError(f"image_bytes_input must be [1, images, height, width, 3], not {list(pixels.shape)}")
    return [Image.fromarray(np.ascontiguousarray(p, dtype=np.uint8), "RGB") for p in pixels[0]]


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.model_name = args.get("model_name", "vision-trtllm")
        params = json.loads(args.get("model_config", "{}")).get("parameters", {})
        self.placeholder = params.get("image_placeholder", {}).get("string_value") or "<|image|>"
        reuse = params.get("enable_kv_cache_reuse", {}).get("string_value", "")
        self.kv_reuse = reuse.strip().lower() in ("true", "1", "yes")
        self.dominant = _load_vision_vllm(params.get("vision_vllm_model", {}).get("string_value", "")).dominant

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._serve(request, sender)
            except RequestError as exc:
                self._error(sender, str(exc))
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the model
                self._error(sender, f"invalid request: {type(exc).__name__}: {exc}")

    def _serve(self, request: Any, sender: Any) -> None:
        arr = _array(request, "text_input")
        if arr is None or arr.shape != (1, 1):
            raise RequestError("text_input is required: one string, shape [1, 1]")
        prompt = _text(arr.reshape(-1)[0])
        urls, pixels = _array(request, "image_url_input"), _array(request, "image_bytes_input")
        if urls is not None and pixels is not None:
            raise RequestError("send only one of image_url_input and image_bytes_input")
        if urls is not None:
            if urls.ndim != 2 or urls.shape[0] != 1:
                raise RequestError(f"image_url_input must be [1, images], not {list(urls.shape)}")
            images = images_from_urls(list(urls.reshape(-1)))
        else:
            images = images_from_pixels(pixels) if pixels is not None else []
        found = prompt.count(self.placeholder)
        if found != len(images):
            raise RequestError(f"the prompt holds {found} image placeholder(s) {self.placeholder!r} but "
                               f"{len(images)} image(s) were sent")
        extra = _array(request, "prompt_table_extra_id")
        if extra is not None and int(extra.reshape(-1)[0]) < 1:
            raise RequestError("prompt_table_extra_id must be at least 1")
        if images and self.kv_reuse and extra is None:
            raise RequestError("prompt_table_extra_id is required with images when KV-cache reuse is on")
        limit = _array(request, "max_tokens")
        max_tokens = int(limit.reshape(-1)[0]) if limit is not None and limit.size else 16
        stream_flag = _array(request, "stream")
        stream = bool(stream_flag.reshape(-1)[0]) if stream_flag is not None and stream_flag.size else False
        facts = [f"image {k}: {im.width}x{im.height}, {self.dominant(im)}." for k, im in enumerate(images, 1)]
        words = [w + " " for w in (" ".join(facts) if facts else "no images.").split(" ")]
        words[-1] = words[-1].rstrip()
        words = words[:max(max_tokens, 0)]
        if stream:
            for k, word in enumerate(words):
                self._send(sender, word, k == len(words) - 1)
            if not words:
                self._send(sender, "", True)
        else:
            self._send(sender, prompt + "".join(words), True)

    def _send(self, sender: Any, text: str, final: bool) -> None:
        out = pb_utils.Tensor("text_output", np.asarray([[text.encode("utf-8")]], dtype=np.object_))
        sender.send(pb_utils.InferenceResponse(output_tensors=[out]), flags=FINAL if final else 0)

    def _error(self, sender: Any, message: str) -> None:
        code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
        error = pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)
        try:
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=FINAL)
        except Exception as exc:  # noqa: BLE001 - the client may already be gone
            pb_utils.Logger.log_warn(f"{self.model_name}: could not send error response: {exc}")

    def finalize(self) -> None:
        return None
