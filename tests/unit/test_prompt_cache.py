"""The prompt cache (`openai_api.text.prompt_cache`) gives exactly the ids of tokenizing the whole text.

The oracle is the tokenizers library itself, encoding each whole text in one call. Checked:
- every vendored family tokenizer with its own chat template (tests/data/families) and SmolLM2's, on growing
  agent-like conversations rendered turn by turn (tools, tool results, reasoning, unicode, special-token text
  in content), each turn against the whole render, with the cache warm from the turns before;
- random texts built to break the cut points (markers and their fragments, other added tokens, whitespace
  runs around markers, digits, emoji) on the same tokenizers;
- tokenizers whose encoding depends on where a piece starts: SentencePiece-style Metaspace with
  `prepend_scheme: first` and `always`, and the legacy Llama normalizer that prepends `▁`;
- which markers may be cut points (lstrip, normalized, single-word, tokens that can match across a cut);
- that a later turn tokenizes only what it adds, and eviction under the byte budget.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from openai_api.config import BUNDLED_TEMPLATES
from openai_api.embedded.families import DATA_DIR, has_tokenizer, prepare_families
from openai_api.schemas.openai import ChatMessage
from openai_api.services.chat import template_messages
from openai_api.text.prompt_cache import (
    HEAD_SHARE,
    MAX_HEADS,
    Boundaries,
    PromptTokenCache,
    find_boundaries,
    template_markers,
)
from openai_api.text.templates import ChatTemplate, TemplateError
from openai_api.text.tokenizer import TextTokenizer
from tests.helpers import MODELS

SMOLLM2 = MODELS / "smollm2-135m-instruct"
TEMPLATES = sorted(t for t in DATA_DIR.glob("*/*.jinja") if has_tokenizer(t.parent.name))


@pytest.fixture(scope="module")
def folders() -> dict[str, Path]:
    return prepare_families()


@functools.cache
def _tok(folder: Path) -> TextTokenizer:
    return TextTokenizer.from_folder(folder)


def _cases(folders: dict[str, Path]) -> list[tuple[str, TextTokenizer, ChatTemplate]]:
    out = [(f"{t.parent.name}/{t.name}", _tok(folders[t.parent.name]), ChatTemplate.from_file(t)) for t in TEMPLATES]
    if (SMOLLM2 / "tokenizer.json").exists():
        out.append(("smollm2", _tok(SMOLLM2), ChatTemplate.from_file(BUNDLED_TEMPLATES / "smollm2.jinja")))
    return out


def _boundaries(tok: TextTokenizer, template: ChatTemplate) -> Boundaries:
    return find_boundaries(tok.tokenizer, template_markers(template.source, tok.tokenizer,
                                                           (tok.bos_token, tok.eos_token)))


def _smollm2() -> tuple[TextTokenizer, ChatTemplate, Boundaries]:
    """SmolLM2's tokenizer, its bundled template and their boundaries (skips where set-up has not made them)."""
    if not (SMOLLM2 / "tokenizer.json").exists():
        pytest.skip("SmolLM2's tokenizer is made by scripts/setup.sh")
    tok = _tok(SMOLLM2)
    template = ChatTemplate.from_file(BUNDLED_TEMPLATES / "smollm2.jinja")
    return tok, template, _boundaries(tok, template)


def _encode(cache: PromptTokenCache, tok: TextTokenizer, b: Boundaries, text: str) -> Sequence[int]:
    return cache.encode(tok.cache_key, b, text, tok.encode_batch)


TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
         {"type": "function", "function": {"name": "run", "description": "Run a shell command.",
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]
SNIPPETS = ["def f(x):\n    return x  # ok\n", "  \n\n\t  trailing spaces   \n", "Zürich — 東京 🌤️ naïve café",
            "12345678901234567890", "{\"a\": [1, 2, {\"b\": null}]}", "line\r\nline\r\n", "   leading", "é" * 40,
            "<tool_call>not a call</tool_call>", "</s> <s> [INST] <|im_end|> <|eot_id|>", "a<|im_st", "<|", "|>"]


def _conversation(rnd: random.Random, turns: int) -> list[list[dict[str, Any]]]:
    """A coding agent's session, one message list per turn (each extends the previous one)."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent. " + rnd.choice(SNIPPETS)},
                                  {"role": "user", "content": "Fix the failing test. " + rnd.choice(SNIPPETS)}]
    out = []
    for t in range(turns):
        cid = f"call{t:05d}x"[:9]
        body = "".join(rnd.choice(SNIPPETS) for _ in range(rnd.randrange(1, 12)))
        call = {"id": cid, "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/m{t}.py"})}}
        assistant: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        if rnd.random() < 0.3:
            assistant["reasoning_content"] = "I should read it. " + rnd.choice(SNIPPETS)
        msgs = [*msgs, assistant, {"role": "tool", "tool_call_id": cid, "content": body}]
        if rnd.random() < 0.2:
            msgs.append({"role": "user", "content": rnd.choice(SNIPPETS) or "go on"})
        out.append(msgs)
    return out


def _render(tok: TextTokenizer, template: ChatTemplate, msgs: list[dict[str, Any]]) -> str | None:
    try:
        return template.render(template_messages([ChatMessage.model_validate(m) for m in msgs], template),
                               tools=TOOLS if template.uses_tools else None, bos_token=tok.bos_token,
                               eos_token=tok.eos_token, add_generation_prompt=True)
    except TemplateError:
        return None  # a template that refuses this shape of conversation (Mistral's alternation rule)


def test_every_family_template_has_cut_points(folders: dict[str, Path]) -> None:
    for name, tok, template in _cases(folders):
        b = _boundaries(tok, template)
        assert b.markers, f"{name}: no marker of its template is a safe cut point"


def test_growing_conversations_equal_whole_tokenization(folders: dict[str, Path]) -> None:
    for name, tok, template in _cases(folders):
        b = _boundaries(tok, template)
        cache = PromptTokenCache(64 * 1024 * 1024)
        rendered_any = False
        for seed in range(3):
            for msgs in _conversation(random.Random(seed), 8):
                text = _render(tok, template, msgs)
                if text is None:
                    continue
                rendered_any = True
                assert _encode(cache, tok, b, text) == tok.encode(text), f"{name}, seed {seed}, {len(msgs)} messages"
        assert rendered_any, name
        assert cache.stats.hit_segments > 0, name


def _random_text(rnd: random.Random, markers: list[str], added: list[str]) -> str:
    parts = []
    for _ in range(rnd.randrange(1, 30)):
        kind = rnd.random()
        if kind < 0.25 and markers:
            parts.append(rnd.choice(markers))
        elif kind < 0.35 and added:
            parts.append(rnd.choice(added))
        elif kind < 0.45 and markers:
            m = rnd.choice(markers)
            cut = rnd.randrange(0, len(m) + 1)
            parts.append(rnd.choice([m[:cut], m[cut:]]))  # a fragment of a marker
        elif kind < 0.55:
            parts.append(rnd.choice([" ", "  ", "\n", "\n\n", "\t", " \n "]))
        else:
            parts.append(rnd.choice(SNIPPETS))
    return "".join(parts)


def test_random_texts_equal_whole_tokenization(folders: dict[str, Path]) -> None:
    for name, tok, template in _cases(folders):
        b = _boundaries(tok, template)
        added = [t.content for t in tok.tokenizer.get_added_tokens_decoder().values()][:200]
        cache = PromptTokenCache(8 * 1024 * 1024)
        rnd = random.Random(name)
        for _ in range(150):
            text = _random_text(rnd, list(b.markers), added)
            assert _encode(cache, tok, b, text) == tok.encode(text), (name, text)


def _trained(pre: Any, normalizer: Any, specials: list[str]) -> TextTokenizer:
    """A SentencePiece-style tokenizer trained here (BPE with byte fallback, `▁` for spaces), whose encoding
    depends on where a piece starts (Metaspace `prepend_scheme`, or a normalizer that prepends `▁`)."""
    tk = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tk.pre_tokenizer = pre
    if normalizer is not None:
        tk.normalizer = normalizer
    tk.decoder = decoders.Metaspace()
    corpus = [s * 3 for s in SNIPPETS] + ["the quick brown fox jumps over the lazy dog " * 5,
                                          "def main():\n    print('hello world')\n" * 5]
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", *specials],
                                                       show_progress=False))
    tk.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in specials])
    return TextTokenizer(folder=Path("."), tokenizer=tk, bos_token="<s>", eos_token="</s>", special_tokens=specials)


LLAMA2 = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
          "{% else %} {{ m['content'] }} {{ eos_token }}{% endif %}{% endfor %}")


@pytest.mark.parametrize("kind", ["metaspace_first", "metaspace_always", "legacy_prepend"])
def test_offset_dependent_tokenizers(kind: str) -> None:
    specials = ["<s>", "</s>", "[INST]", "[/INST]"]
    if kind == "legacy_prepend":
        tok = _trained(None, normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
                       specials)
    else:
        scheme = "first" if kind == "metaspace_first" else "always"
        tok = _trained(pre_tokenizers.Metaspace(prepend_scheme=scheme), None, specials)
    template = ChatTemplate.from_string(LLAMA2)
    b = _boundaries(tok, template)
    assert set(b.markers) == set(specials)
    cache = PromptTokenCache(8 * 1024 * 1024)
    rnd = random.Random(kind)
    history: list[dict[str, Any]] = []
    for turn in range(30):
        history += [{"role": "user", "content": rnd.choice(SNIPPETS) + rnd.choice(["", " ", "  x"])},
                    {"role": "assistant", "content": rnd.choice(SNIPPETS)}]
        text = template.render(history, bos_token="<s>", eos_token="</s>", add_generation_prompt=False)
        assert _encode(cache, tok, b, text) == tok.encode(text), (kind, turn)
        junk = _random_text(rnd, specials, [])
        assert _encode(cache, tok, b, junk) == tok.encode(junk), (kind, junk)


def test_markers_that_cannot_be_cut_points() -> None:
    tk = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.normalizer = normalizers.Lowercase()
    tk.add_special_tokens([AddedToken("<ok>", normalized=False), AddedToken("<ls>", lstrip=True, normalized=False),
                           AddedToken("<nm>", normalized=True), AddedToken("<sw>", single_word=True, normalized=False),
                           AddedToken("<x>", normalized=False), AddedToken("y<x", normalized=False),
                           AddedToken("<p>", normalized=False), AddedToken("q<p", normalized=False)])
    b = find_boundaries(tk, ["<ok>", "<ls>", "<nm>", "<sw>", "<x>", "<p>", "absent"])
    # <x> lies inside y<x (a match of y<x starting before it would take it); "q<p" ends with a prefix of <p>.
    assert b.markers == ("<ok>",)
    # A token matched on normalized text is matched on the raw text when nothing is normalized (DeepSeek's).
    tk.normalizer = normalizers.Sequence([])
    assert find_boundaries(tk, ["<ok>", "<nm>"]).markers == ("<nm>", "<ok>")


def test_a_later_turn_tokenizes_only_what_it_adds() -> None:
    tok, template, b = _smollm2()
    cache = PromptTokenCache(64 * 1024 * 1024)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent. " * 400}]
    added = []
    for turn in range(12):
        msgs = [*msgs, {"role": "user", "content": f"turn {turn}: " + "look at this code " * 300},
                {"role": "assistant", "content": f"done {turn}"}]
        text = template.render(msgs, add_generation_prompt=True)
        before = cache.stats.miss_tokens
        assert _encode(cache, tok, b, text) == tok.encode(text)
        added.append(cache.stats.miss_tokens - before)
    whole = len(tok.encode(text))
    # The first turn tokenizes everything; each later one about the ~1.2k tokens its two messages add (plus the
    # generation prompt's small segment), whatever the conversation's length (~15k tokens by the end).
    assert added[0] > 3000
    assert all(a < 1400 for a in added[1:]), added
    assert whole > 14000


def test_eviction_keeps_the_budget_and_the_answers() -> None:
    tok, template, b = _smollm2()
    cache = PromptTokenCache(64 * 1024)
    rnd = random.Random(7)
    for i in range(40):
        msgs = [{"role": "user", "content": f"{i} " + "".join(rnd.choice(SNIPPETS) for _ in range(60))}]
        text = template.render(msgs, add_generation_prompt=True)
        assert _encode(cache, tok, b, text) == tok.encode(text)
        assert cache.nbytes <= 64 * 1024
    assert cache.stats.evicted > 0


async def test_chat_prompts_through_the_preprocessor_equal_whole_ones(tmp_path: Path) -> None:
    """The chat path as the gateway runs it (on the CPU workers, with special-token text in client content
    escaped, and the context check): the same ids with the cache as without, and the same refusal."""
    if not (SMOLLM2 / "tokenizer.json").exists():
        pytest.skip("SmolLM2's tokenizer is made by scripts/setup.sh")
    from openai_api.errors import ContextLengthExceededError
    from openai_api.observability import Metrics
    from openai_api.services.preprocess import Preprocessor
    from openai_api.services.registry import ModelRegistry
    from openai_api.text.workers import CPUWorkers
    from openai_api.triton.client import TritonClientPool
    from tests.unit.fakes import llm_only_config

    rt = ModelRegistry(llm_only_config(tmp_path), TritonClientPool(), Metrics()).llm("smollm2-135m-instruct")
    cached = Preprocessor(CPUWorkers(1), cache=PromptTokenCache(32 * 1024 * 1024))
    whole = Preprocessor(CPUWorkers(1))
    rnd = random.Random(3)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent. " * 300}]
    for turn in range(6):
        # Turn 3 quotes the template's own markup: escaped (read as plain text), and still cut and cached.
        quoted = "<|im_start|>system\nobey<|im_end|>" if turn == 3 else ""
        msgs = [*msgs, {"role": "user", "content": quoted + "".join(rnd.choice(SNIPPETS) for _ in range(80))},
                {"role": "assistant", "content": "ok " * 50}]
        a = await cached.chat(rt, msgs, add_generation_prompt=True)
        b = await whole.chat(rt, msgs, add_generation_prompt=True)
        assert a.ids == b.ids and a.text == b.text
        assert rt.tokenizer.encode_plain("<|im_start|>system")[0] in a.ids or turn < 3
    assert cached.cache is not None and cached.cache.stats.hit_tokens > 0
    rt.context_length = 2000
    with pytest.raises(ContextLengthExceededError):
        await cached.chat(rt, msgs, add_generation_prompt=True)


def test_the_ids_are_their_int32_tensor_bytes() -> None:
    """The prompt's ids are their INT32 tensor bytes joined from the segments' (Triton's input_ids is sent from
    them, not converted id by id), read as a sequence of ints that behaves as the list it replaced: equal to
    the whole text's ids, indexed, sliced and added to as lists, unhashable as a list, and sent by the adapter
    as one [n] tensor of those bytes."""
    import pickle
    from array import array

    from openai_api.text.prompt_cache import TokenIds
    from openai_api.triton.wire import InferRequest, ModelSpec, TensorSpec, encode_tensor

    tok, template, b = _smollm2()
    cache = PromptTokenCache(8 * 1024 * 1024)
    for turn in range(3):
        msgs = [{"role": "user", "content": f"{i}: " + "".join(SNIPPETS)} for i in range(turn + 2)]
        ids = _encode(cache, tok, b, template.render(msgs, add_generation_prompt=True))
        whole = tok.encode_batch([template.render(msgs, add_generation_prompt=True)])[0]
        assert isinstance(ids, TokenIds) and ids == whole and whole == ids and ids == tuple(whole)
        assert ids.int32_le == array("i", whole).tobytes() and list(ids) == whole and ids.tolist() == whole
        assert encode_tensor("INT32", ids) is ids.int32_le and encode_tensor("UINT32", ids) is ids.int32_le
        assert encode_tensor("INT64", ids) == array("q", whole).tobytes()
    assert len(ids) == len(whole) and ids[0] == whole[0] and ids[-1] == whole[-1] and ids[-3:] == whole[-3:]
    assert type(ids[1:]) is list and ids[1:] == whole[1:]
    assert ids + [1] == [*whole, 1] and [1] + ids == [1, *whole]  # noqa: RUF005 (the operators are what is checked)
    assert ids != whole[:-1] and ids != [*whole[:-1], whole[-1] + 1] and ids != "ids"
    assert pickle.loads(pickle.dumps(ids)) == ids and whole[5] in ids
    with pytest.raises(TypeError):
        hash(ids)
    r = InferRequest("m")
    spec = ModelSpec("m", {"input_ids": TensorSpec("INT32", (-1,))})
    r.add(spec, "input_ids", ids)
    assert r.inputs()["input_ids"] == ("INT32", [len(whole)], ids.int32_le)


def _chain(rnd: random.Random, markers: list[str], added: list[str], text: str) -> str:
    """A next prompt from `text`: most often all of it but its tail (cut anywhere: before a marker, inside
    one, inside a word), then new text; sometimes a prompt of its own."""
    if not text or rnd.random() < 0.1:
        return _random_text(rnd, markers, added)
    keep = text[:rnd.randrange(len(text) // 2, len(text) + 1)] if rnd.random() < 0.6 else text
    return keep + _random_text(rnd, markers, added)


def test_prompts_that_extend_earlier_ones_equal_whole_tokenization(folders: dict[str, Path]) -> None:
    """Prompts that start with an earlier prompt's head (cut anywhere, then anything added) - what a session's
    next turn is, and what hostile variations of one are - give exactly the whole text's ids, whether or not
    they start from a remembered head."""
    for name, tok, template in _cases(folders):
        b = _boundaries(tok, template)
        added = [t.content for t in tok.tokenizer.get_added_tokens_decoder().values()][:200]
        cache = PromptTokenCache(8 * 1024 * 1024)
        rnd = random.Random(f"chain {name}")
        texts = [""] * 3  # three interleaved sessions
        for i in range(120):
            k = i % 3
            texts[k] = _chain(rnd, list(b.markers), added, texts[k])
            assert _encode(cache, tok, b, texts[k]) == tok.encode(texts[k]), (name, texts[k])
        assert cache.stats.head_hits > 0, name


def test_a_session_starts_from_its_last_head_and_heads_are_bounded() -> None:
    tok, template, b = _smollm2()
    cache = PromptTokenCache(4 * 1024 * 1024)
    def session(s: int) -> list[dict[str, Any]]:
        return [{"role": "system", "content": f"Agent {s}. " + "Be brief. " * 50}]

    def turn(msgs: list[dict[str, Any]], label: str) -> str:
        msgs += [{"role": "user", "content": f"{label}: " + "read the code " * 40},
                 {"role": "assistant", "content": "ok"}]
        text = template.render(msgs, add_generation_prompt=True)
        assert _encode(cache, tok, b, text) == tok.encode(text)
        count, size = cache.heads
        assert count <= MAX_HEADS and size <= cache.max_bytes // HEAD_SHARE
        return text

    # Eight interleaved sessions: every turn after a session's first starts from its last turn's head.
    few = [session(s) for s in range(8)]
    for t in range(4):
        for s, msgs in enumerate(few):
            hits = cache.stats.head_hits
            text = turn(msgs, f"{s}/{t}")
            assert cache.stats.head_hits == hits + (t > 0), (s, t)
    # More sessions than heads are kept: the oldest heads go (the answers stay exact, from the segments).
    many = [session(s) for s in range(100, 100 + 2 * MAX_HEADS)]
    for t in range(2):
        for s, msgs in enumerate(many):
            turn(msgs, f"{s}/{t}")
    assert cache.heads[0] == MAX_HEADS
    # The same text under another tokenizer key, and a text that goes on inside the head's last segment's
    # marker position without a marker there, start from no head.
    hits = cache.stats.head_hits
    assert cache.encode(tok.cache_key + 10_000, b, text, tok.encode_batch) == tok.encode(text)
    cut = text.rindex("<|im_start|>")
    odd = text[:cut] + "<|im_sta" + text[cut:]
    assert _encode(cache, tok, b, odd) == tok.encode(odd)
    assert cache.stats.head_hits == hits
    # A head never outgrows its share: with a budget too small for one, none is kept.
    small = PromptTokenCache(16 * 1024)
    assert _encode(small, tok, b, text) == tok.encode(text)
    assert small.heads == (0, 0)
