"""A vision-language stand-in for Triton's Python backend, speaking the vLLM backend's interface.

What it proves: the images a client sent reach the backend whole, decodable and in prompt order. It
decodes every image it gets, as vllm_backend does (`base64.b64decode`, then Pillow ``Image.open(...)
.convert("RGB")``), and answers with facts computed from the pixels, one sentence per image in order::

    image 1: 64x48, red. image 2: 10x20, blue.

(``no images.`` without any). The colour is the most common one after each pixel is mapped to the nearest
of ``PALETTE`` (the image is first shrunk to at most 128 x 128 pixels).

Wire (as ``smollm2-vllm``, plus the multimodal input; ``max_batch_size: 0``, decoupled):

* inputs: ``text_input`` BYTES [1]; ``image`` BYTES [-1] (optional: one base64 image file per element,
  no ``data:`` prefix); optional ``stream``, ``sampling_parameters`` (JSON; ``max_tokens`` honoured,
  default 16 as vLLM; other keys accepted and ignored), ``exclude_input_in_output`` and the ``return_*``
  flags.
* the prompt must hold exactly one ``image_placeholder`` (config parameter) per image, as vLLM requires
  of a multimodal prompt; a mismatch, an undecodable image or bad JSON is a FINAL ``TritonError``.
* output "tokens" are the answer's words (with their trailing space); ``max_tokens`` of them at most
  (``finish_reason`` "length"), else "stop". Streaming: one response per word, the last FINAL;
  non-streaming: one FINAL response (the prompt first unless ``exclude_input_in_output``).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PALETTE = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0),
           "cyan": (0, 255, 255), "magenta": (255, 0, 255), "orange": (255, 140, 0), "purple": (128, 0, 128),
           "white": (255, 255, 255), "black": (0, 0, 0), "gray": (128, 128, 128)}
NAMES = list(PALETTE)
COLOURS = np.array([PALETTE[n] for n in NAMES], dtype=np.int32)


class RequestError(Exception):
    pass


def _array(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _flag(request: Any, name: str) -> bool | None:
    arr = _array(request, name)
    return None if arr is None or arr.size == 0 else bool(arr.reshape(-1)[0])


def _text(raw: Any) -> str:
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


def dominant(image: Image.Image) -> str:
    small = image.copy()
    small.thumbnail((128, 128))
    pixels = np.asarray(small, dtype=np.int32).reshape(-1, 3)
    nearest = ((pixels[:, None, :] - COLOURS[None, :, :]) ** 2).sum(axis=2).argmin(axis=1)
    return NAMES[int(np.bincount(nearest, minlength=len(NAMES)).argmax())]


def describe(encoded: list[Any]) -> str:
    facts = []
    for k, raw in enumerate(encoded, 1):
        try:
            data = base64.b64decode(_text(raw), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise RequestError(f"image {k}: not base64 ({exc})") from None
        try:
            with Image.open(io.BytesIO(data)) as im:
                rgb = im.convert("RGB")
        except Exception as exc:  # noqa: BLE001 - any decoder failure is the request's error
            raise RequestError(f"image {k}: cannot be decoded ({type(exc).__name__}: {exc})") from None
        facts.append(f"image {k}: {rgb.width}x{rgb.height}, {dominant(rgb)}.")
    return " ".join(facts) if facts else "no images."


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.model_name = args.get("model_name", "vision-vllm")
        params = json.loads(args.get("model_config", "{}")).get("parameters", {})
        self.placeholder = params.get("image_placeholder", {}).get("string_value") or "<image>"

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
        if arr is None or arr.size != 1:
            raise RequestError("text_input is required: one string, shape [1]")
        prompt = _text(arr.reshape(-1)[0])
        images = _array(request, "image")
        encoded = [] if images is None else list(images.reshape(-1))
        found = prompt.count(self.placeholder)
        if found != len(encoded):
            raise RequestError(f"the prompt holds {found} image placeholder(s) {self.placeholder!r} but "
                               f"{len(encoded)} image(s) were sent")
        stream = bool(_flag(request, "stream"))
        exclude = _flag(request, "exclude_input_in_output")
        prepend = (not exclude) if exclude is not None else not stream
        if prepend and stream:
            raise RequestError("When streaming, `exclude_input_in_output` = False is not allowed.")
        params: dict[str, Any] = {}
        raw = _array(request, "sampling_parameters")
        if raw is not None and raw.size:
            try:
                params = json.loads(_text(raw.reshape(-1)[0]))
            except ValueError as exc:
                raise RequestError(f"sampling_parameters: not valid JSON ({exc})") from None
        max_tokens = int(params.get("max_tokens") or 16)
        words = [w + " " for w in describe(encoded).split(" ")]
        words[-1] = words[-1].rstrip()
        cut = len(words) > max_tokens
        words = words[:max_tokens]
        flags = {name: bool(_flag(request, name)) for name in (
            "return_finish_reason", "return_num_output_tokens", "return_num_input_tokens")}
        reason = "length" if cut else "stop"
        if stream:
            for k, word in enumerate(words):
                last = k == len(words) - 1
                self._send(sender, word, 1, reason if last else None, flags, len(prompt.split()), last)
        else:
            self._send(sender, (prompt if prepend else "") + "".join(words), len(words), reason, flags,
                       len(prompt.split()), True)

    def _send(self, sender: Any, text: str, count: int, reason: str | None, flags: dict[str, bool],
              prompt_words: int, final: bool) -> None:
        def tensor(name: str, value: Any, dtype: Any) -> Any:
            return pb_utils.Tensor(name, np.asarray([value], dtype=dtype))

        outputs = [tensor("text_output", text.encode("utf-8"), np.object_)]
        if flags["return_finish_reason"]:
            outputs.append(tensor("finish_reason", str(reason).encode(), np.object_))
        if flags["return_num_output_tokens"]:
            outputs.append(tensor("num_output_tokens", count, np.uint32))
        if flags["return_num_input_tokens"]:
            outputs.append(tensor("num_input_tokens", prompt_words, np.uint32))
        sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL if final else 0)

    def _error(self, sender: Any, message: str) -> None:
        code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
        error = pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)
        try:
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=FINAL)
        except Exception as exc:  # noqa: BLE001 - the client may already be gone
            pb_utils.Logger.log_warn(f"{self.model_name}: could not send error response: {exc}")

    def finalize(self) -> None:
        return None
