"""Guided (constrained) decoding for the SmolLM2 reference models: wire parsing, compilation, masking.

Imports neither Triton nor the engine, so ``bench/guided_overhead.py`` can measure it on its own.

Wire forms accepted (the parsers below turn each into a ``GuideSpec``):

* TensorRT-LLM tensors, as the Triton TensorRT-LLM backend reads them (``utils.cc``
  ``getGuidedDecodingParamsFromTensors`` and the Python backend's ``get_guided_decoding_params_from_request``):
  ``guided_decoding_guide_type`` BYTES and ``guided_decoding_guide`` BYTES, one string each.  Types:
  ``json`` (any JSON object or array: TensorRT-LLM compiles xgrammar's built-in JSON grammar and ignores
  the guide), ``json_schema`` (the guide is a JSON schema), ``regex``, ``ebnf_grammar`` (xgrammar EBNF,
  ``root ::= ...``).  ``structural_tag`` exists in the executor API but the Triton backends do not map
  it, so it is refused here, as is any other type, a guide without a type and a type needing a guide
  that has none.
* vLLM ``sampling_parameters`` keys, as the Triton vLLM backend passes them on
  (``TritonSamplingParams.from_dict``): ``structured_outputs`` is a *string* holding a JSON object (the
  backend ``json.loads`` it into ``StructuredOutputsParams``), ``guided_decoding`` is a JSON object or a
  string holding one (turned into ``GuidedDecodingParams``, or ``StructuredOutputsParams`` after
  dropping ``backend`` in newer backends).  Exactly one constraint: ``json`` (a schema object; the
  backend refuses a schema string), ``regex``, ``choice`` (list of strings), ``grammar`` (xgrammar
  EBNF), ``json_object`` (true: any JSON object), ``structural_tag`` (a string, xgrammar's structural
  tag JSON, the legacy ``{"structures", "triggers"}`` form included, as vLLM compiles it).  Options:
  ``disable_any_whitespace``, ``disable_additional_properties`` and ``disable_fallback`` are accepted
  (see below), ``whitespace_pattern`` is refused (xgrammar has none), ``backend`` (guided_decoding only)
  must be ``xgrammar``, ``xgrammar:no-fallback``, ``auto`` or ``xgrammar:_auto`` as the backend checks;
  ``backend_was_auto`` (older ``asdict(GuidedDecodingParams)`` payloads) is ignored.  Unknown keys are
  refused, as ``StructuredOutputsParams(**value)`` would.

Compilation (xgrammar, the grammar engine TensorRT-LLM and vLLM use by default) mirrors what those
backends call: ``compile_json_schema`` (strict mode: no properties or items the schema does not
declare), ``compile_regex``, ``compile_grammar``, ``compile_structural_tag``; ``choice`` becomes the
EBNF ``root ::= "a" | "b"`` as vLLM builds it.  One deliberate difference: every JSON kind is compiled
with ``any_whitespace=False`` (xgrammar then allows exactly ``", "`` and ``": "`` as separators),
whereas TensorRT-LLM and vLLM allow any whitespace by default.  Given free whitespace this 135M model
often spends its budget on newlines (2 of 6 prompts at temperature 0.8 ran out of 90 tokens, against
none without), which makes the reference flaky for tests; the set of JSON values accepted is the same.
So ``disable_any_whitespace`` changes nothing here, and ``disable_additional_properties`` neither
(strict mode already forbids undeclared properties).  TensorRT-LLM ``json`` is compiled as the schema
``{"type": ["object", "array"]}``: the same values as xgrammar's built-in JSON grammar.

Masking, per step (``GuideState.mask``): the matcher's bitmask is applied to the logits after
penalties, bad words and ``min_tokens`` and before temperature / top-k / top-p (greedy sees the masked
logits too).  The grammar's own stop token (the tokenizer's EOS) is never sampled as such; the
request's end ids (``end_id``, vLLM ``stop_token_ids``) are allowed only where the grammar may end,
so EOS is masked while the output is incomplete.  After each accepted token the next bitmask is filled
at once; when it allows nothing but a stop token the grammar is finished and the engine ends the
request with "stop" without another forward pass (the end id would be the only choice).

Guided decoding cost, measured with ``bench/guided_overhead.py`` on this 2-core CPU (xgrammar 0.2.8,
torch 2.13.0 CPU, one thread, the machine shared with other work):

* per generated token, the guide's work (bitmask fill + apply + accept + the finished check) is
  about 0.33 ms median (p90 0.42 ms) against a 57 ms unguided decode step (forward pass + sampling):
  0.6 %.  (The mask is applied with a branch-free numpy add, about 25 us warm; xgrammar's CPU
  ``apply_token_bitmask_inplace`` took about 150 us for the same 49,152 logits.)
* compiling a schema: 4.6 ms for a tool-style schema (strings without length bounds, an enum, a
  bounded integer, a boolean), 178 ms for one with a ``maxLength: 24`` string, a pattern, a nested
  object and an array; a cached compile (same kind + guide text) takes 1-3 us.  The compiler itself
  (xgrammar's index of the tokenizer) is built once per model at start-up: 0.4-0.7 s.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch

TRTLLM_GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
VLLM_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
_VLLM_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "disable_fallback", "whitespace_pattern")
STRUCTURED_OUTPUTS_KEYS = frozenset(VLLM_CONSTRAINTS + _VLLM_OPTIONS)
GUIDED_DECODING_KEYS = STRUCTURED_OUTPUTS_KEYS | {"backend", "backend_was_auto"}
VLLM_BACKENDS = ("xgrammar", "xgrammar:no-fallback", "auto", "xgrammar:_auto")
# A guide bigger than this is refused before compiling (a schema is a few KiB in practice).
MAX_GUIDE_BYTES = 1 << 20
CACHE_SIZE = 64
_ANY_JSON = '{"type": ["object", "array"]}'
_ANY_OBJECT = '{"type": "object"}'


class GuideError(ValueError):
    """The guide is invalid or cannot be compiled; the message goes back to the client (INVALID_ARG)."""


class GuideUnavailable(RuntimeError):
    """No grammar engine on this installation (xgrammar missing or broken)."""


class GuideEnded(Exception):
    """No token is left but an end: the grammar is finished and the request ends with "stop"."""


@dataclass(frozen=True)
class GuideSpec:
    """What to compile: ``kind`` in json_schema / json / json_object / regex / ebnf / structural_tag;
    ``text`` the schema, pattern, grammar or tag JSON (empty for json and json_object); ``source`` the
    wire field to name in error messages."""

    kind: str
    text: str
    source: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.text)


# ---------------------------------------------------------------------------------------- wire parsing
def _check_size(text: str, source: str) -> None:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_GUIDE_BYTES:
        raise GuideError(f"{source}: guide larger than {MAX_GUIDE_BYTES} bytes")


def _schema_text(raw: str, source: str) -> str:
    """Check that a schema string is JSON (a clear message beats xgrammar's C++ one); return it as sent."""
    try:
        schema = json.loads(raw)
    except ValueError as exc:
        raise GuideError(f"{source}: the JSON schema is not valid JSON ({exc})") from None
    if not isinstance(schema, dict | bool):
        raise GuideError(f"{source}: a JSON schema must be a JSON object, got {type(schema).__name__}")
    return raw


def trtllm_guide(guide_type: str | None, guide: str | None) -> GuideSpec | None:
    """The two TensorRT-LLM guide tensors (already decoded to str, None when absent) as a spec."""
    if guide_type is None:
        if guide:
            raise GuideError("guided_decoding_guide was sent without guided_decoding_guide_type "
                             f"(one of {', '.join(TRTLLM_GUIDE_TYPES)})")
        return None
    if guide_type not in TRTLLM_GUIDE_TYPES:
        raise GuideError(f"guided_decoding_guide_type {guide_type!r} is not supported; "
                         f"use one of {', '.join(TRTLLM_GUIDE_TYPES)}")
    source = "guided_decoding_guide"
    if guide_type == "json":  # TensorRT-LLM ignores the guide for this type
        return GuideSpec("json", "", source)
    if not guide:
        raise GuideError(f"guided_decoding_guide is required with guided_decoding_guide_type {guide_type!r}")
    _check_size(guide, source)
    if guide_type == "json_schema":
        return GuideSpec("json_schema", _schema_text(guide, source), source)
    return GuideSpec("regex" if guide_type == "regex" else "ebnf", guide, source)


def _ebnf_literal(text: str) -> str:
    """A string as an xgrammar EBNF literal (JSON escapes are valid there: \\" \\\\ \\n \\uXXXX)."""
    return json.dumps(text, ensure_ascii=False)


def vllm_guide(params: dict[str, Any]) -> GuideSpec | None:
    """The guide in a ``sampling_parameters`` dict, from ``structured_outputs`` or ``guided_decoding``
    (``structured_outputs`` wins when both are set, as in the Triton vLLM backend)."""
    if params.get("structured_outputs") is not None:
        key, raw = "structured_outputs", params["structured_outputs"]
        if not isinstance(raw, str):
            raise GuideError("sampling_parameters.structured_outputs: expected a string holding a JSON object "
                             "(the Triton vLLM backend json-decodes it), got "
                             f"{'an object' if isinstance(raw, dict) else type(raw).__name__}")
        allowed = STRUCTURED_OUTPUTS_KEYS
    elif params.get("guided_decoding") is not None:
        key, raw = "guided_decoding", params["guided_decoding"]
        allowed = GUIDED_DECODING_KEYS
    else:
        return None
    where = f"sampling_parameters.{key}"
    if isinstance(raw, str):
        _check_size(raw, where)
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise GuideError(f"{where}: not valid JSON ({exc})") from None
    else:
        value = raw
    if not isinstance(value, dict):
        raise GuideError(f"{where}: expected a JSON object, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise GuideError(f"{where}: unknown field(s) {', '.join(unknown)}")
    backend = value.get("backend")
    if backend is not None and backend not in VLLM_BACKENDS:
        raise GuideError(f"{where}.backend {backend!r} is not supported per request; "
                         f"use one of {', '.join(VLLM_BACKENDS)} or leave it out")
    if value.get("whitespace_pattern") is not None:
        raise GuideError(f"{where}.whitespace_pattern is not supported by this model (xgrammar has no "
                         "whitespace patterns); use disable_any_whitespace")
    given = [c for c in VLLM_CONSTRAINTS if value.get(c) is not None]
    if len(given) != 1:
        what = ", ".join(given) if given else "none"
        raise GuideError(f"{where}: exactly one of {', '.join(VLLM_CONSTRAINTS)} must be set ({what} given)")
    kind = given[0]
    item = value[kind]
    source = f"{where}.{kind}"
    if kind == "json":
        if not isinstance(item, dict):
            raise GuideError(f"{source} must be a JSON schema object (the Triton vLLM backend refuses "
                             f"{type(item).__name__})")
        text = json.dumps(item, ensure_ascii=False)
        _check_size(text, source)
        return GuideSpec("json_schema", text, source)
    if kind == "json_object":
        if item is not True:
            raise GuideError(f"{source} must be true")
        return GuideSpec("json_object", "", source)
    if kind == "choice":
        if not isinstance(item, list) or not item or not all(isinstance(c, str) for c in item):
            raise GuideError(f"{source} must be a non-empty list of strings")
        text = "root ::= " + " | ".join(_ebnf_literal(c) for c in item)
        _check_size(text, source)
        return GuideSpec("ebnf", text, source)
    if not isinstance(item, str) or not item:
        raise GuideError(f"{source} must be a non-empty string")
    _check_size(item, source)
    return GuideSpec({"regex": "regex", "grammar": "ebnf", "structural_tag": "structural_tag"}[kind], item, source)


# ------------------------------------------------------------------------------------------ compiling
_CPP_PREFIX = re.compile(r"^\[[0-9:]+\] \S+\.(?:cc|h|cpp):\d+: (?:Check failed: \(.*?\) is false: )?")


def _clean(exc: BaseException) -> str:
    """xgrammar's first message line without the C++ source location."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _CPP_PREFIX.sub("", text)


class GuideCompiler:
    """The tokenizer-bound xgrammar compiler and an LRU of compiled grammars (keyed by kind + guide).

    Built lazily (``ready``) from the weights folder's tokenizer; thread-safe.  ``timings`` keeps the
    last compile's duration and whether it came from the cache, for the log and the benchmark."""

    def __init__(self, weights_dir: Path, vocab_size: int, stop_ids: list[int], cache_size: int = CACHE_SIZE) -> None:
        self.weights_dir = weights_dir
        self.vocab_size = vocab_size
        self.stop_ids = [t for t in stop_ids if 0 <= t < vocab_size]
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self._xgr: Any = None
        self._compiler: Any = None
        self._failure: str | None = None
        self.version = ""

    def ready(self) -> None:
        """Import xgrammar and index the tokenizer once (about 0.2 s); GuideUnavailable if impossible."""
        with self._lock:
            if self._compiler is not None:
                return
            if self._failure is not None:
                raise GuideUnavailable(self._failure)
            try:
                import xgrammar as xgr

                info = self._tokenizer_info(xgr)
                # One thread: the machine is small and the decode loop needs the other core.
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
                self._xgr = xgr
                self.version = version("xgrammar")
                self.stop_ids = list(info.stop_token_ids)
            except Exception as exc:  # noqa: BLE001 - any failure means no guided decoding here
                self._failure = (f"guided decoding is unavailable on this server: {type(exc).__name__}: {exc} "
                                 "(bash scripts/setup.sh installs xgrammar)")
                raise GuideUnavailable(self._failure) from None

    def _tokenizer_info(self, xgr: Any) -> Any:
        """xgrammar's view of the tokenizer, as ``TokenizerInfo.from_huggingface`` builds it for a fast tokenizer
        (the vocabulary by id, the vocabulary type and prefix-space handling detected from the serialized
        tokenizer), but from ``tokenizer.json`` with the tokenizers library: loading transformers' AutoTokenizer
        for it cost ~1 s of CPU per model instance at every Triton start, 0.15 s this way. The same object
        (vocabulary and metadata compared in tests/unit/test_reference_guide_info.py)."""
        from tokenizers import Tokenizer

        raw = Tokenizer.from_file(str(self.weights_dir / "tokenizer.json"))
        encoded: list[str] = [""] * self.vocab_size
        for token, index in raw.get_vocab(with_added_tokens=True).items():
            if index < self.vocab_size:
                encoded[index] = token
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(raw.to_str())
        return xgr.TokenizerInfo(encoded, vocab_type=meta["vocab_type"], vocab_size=self.vocab_size,
                                 stop_token_ids=self.stop_ids or None, add_prefix_space=meta["add_prefix_space"])

    def compile(self, spec: GuideSpec) -> tuple[Any, float, bool]:
        """(compiled grammar, seconds, cached?) for a spec; GuideError when xgrammar refuses the guide."""
        self.ready()
        t0 = time.perf_counter()
        with self._lock:
            hit = self._cache.get(spec.key)
            if hit is not None:
                self._cache.move_to_end(spec.key)
                return hit, time.perf_counter() - t0, True
        compiled = self._compile(spec)  # outside the lock: xgrammar releases the GIL while compiling
        with self._lock:
            self._cache[spec.key] = compiled
            self._cache.move_to_end(spec.key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled, time.perf_counter() - t0, False

    def _compile(self, spec: GuideSpec) -> Any:
        c = self._compiler
        what = {"json_schema": "JSON schema", "json": "JSON grammar", "json_object": "JSON grammar",
                "regex": "regex", "ebnf": "EBNF grammar", "structural_tag": "structural tag"}[spec.kind]
        try:
            if spec.kind == "json_schema":
                return c.compile_json_schema(spec.text, any_whitespace=False)
            if spec.kind == "json":
                return c.compile_json_schema(_ANY_JSON, any_whitespace=False)
            if spec.kind == "json_object":
                return c.compile_json_schema(_ANY_OBJECT, any_whitespace=False)
            if spec.kind == "regex":
                return c.compile_regex(spec.text)
            if spec.kind == "ebnf":
                return c.compile_grammar(spec.text)
            if spec.kind == "structural_tag":
                return self._structural_tag(spec.text)
        except GuideError:
            raise
        except Exception as exc:  # noqa: BLE001 - xgrammar raises RuntimeError / ValueError / its own types
            raise GuideError(f"{spec.source}: the {what} cannot be compiled: {_clean(exc)}") from None
        raise GuideError(f"{spec.source}: unknown guide kind {spec.kind!r}")

    def _structural_tag(self, text: str) -> Any:
        """As vLLM compiles it: the legacy {"structures": [...], "triggers": [...]} form, else xgrammar's own."""
        try:
            tag = json.loads(text)
        except ValueError as exc:
            raise GuideError(f"structural_tag: not valid JSON ({exc})") from None
        if isinstance(tag, dict) and "structures" in tag:
            items = [self._xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                     for s in tag["structures"]]
            return self._compiler.compile_structural_tag(items, tag["triggers"])
        return self._compiler.compile_structural_tag(text)

    def start(self, spec: GuideSpec) -> GuideState:
        compiled, seconds, cached = self.compile(spec)
        state = GuideState(self._xgr, compiled, self.vocab_size, self.stop_ids)
        state.compile_s, state.compile_cached = seconds, cached
        return state


# ------------------------------------------------------------------------------------------- decoding
class GuideState:
    """One request's matcher and bitmask; used by the decode worker thread only."""

    def __init__(self, xgr: Any, compiled: Any, vocab_size: int, grammar_stops: list[int]) -> None:
        self.xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._words = self.bitmask[0].numpy()  # shares memory with the bitmask xgrammar fills
        self._bias = np.empty(len(self._words) * 32, dtype=np.uint32)
        self.grammar_stops = list(grammar_stops)
        self.filled = False
        self.finished = False  # nothing but an end may follow
        self.compile_s = 0.0
        self.compile_cached = False
        self.seconds = 0.0  # time spent in fill + apply + accept, for the per-token cost
        self.steps = 0

    def _stop_allowed(self) -> bool:
        words = self._words
        return any((int(words[t >> 5]) >> (t & 31)) & 1 for t in self.grammar_stops)

    def _only_stop(self) -> bool:
        """True when the bitmask allows nothing but the grammar's stop tokens."""
        if not self.matcher.is_completed():
            return False
        words = self._words.view(np.uint32).copy()
        for t in self.grammar_stops:
            words[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
        return not words.any()

    def _apply(self, values: np.ndarray) -> None:
        """logits += 0 where the bitmask allows a token, -inf elsewhere: the same result as xgrammar's
        ``apply_token_bitmask_inplace``, branch-free (25 us instead of about 150 us for 49,152 ids)."""
        n = values.shape[0]
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")[:n]
        bias = self._bias[:n]
        np.subtract(bits, 1, out=bias, dtype=np.uint32, casting="unsafe")  # allowed 0, banned 0xFFFFFFFF
        np.bitwise_and(bias, 0xFF800000, out=bias)  # ... and banned becomes the bits of float32 -inf
        np.add(values, bias.view(np.float32), out=values)

    def mask(self, logits: torch.Tensor, end_ids: list[int]) -> None:
        """Mask ``logits`` (1-D, the vocabulary) in place; raises GuideEnded when only an end is left
        but every end is masked (``min_tokens``, ``ignore_eos``), GuideError when the grammar allows
        tokens but all of them are banned (``bad_words_list``)."""
        t0 = time.perf_counter()
        if not self.filled:
            self.matcher.fill_next_token_bitmask(self.bitmask)
            self.filled = True
        can_end = self._stop_allowed()
        if logits.dtype == torch.float32 and logits.is_contiguous() and logits.numel() <= self._bias.shape[0]:
            values = logits.detach().numpy()  # shares memory: the masking happens in place
            ends = [t for t in end_ids if 0 <= t < values.shape[0]]
            saved = values[ends].copy() if ends and can_end else None
            self._apply(values)
            values[self.grammar_stops] = -np.inf
            if saved is not None:
                values[ends] = saved
            nothing = bool(values.max() == -np.inf)
        else:  # not hit by the engine (float32 logits); kept for other callers
            ends = [t for t in end_ids if 0 <= t < logits.numel()]
            saved_t = logits[ends].clone() if ends and can_end else None
            self.xgr.apply_token_bitmask_inplace(logits, self.bitmask[0], vocab_size=self.vocab_size)
            logits[self.grammar_stops] = float("-inf")
            if saved_t is not None:
                logits[ends] = saved_t
            nothing = not bool(torch.isfinite(logits).any())
        self.seconds += time.perf_counter() - t0
        self.steps += 1
        if nothing:
            if can_end:
                raise GuideEnded
            raise GuideError("guided decoding: every token the guide allows here is banned by the request "
                             "(bad_words_list or stop ids)")

    def accept(self, token: int) -> None:
        t0 = time.perf_counter()
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"the grammar matcher refused sampled token {token}")
        self.matcher.fill_next_token_bitmask(self.bitmask)
        self.filled = True
        self.finished = self._only_stop()
        self.seconds += time.perf_counter() - t0
