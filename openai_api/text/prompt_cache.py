"""Token ids of rendered prompts, tokenizing only the text a prompt adds to what this process has seen.

Why: an agent session's every request carries the whole conversation (50k-200k tokens), and tokenizing it
whole costs ~2.5 ms of CPU per 1k tokens, on every turn. The engines behind Triton reuse the KV cache of
the shared prefix, so without this the gateway, not the GPU, set the pace of long sessions.

How, exactly (never an approximation): the tokenizers library extracts added tokens (a chat template's
markers: `<|im_start|>`, `<|eot_id|>`, `[INST]`...) from the text before it normalizes or pre-tokenizes
anything, and then encodes the text between them piece by piece. So a prompt cut right before an
occurrence of a marker `T` encodes as the concatenation of its two parts, provided nothing about that
occurrence depends on the text before it. A marker is used as a cut point (`PromptTokenCache` calls it a
boundary) only when:

* `T` is matched on the raw text (`normalized=False`, or a tokenizer with no normalizer: DeepSeek's
  user marker), takes no whitespace from its left (`lstrip=False`) and need not stand alone as a word
  (`single_word=False`);
* no added token `U` can match across the cut: no proper suffix of any added token starts with `T`, or
  is a non-empty prefix of `T` (checked once per tokenizer). Then leftmost-longest matching, which the
  library uses, finds a token starting exactly at `T`'s occurrence in the whole text and in the part that
  starts there, and the same tokens before it;
* the piece after `T` is never at offset 0, in the whole text or in the part, so offset-dependent
  pre-tokenizers (Metaspace's `prepend_scheme: first`) treat it alike.

A prompt is cut before every occurrence of a boundary marker into segments (the head before the first
marker, then one segment per marker), and each segment's ids depend on its own text only. They are
remembered by that text in a process-wide LRU bounded in bytes (`--prompt-cache-mb`), shared by every
model with the same tokenizer file, so a turn tokenizes only the segments it has not seen: its new messages,
and any earlier message the template rewrote (Qwen3 dropping old reasoning, harmony dropping old analysis),
which is simply a new segment. A head segment never starts with a marker and every other segment does, so
the two kinds cannot collide in the map.

With `--workers N` the workers also share the segments they tokenize through a folder (`text.shared_segments`):
a turn that lands on a worker that has not seen the session's last turns reads their ids there instead of
tokenizing them again.

A session's next turn starts with its last turn's prompt less that prompt's last segment (the generation
prompt, which the answer replaces): the cache keeps the *head* of each recent prompt (its text up to its last
cut, and the ids of that text: a slice of the prompt's own ids), at most `MAX_HEADS` of them in at most a
`HEAD_SHARE`th of the byte budget, newest first. A prompt that starts with a head's text and has a boundary
marker right after it takes the head's ids as they are and cuts, looks up and tokenizes only the rest: at a
~117k-token turn that skips slicing, hashing and looking up ~200 segments (~0.3-0.5 ms a turn) for one
`startswith` (a memcmp). Exact: the regular expression finds the same markers before that point in the prompt
as in the head's own prompt, since a match that ran past it would be an added token matching across a cut
(which no boundary marker admits, above), so the prompt's segments before it are the head's. A head is a pure
function of text, as a segment is: what it holds is what tokenizing that text gives, whoever sent it.

What still scales with the whole prompt is string and byte work at memory speed: finding the markers (one
regular expression scan), hashing the segments, and joining their cached ids (with a head: one `startswith`
and the join). A segment's ids are kept as
their little-endian int32 bytes (4 bytes a token: what Triton's INT32 `input_ids` tensor holds), so the join
is one `bytes.join` and the result, a `TokenIds`, is a read-only sequence over those bytes that
`triton.wire.encode_tensor` sends as they are. Before, the ids were joined into a Python list: at ~117k
tokens that list cost ~1.5-2 ms a turn in copying and reference counting its items, freeing them, and the
garbage collector's passes over it and over every cached list (measured with `perf` on the gateway); bytes
hold no references, so the collector never looks inside them.

Proven by a property test (tests/unit/test_prompt_cache.py) against whole-prompt tokenization on every
vendored family tokenizer and template, random conversations and a Metaspace tokenizer.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from tokenizers import Tokenizer

from openai_api.text.shared_segments import MIN_CHARS, SharedSegments

# Per entry, beyond its text and its ids: the map's node, the key tuple and the bytes header.
_ENTRY_OVERHEAD = 160
_LITTLE = sys.byteorder == "little"


@dataclass(frozen=True, slots=True)
class Boundaries:
    """The markers a tokenizer's prompts can be cut before (see the module docstring), as one pattern."""

    markers: tuple[str, ...]
    pattern: re.Pattern[str] | None

    def cuts(self, text: str) -> list[int]:
        """Where each segment of `text` starts: 0, then every occurrence of a marker (never 0 twice)."""
        if self.pattern is None:
            return [0]
        starts = [m.start() for m in self.pattern.finditer(text)]
        if not starts or starts[0] != 0:
            starts.insert(0, 0)
        return starts


