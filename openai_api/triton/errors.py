"""Triton's failures in the gateway's one error taxonomy (`openai_api.errors`), without leaking internals.

tritonclient, grpc.aio and aiohttp each fail in their own types and words; `map_triton_error` reads the
gRPC status (by name) or the message and decides: unreachable Triton and unknown or unready models are
503 naming the model, deadlines 504, a backend whose LoRA adapter cache is full a 503 `lora_cache_full` with
`Retry-After`, everything else a 502 naming the model (Triton's own message goes to the log only: it can
carry a backend's exception text).
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys

from tritonclient.utils import InferenceServerException

from openai_api.errors import (
    AdapterCacheFullError,
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    GatewayError,
)

logger = logging.getLogger(__name__)

# gRPC status codes (by name, so no grpc import is needed here) -> what they mean for the client.
_GRPC_UNAVAILABLE = {"UNAVAILABLE", "UNKNOWN_CONNECTION", "ABORTED"}
_CONNECTION_WORDS = ("failed to connect", "connect call failed", "cannot connect", "connection refused",
                     "socket closed", "connection reset", "server disconnected", "broken pipe",
                     "connection aborted", "end of tcp stream", "eof occurred", "transport is closing")


def _grpc_code(err: BaseException) -> str:
    """The gRPC status name of a raw grpc.aio.AioRpcError (what stream iteration raises), else ""."""
    code = getattr(err, "code", None)
    if callable(code):
        try:
            c = code()
        except Exception:  # noqa: BLE001 - not a gRPC error after all
            return ""
        return str(getattr(c, "name", c) or "")
    return ""


def map_triton_error(err: BaseException, model: str) -> GatewayError:
    """Translate a tritonclient / grpc / aiohttp exception into the gateway's taxonomy without leaking
    internals: unreachable Triton and unknown/unready models are 503 (naming the model), deadlines 504,
    everything else Triton refused is 502 naming the model (Triton's own message is logged, not sent)."""
    if isinstance(err, GatewayError):
        return err
    if isinstance(err, asyncio.TimeoutError | TimeoutError):
        return BackendTimeoutError(f"The model {model!r} did not answer in time.")
    status = ""
    message = str(err)
    if isinstance(err, InferenceServerException):
        status = str(err.status() or "")
        message = err.message() or message
    else:
        status = _grpc_code(err)
        details = getattr(err, "details", None)
        if callable(details):
            try:
                message = str(details() or message)
            except Exception:  # noqa: BLE001
                pass
    lowered = message.lower()
    status_l = status.lower()
    if "deadline" in status_l or "deadline exceeded" in lowered:
        return BackendTimeoutError(f"The model {model!r} did not answer in time.")
    if is_adapter_cache_full(lowered):
        logger.warning("triton: the LoRA cache of model %s is full (%s); raise the backend's LoRA cache size "
                       "(TensorRT-LLM: lora_cache_host_memory_bytes, lora_cache_gpu_memory_fraction; vLLM: "
                       "max_loras) or run fewer adapters at once", model, message[:300])
        return AdapterCacheFullError(f"The LoRA adapter cache of model {model!r} is full: every adapter it holds "
                                     "is in use by running requests. Retry shortly.",
                                     headers={"Retry-After": "1"}, detail=message[:2000])
    if "unknown model" in lowered or "is not ready" in lowered or ("not found" in lowered and "model" in lowered) \
            or "no available versions" in lowered:
        return BackendUnavailableError(f"The model {model!r} is not loaded or not ready in Triton.")
    if (status.upper().removeprefix("STATUSCODE.") in _GRPC_UNAVAILABLE or "unavailable" in status_l
            or any(w in lowered for w in _CONNECTION_WORDS) or _is_connection_error(err)):
        return BackendUnavailableError(f"The Triton server for model {model!r} is unreachable.")
    if "cancelled" in status_l:
        return BackendUnavailableError(f"The request to model {model!r} was cancelled by Triton.")
    logger.warning("triton error for model %s: %s %s", model, status, message[:500])
    # Triton's message can carry the backend's own exception text (a model's RuntimeError, file paths):
    # it goes to the log, never to the client. The gateway validates requests before Triton sees them,
    # so what reaches here is the server side's failure.
    return BackendError(f"Triton failed the request for model {model!r}; the gateway's log has the details.",
                        detail=message[:2000])


# What a backend says when its LoRA cache has no room for one more adapter because every one it holds is in use:
# TensorRT-LLM's PeftCacheManager ("PEFT Cache is full. Could not store taskId=N"; older releases "Error storing
# task=N in PEFT cache -- Cache is full. There are no done tasks to evict"), and vLLM's LoRA manager when a batch
# asks for more adapters than it has GPU slots ("No free lora slots", "Number of requested LoRAs (N) is greater
# than the number of GPU LoRA slots (M)").
_CACHE_FULL_WORDS = ("peft cache is full", "no done tasks to evict", "no free lora slots",
                     "greater than the number of gpu lora slots")


def is_adapter_cache_full(message: str) -> bool:
    """Whether a backend's error message (lower-cased) says its LoRA adapter cache is full (`_CACHE_FULL_WORDS`)."""
    return any(w in message for w in _CACHE_FULL_WORDS) or ("in peft cache" in message and "cache is full" in message)


# What a backend says when it cannot compile a request's guide. The reference models and TensorRT-LLM pass on
# xgrammar's own words ("guided_decoding_guide: the JSON schema cannot be compiled: Cannot find field $defs in
# #/$defs/Address", "Invalid range: minimum greater than maximum"); vLLM checks the guide first ("Failed to
# transform json schema into a grammar: ...", "The provided JSON schema contains features not supported by
# xgrammar.", "Invalid JSON grammar specification.", "Grammar error: ...", "Regex uses unsupported feature
# for structured outputs: ..."), and the Triton vLLM backend prefixes them ("Error generating stream: ...").
_GUIDE_WORDS = ("schema", "grammar", "regex", "guide", "structured output", "cannot find field", "invalid range",
                "integer constraint", "integer exceeds")
# ... unless it says the server could not try (no grammar engine there, its own crash): not the guide's fault.
_SERVER_WORDS = ("unavailable", "internal", "out of memory", "cuda", "guided decoding failed")
# A C++ source location at the start of xgrammar's messages ("[09:14:02] /src/json_schema_converter.cc:512: ",
# "Check failed: (x) is false: "): internals, never sent.
_CPP_LOCATION = re.compile(r"\[[0-9:.]+\] \S+\.(?:cc|cpp|h|hpp):\d+: (?:Check failed: \(.*?\) is false: )?")
_MAX_REASON = 400


def guide_refusal(message: str) -> str | None:
    """The backend's reason, fit for the client (first line, no source locations, at most `_MAX_REASON`
    characters), when `message` (Triton's error for a request that carried a guide) says the backend could not
    compile the guide (`_GUIDE_WORDS`); None when it says something else."""
    lowered = message.lower()
    if not any(w in lowered for w in _GUIDE_WORDS) or any(w in lowered for w in _SERVER_WORDS):
        return None
    line = next((ln.strip() for ln in message.splitlines() if ln.strip()), "")
    reason = _CPP_LOCATION.sub("", line)
    return reason if len(reason) <= _MAX_REASON else reason[:_MAX_REASON - 3] + "..."


def _is_connection_error(err: BaseException) -> bool:
    # aiohttp is loaded with the first HTTP client (`TritonClientPool.http`); without one, no aiohttp error exists.
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is None:
        return isinstance(err, ConnectionError)
    return isinstance(err, ConnectionError | aiohttp.ClientConnectionError | aiohttp.ServerDisconnectedError)
