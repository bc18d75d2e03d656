"""The prompt cache's segments shared by a gateway's workers (`openai_api.text.shared_segments`).

Oracle: the tokenizers library encoding each whole text in one call (as in test_prompt_cache.py), and the
files' bytes as the module's docstring specifies them (written here by hand for the corrupt cases).
Checked: two caches (two workers) over one folder give whole-prompt ids and the second tokenizes only what
the first had not published; corrupt, truncated, foreign and missing files are misses; the folder stays
within its budget, least recently used first; concurrent writers and readers never see a partial file;
file names are hashes whatever the client's text; one worker (no folder) adds no file access.
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

from openai_api.config import BUNDLED_CONFIG, load_config
from openai_api.observability import Metrics
from openai_api.services.container import ProcessParts
from openai_api.settings import Settings
from openai_api.supervisor import Supervisor
from openai_api.text.prompt_cache import PromptTokenCache, find_boundaries
from openai_api.text.shared_segments import FOLDER_ENV, MAGIC, MIN_CHARS, SharedSegments
from openai_api.text.tokenizer import TextTokenizer

SPECIALS = ["<|im_start|>", "<|im_end|>"]
WORDS = ["def", "return", "self", "value", "print", "import", "class", "for", "in", "if", "else", "x", "y", "42",
         "Zürich", "東京", "🌤️", "(", ")", ":", "\n", "    "]


def _tokenizer(vocab: int = 300) -> TextTokenizer:
    tk = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rnd = random.Random(vocab)
    corpus = [" ".join(rnd.choice(WORDS) for _ in range(200)) for _ in range(20)]
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", *SPECIALS],
                                                       show_progress=False))
    tk.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in SPECIALS])
    return TextTokenizer(folder=Path("/nonexistent"), tokenizer=tk, special_tokens=SPECIALS)


TOK = _tokenizer()
BOUNDS = find_boundaries(TOK.tokenizer, SPECIALS)


def _message(rnd: random.Random, role: str, n: int = 60) -> str:
    return f"<|im_start|>{role}\n" + " ".join(rnd.choice(WORDS) for _ in range(n)) + "<|im_end|>\n"


class Counting:
    """`encode_batch` that records every text it was asked to tokenize."""

    def __init__(self, tok: TextTokenizer) -> None:
        self.tok = tok
        self.texts: list[str] = []

    def __call__(self, texts: list[str]) -> list[list[int]]:
        self.texts += texts
        return self.tok.encode_batch(texts)


def _encode(cache: PromptTokenCache, text: str, counting: Counting | None = None, key: int = 1) -> Any:
    return cache.encode(key, BOUNDS, text, counting or TOK.encode_batch, identity=TOK.identity)


def _worker(folder: Path, budget: int = 8 << 20) -> PromptTokenCache:
    return PromptTokenCache(budget, shared=SharedSegments(folder, budget))


def test_a_turn_on_the_other_worker_reads_what_the_first_tokenized(tmp_path: Path) -> None:
    a, b = _worker(tmp_path), _worker(tmp_path)
    rnd = random.Random(1)
    convo = "<|im_start|>system\nYou are an agent." + " def" * 100 + "<|im_end|>\n"
    for turn in range(8):
        added = _message(rnd, "user") + _message(rnd, "assistant")
        convo += added
        worker = a if turn % 3 else b  # the session's turns land on either worker
        counting = Counting(TOK)
        ids = _encode(worker, convo, counting)
        assert ids == TOK.encode(convo), turn
        # After the first turn, only the turn's two new messages are tokenized; the rest came from the worker's
        # own map or the folder.
        assert counting.texts and (turn == 0 or all(t in added for t in counting.texts)), (turn, counting.texts)
    assert b.stats.shared_segments > 0 and a.stats.shared_segments > 0
    assert b.stats.shared_tokens > 0
    # The folder holds one file per published segment, named by a hash.
    names = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert names and all(len(n) == 64 and set(n) <= set("0123456789abcdef") for n in names)


def test_tokenizers_and_plain_reading_never_share_names(tmp_path: Path) -> None:
    other = _tokenizer(320)
    assert other.identity() != TOK.identity() and TOK.identity() == TOK.identity()
    seg = "<|im_start|>user\n" + "x " * MIN_CHARS
    assert SharedSegments.name(TOK.identity(), seg) != SharedSegments.name(other.identity(), seg)
    assert SharedSegments.name(TOK.identity(), seg) != SharedSegments.name(TOK.identity() + b"\0plain", seg)
    a, b = _worker(tmp_path), _worker(tmp_path)
    _encode(a, seg)
    ids = b.encode(1, BOUNDS, seg, other.encode_batch, identity=other.identity)
    assert ids == other.encode(seg) and b.stats.shared_segments == 0


def _published(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("damage", ["truncated", "empty", "magic", "crc", "count", "longer", "directory"])
def test_a_damaged_file_is_a_miss_and_the_ids_stay_exact(tmp_path: Path, damage: str) -> None:
    rnd = random.Random(damage)
    text = _message(rnd, "user", 120)
    _encode(_worker(tmp_path), text)
    (path,) = _published(tmp_path)
    data = path.read_bytes()
    magic, count, crc = struct.unpack_from("<4sII", data)
    assert magic == MAGIC and len(data) == 12 + 4 * count and zlib.crc32(data[12:]) == crc
    broken = {"truncated": data[:-3], "empty": b"", "magic": b"XXXX" + data[4:],
              "crc": data[:-4] + bytes(4 * [0xEE]) if data[-4:] != bytes(4 * [0xEE]) else data[:-4] + bytes(4),
              "count": data[:4] + struct.pack("<I", count + 1) + data[8:], "longer": data + b"\0\0\0\0"}
    if damage == "directory":
        path.unlink()
        path.mkdir()
    else:
        path.write_bytes(broken[damage])
    b = _worker(tmp_path)
    counting = Counting(TOK)
    assert _encode(b, text, counting) == TOK.encode(text)
    # The message's one published segment (its `<|im_end|>` tail is too short to share) is tokenized again.
    assert b.stats.shared_segments == 0 and text.split("<|im_end|>")[0] in counting.texts


def test_a_missing_or_unwritable_folder_is_only_a_miss(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    cache = _worker(gone)
    text = _message(random.Random(3), "user", 120)
    assert _encode(cache, text) == TOK.encode(text)
    assert not gone.exists()


def test_the_folder_keeps_its_budget_least_recently_used_first(tmp_path: Path) -> None:
    budget = 64 * 4096
    store = SharedSegments(tmp_path, budget, background=False)
    rnd = random.Random(5)
    keep = store.name(b"t", "kept")
    store.put(keep, struct.pack("<i", 7) * 100)
    for i in range(200):
        store.put(store.name(b"t", str(i)), bytes(rnd.randrange(1, 3) * 4000))
        assert store.get(keep) is not None  # used all along: never the least recently used
        files = _published(tmp_path)
        # Checked every 1/16 of the budget: never more than one such step over it (one writer here).
        assert len(files) * 4096 <= budget + budget // 16 + 2 * 4096 + 4096, i
    assert store.get(keep) == struct.pack("<i", 7) * 100
    assert store.get(store.name(b"t", "0")) is None  # the oldest went
    assert store.get(store.name(b"t", "199")) is not None


def test_stale_temporary_files_are_removed(tmp_path: Path) -> None:
    store = SharedSegments(tmp_path, 4096, background=False)
    stale = tmp_path / ".abc.1.2.tmp"
    stale.write_bytes(b"partial")
    os.utime(stale, (1, 1))
    for i in range(4):
        store.put(store.name(b"t", str(i)), bytes(4000))
    assert not stale.exists()
    assert len(_published(tmp_path)) <= 2


def test_concurrent_writers_and_readers_see_whole_files_or_none(tmp_path: Path) -> None:
    budget = 96 * 4096  # small: eviction runs while others write and read
    stores = [SharedSegments(tmp_path, budget) for _ in range(3)]  # three workers' views of one folder
    payloads = {i: struct.pack("<i", i) * (200 + 97 * i) for i in range(60)}
    names = {i: SharedSegments.name(b"t", f"segment {i}") for i in payloads}
    errors: list[str] = []
    hits = [0]

    def writer(store: SharedSegments, seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(300):
            i = rnd.randrange(len(payloads))
            store.put(names[i], payloads[i])

    def reader(store: SharedSegments, seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(1500):
            i = rnd.randrange(len(payloads))
            got = store.get(names[i])
            if got is not None:
                hits[0] += 1
                if got != payloads[i]:
                    errors.append(f"segment {i}: {len(got)} bytes")

    threads = [threading.Thread(target=writer, args=(stores[k % 3], k)) for k in range(4)]
    threads += [threading.Thread(target=reader, args=(stores[k % 3], 100 + k)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and hits[0] > 0
    for s in stores:  # evictions ran on threads of their own while the others wrote
        s.wait(30)
    assert any(s._evictor is not None for s in stores)
    for s in stores:
        s.evict()
    total = sum(max(4096, -(-p.stat().st_size // 4096) * 4096) for p in _published(tmp_path))
    assert total <= budget
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_hostile_segment_text_never_reaches_a_path(tmp_path: Path) -> None:
    store = SharedSegments(tmp_path, 1 << 20)
    for text in ["../../etc/passwd", "/", "a\0b", "\ud800 lone surrogate", "x" * 100_000]:
        name = store.name(b"t", text)
        assert len(name) == 64 and set(name) <= set("0123456789abcdef")
        store.put(name, b"\1\0\0\0")
        assert store.get(name) == b"\1\0\0\0"
    assert {p.parent for p in tmp_path.rglob("*")} == {tmp_path}


def test_one_worker_has_no_shared_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FOLDER_ENV, str(tmp_path))
    metrics = Metrics()
    one = ProcessParts.from_settings(Settings(workers=1), metrics).preprocess.cache
    assert one is not None and one.shared is None
    two = ProcessParts.from_settings(Settings(workers=2), metrics).preprocess.cache
    assert two is not None and two.shared is not None and two.shared.folder == tmp_path
    off = ProcessParts.from_settings(Settings(workers=2, prompt_cache_mb=0), metrics).preprocess.cache
    assert off is None
    monkeypatch.delenv(FOLDER_ENV)
    alone = ProcessParts.from_settings(Settings(workers=2), metrics).preprocess.cache
    assert alone is not None and alone.shared is None


def test_the_supervisor_names_the_folder_in_its_workers_environment(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FOLDER_ENV, "/somewhere/else")
    config = load_config(BUNDLED_CONFIG)
    sup = Supervisor(config, Settings(workers=2))
    sup._run_dir = tmp_path
    assert sup._command(0, [])[1][FOLDER_ENV] == str(tmp_path / "prompt-segments")
    off = Supervisor(config, Settings(workers=2, prompt_cache_mb=0))
    off._run_dir = tmp_path
    assert FOLDER_ENV not in off._command(0, [])[1]


def test_a_tokenizer_is_named_by_the_file_bytes_it_was_built_from(tmp_path: Path) -> None:
    TOK.tokenizer.save(str(tmp_path / "tokenizer.json"))
    raw = (tmp_path / "tokenizer.json").read_bytes()
    first, second = TextTokenizer.from_folder(tmp_path), TextTokenizer.from_folder(tmp_path)
    assert first.identity() == second.identity() == hashlib.sha256(raw).digest()
    (tmp_path / "tokenizer.json").write_bytes(raw.replace(b'"<unk>"', b'"<unk>" ', 1))  # changed on disk later
    assert first.identity() == hashlib.sha256(raw).digest()  # still the bytes it was built from
    assert TextTokenizer.from_folder(tmp_path).identity() != first.identity()