NO_BOUNDARIES = Boundaries((), None)


def _crosses(token: str, other: str) -> bool:
    """Whether `other` matched somewhere before an occurrence of `token` could run into it: a proper suffix
    of `other` starts with `token`, or is a non-empty prefix of `token`."""
    for o in range(1, len(other)):
        tail = other[o:]
        if tail.startswith(token) or token.startswith(tail):
            return True
    return False


def _identity_normalizer(tokenizer: Tokenizer) -> bool:
    """Whether `tokenizer` normalizes nothing (no normalizer, or an empty sequence of them): then a token it
    matches on normalized text is matched on the raw text as well."""
    norm = tokenizer.normalizer
    if norm is None:
        return True
    try:
        state = json.loads(norm.__getstate__())
    except (ValueError, TypeError, AttributeError):
        return False
    return isinstance(state, dict) and state.get("type") == "Sequence" and not state.get("normalizers")


def find_boundaries(tokenizer: Tokenizer, candidates: Iterable[str]) -> Boundaries:
    """The `candidates` (a template's literal markers, its BOS/EOS) that are safe cut points for
    `tokenizer`'s prompts: added tokens matched on raw text, without `lstrip` or `single_word`, that no
    added token can match across (module docstring). None qualify: prompts are not cut (still exact)."""
    added = {t.content: t for t in tokenizer.get_added_tokens_decoder().values() if t.content}
    every = list(added)
    raw = _identity_normalizer(tokenizer)
    markers = []
    for text in set(candidates):
        tok = added.get(text)
        if tok is None or (tok.normalized and not raw) or tok.lstrip or tok.single_word:
            continue
        if any(_crosses(text, other) for other in every):
            continue
        markers.append(text)
    markers.sort(key=lambda m: (-len(m), m))  # longest first: leftmost-longest, as the library matches
    pattern = re.compile("|".join(map(re.escape, markers))) if markers else None
    return Boundaries(tuple(markers), pattern)


def template_markers(source: str, tokenizer: Tokenizer, extra: Sequence[str] = ()) -> list[str]:
    """The added tokens of `tokenizer` that a chat template's source writes literally, plus `extra` (its
    BOS and EOS, which templates write through variables): the candidates for `find_boundaries`."""
    found = [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.content and t.content in source]
    return [*found, *(e for e in extra if e)]


class TokenIds(Sequence[int]):
    """Token ids held as their little-endian int32 bytes (`int32_le`, joined from the cached segments' bytes),
    read as a sequence of ints without converting them: what `triton.wire.encode_tensor` sends as they are for
    an INT32 (or UINT32) tensor. Read-only. Slicing and `+` give plain lists, as a list's would; equal to a
    list or tuple of the same ids. `new_segments`: the segments this encode tokenized (not found in the
    cache), which a caller should not tokenize again."""

    __slots__ = ("_view", "int32_le", "new_segments")

    def __init__(self, int32_le: bytes, new_segments: frozenset[str] = frozenset()) -> None:
        self.int32_le = int32_le
        self.new_segments = new_segments
        if _LITTLE:
            self._view = memoryview(int32_le).cast("i")
        else:  # pragma: no cover - big-endian hosts
            native = array("i")
            native.frombytes(int32_le)
            native.byteswap()
            self._view = memoryview(native)

    def __len__(self) -> int:
        return len(self._view)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return self._view[i].tolist()
        return self._view[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self._view)

    def tolist(self) -> list[int]:
        return self._view.tolist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return self.int32_le == other.int32_le
        if isinstance(other, list):
            return len(other) == len(self) and self.tolist() == other
        if isinstance(other, tuple):
            return len(other) == len(self) and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a list's: equal to lists

    def __add__(self, other: Iterable[int]) -> list[int]:
        return [*self._view.tolist(), *other]

    def __radd__(self, other: Iterable[int]) -> list[int]:
        return [*other, *self._view.tolist()]

    def __repr__(self) -> str:
        return f"TokenIds({self.tolist()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return TokenIds, (self.int32_le, self.new_segments)


def _int32(ids: list[int]) -> bytes:
    """Ids as little-endian int32 bytes (a tokenizer's ids are below its vocabulary size: they fit)."""
    raw = array("i", ids)
    if not _LITTLE:  # pragma: no cover - big-endian hosts
        raw.byteswap()
    return raw.tobytes()


# Prompt heads kept (`PromptTokenCache._heads`): at most this many, in at most 1/HEAD_SHARE of the byte budget
# (a ~117k-token prompt's head is ~1 MB: its text and its ids).
MAX_HEADS = 32
HEAD_SHARE = 4


@dataclass(frozen=True, slots=True)
class _Head:
    """A prompt's text up to its last cut, and its ids: `ids[:nbytes]` (`ids` holds the whole prompt's, shared
    with the `TokenIds` that prompt was given). `segments`: how many segments the head was cut into (stats)."""

    key: int
    pattern: re.Pattern[str]
    text: str
    ids: bytes
    nbytes: int
    segments: int

    @property
    def size(self) -> int:
        return sys.getsizeof(self.text) + sys.getsizeof(self.ids) + _ENTRY_OVERHEAD


@dataclass
class CacheStats:
    """Counters of one cache, for metrics and tests: segments found in the map and tokenized anew, and the
    tokens each gave."""

    hit_segments: int = 0
    miss_segments: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    evicted: int = 0
    # Of the misses above: segments (and their tokens) found in the workers' shared folder, not tokenized.
    shared_segments: int = 0
    shared_tokens: int = 0
    # Prompts that started from a remembered head (`PromptTokenCache._heads`); their head's segments and tokens
    # are counted as hits above.
    head_hits: int = 0


@dataclass
class PromptTokenCache:
    """The process-wide map segment text -> token ids, for every tokenizer (module docstring), bounded in
    bytes and evicted least recently used first. Thread-safe: renders run on the CPU workers' threads; the
    map is only touched under a lock, tokenizing happens outside it. `shared`: the folder the workers of a
    `--workers N` gateway share (`text.shared_segments`), looked up for what the map misses and given what is
    tokenized; None in a single process."""

    max_bytes: int
    stats: CacheStats = field(default_factory=CacheStats)
    shared: SharedSegments | None = None
    # (tokenizer key, segment text) -> its ids as little-endian int32 bytes
    _map: OrderedDict[tuple[int, str], bytes] = field(default_factory=OrderedDict)
    _bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # The heads of the latest prompts (`_Head`), newest first, bounded by `MAX_HEADS` and by `max_bytes //
    # HEAD_SHARE`: a session's next turn starts with its last turn's head (module docstring).
    _heads: list[_Head] = field(default_factory=list)
    _head_bytes: int = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    @property
    def heads(self) -> tuple[int, int]:
        """How many prompt heads are kept, and their bytes (bounded: `MAX_HEADS`, `max_bytes // HEAD_SHARE`)."""
        with self._lock:
            return len(self._heads), self._head_bytes

    def __len__(self) -> int:
        return len(self._map)

    def encode(self, key: int, boundaries: Boundaries, text: str,
               encode_batch: Callable[[list[str]], list[list[int]]],
               check: Callable[[list[str], int], None] | None = None,
               identity: Callable[[], bytes] | None = None) -> TokenIds:
        """The ids of `text`, equal to `encode_batch([text])[0]`: cut at `boundaries`, cached segments taken
        from the map, the others tokenized together with `encode_batch` (one call) and remembered. `key` names
        the tokenizer (segments of different tokenizers never mix). `check(new segments, tokens already known)`
        runs before anything is tokenized and may raise (a prompt too long for the model's context).
        `identity()`: the tokenizer's name across processes, for the shared folder (read only with one)."""
        head = self._head_of(key, boundaries, text)
        if head is None:
            cuts = boundaries.cuts(text)
            known: bytes | memoryview = b""
        else:  # the prompt's segments before len(head.text) are the head's: only the rest is cut and looked up
            assert boundaries.pattern is not None  # a head is only kept for a prompt that was cut
            cuts = [m.start() for m in boundaries.pattern.finditer(text, len(head.text))]
            known = memoryview(head.ids)[:head.nbytes]
        cuts.append(len(text))
        segments = [text[a:b] for a, b in itertools.pairwise(cuts) if b > a]
        found: list[bytes | None] = []
        missing: dict[str, int] = {}
        stats = self.stats
        hit_bytes = len(known)
        with self._lock:
            if head is not None:
                stats.head_hits += 1
                stats.hit_segments += head.segments
            m = self._map
            for seg in segments:
                entry = m.get((key, seg))
                if entry is not None:
                    m.move_to_end((key, seg))
                    stats.hit_segments += 1
                    hit_bytes += len(entry)
                elif seg not in missing:
                    missing[seg] = len(missing)
                found.append(entry)
            stats.hit_tokens += hit_bytes >> 2
        if not missing:
            ids = TokenIds(b"".join([known, *found]))  # type: ignore[list-item]  # every entry found
            self._remember(key, boundaries, text, cuts, head, found[-1] if found else None, ids.int32_le)
            return ids
        new = list(missing)
        got: dict[str, bytes] = {}
        names: dict[str, str] = {}
        shared = self.shared
        if shared is not None and identity is not None:
            ident = identity()
            names = {seg: shared.name(ident, seg) for seg in new if len(seg) >= MIN_CHARS}
            for seg, name in names.items():
                entry = shared.get(name)
                if entry is not None:
                    got[seg] = entry
            if got:
                new = [seg for seg in new if seg not in got]
        if new and check is not None:
            check(new, (hit_bytes + sum(map(len, got.values()))) >> 2)
        fresh = dict(zip(new, [_int32(ids) for ids in encode_batch(new)], strict=True)) if new else {}
        if shared is not None:
            for seg, entry in fresh.items():
                if seg in names:
                    shared.put(names[seg], entry)
        with self._lock:
            for seg, entry in itertools.chain(got.items(), fresh.items()):
                self._put((key, seg), entry)
                stats.miss_segments += 1
                stats.miss_tokens += len(entry) >> 2
            for entry in got.values():
                stats.shared_segments += 1
                stats.shared_tokens += len(entry) >> 2
            self._evict()
        fresh.update(got)
        parts = [f if f is not None else fresh[s] for f, s in zip(found, segments, strict=True)]
        joined = b"".join([known, *parts])
        self._remember(key, boundaries, text, cuts, head, parts[-1] if parts else None, joined)
        return TokenIds(joined, frozenset(missing))

    def _head_of(self, key: int, boundaries: Boundaries, text: str) -> _Head | None:
        """The newest remembered head that `text` starts with, where `text` has a boundary marker right after
        it (so the whole text's cuts before that point are the head's: module docstring); None if none."""
        pattern = boundaries.pattern
        if pattern is None:
            return None
        with self._lock:
            heads = list(self._heads)
        for h in heads:
            if h.key == key and h.pattern is pattern and len(h.text) < len(text) and text.startswith(h.text) \
                    and pattern.match(text, len(h.text)) is not None:
                return h
        return None

    def _remember(self, key: int, boundaries: Boundaries, text: str, cuts: list[int], used: _Head | None,
                  last: bytes | None, joined: bytes) -> None:
        """Keep `text`'s head (all but its last segment: a chat prompt's generation prompt, which the next turn
        replaces by the answer) for the next turn. `cuts`: where this encode cut the text after `used` (the
        head it started from, which the new head supersedes), ending with len(text); `last`: the ids of the
        last segment; `joined`: the whole text's ids."""
        pattern = boundaries.pattern
        if pattern is None or last is None or self.max_bytes <= 0:
            return
        end = cuts[-2] if len(cuts) >= 2 else 0
        if end <= (len(used.text) if used is not None else 0):
            return  # no segment beyond what is known already (or nothing to keep)
        segments = (used.segments if used is not None else 0) + len(cuts) - 2
        new = _Head(key, pattern, text[:end], joined, len(joined) - len(last), segments)
        limit = self.max_bytes // HEAD_SHARE
        if new.size > limit:
            return
        with self._lock:
            # The head this turn started from, and any other this one extends, are superseded by it.
            heads = [h for h in self._heads if h is not used and not (h.key == key and new.text.startswith(h.text))]
            heads.insert(0, new)
            total = sum(h.size for h in heads)
            while len(heads) > MAX_HEADS or total > limit:
                total -= heads.pop().size
            self._heads = heads
            self._head_bytes = total

    def _put(self, k: tuple[int, str], entry: bytes) -> None:
        if k in self._map:
            return
        self._map[k] = entry
        self._bytes += _entry_bytes(k[1], entry)

    def _evict(self) -> None:
        m = self._map
        while self._bytes > self.max_bytes and m:
            (_, seg), entry = m.popitem(last=False)
            self._bytes -= _entry_bytes(seg, entry)
            self.stats.evicted += 1


def _entry_bytes(seg: str, entry: bytes) -> int:
    return sys.getsizeof(seg) + sys.getsizeof(entry) + _ENTRY_OVERHEAD
