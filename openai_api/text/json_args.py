"""Earlier tool calls' `arguments`: decoded from the client's JSON text, written back by what that text gives.

Why: an agent's every turn carries every earlier call's `arguments` string again, and the gateway decoded
each (`json.loads`), checked its depth and, for a template that does not render `tool_calls` itself, wrote it
back as the family's call text (`json.dumps`): work over the whole conversation on every turn (~2 ms at a
Codex turn of ~117k tokens with 48 earlier calls, more than the template's render). Here:

* `decode` parses with orjson (several times faster) and falls back to the standard library wherever orjson
  refuses (NaN, lone surrogates, deep nesting) and wherever a number may be an integer past 64 bits
  (which orjson would make a float), so the value is the one `json.loads`
  gives. An object comes back as `DecodedArguments`: a read-only dict that remembers its source text.
* `canonical` is `json.dumps(value, ensure_ascii=False)` (the families' `dump`); for a `DecodedArguments`
  it is remembered by the source text, as is `nested_deeper_than`'s verdict. Both are pure functions of
  that text, so sharing them between requests and keys leaks nothing; the decoded value itself is made
  anew for every request. Remembered in a process-wide LRU bounded in characters.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NoReturn

import orjson

# Characters of source text (and of what is remembered for it) kept at most: ~16 MB of text at 1 byte a
# character, a few agent sessions' calls.
MAX_CHARS = 8 << 20


# orjson reads an integer past 64 bits as a float (json.loads keeps it exact): any float this large may have been
# one. (A regular expression looking for long digit runs in the text cost ~10 ns a character: more than orjson.)
_BIG = float(2**64)


def _past_64_bits(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        kind = type(v)
        if kind is dict:
            stack.extend(v.values())
        elif kind is list:
            stack.extend(v)
        elif kind is float and not -_BIG < v < _BIG:
            return True
    return False


class DecodedArguments(dict[str, Any]):
    """A JSON object decoded from `source`, read-only so that what is remembered for `source` stays true of
    it (the chat template's sandbox never changes values; gateway code that would gets a TypeError)."""

    __slots__ = ("source",)

    def __init__(self, value: dict[str, Any], source: str) -> None:
        super().__init__(value)
        self.source = source

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("decoded tool-call arguments are read-only; copy them into a dict to change them")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only


def decode(text: str) -> Any:
    """`json.loads(text)`, an object as `DecodedArguments`. Raises what `json.loads` raises (ValueError,
    RecursionError)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = json.loads(text)  # what orjson refuses and Python's parser takes, or the same error
    else:
        if _past_64_bits(value):
            value = json.loads(text)  # orjson turns integers past 64 bits into floats; Python keeps them exact
    return DecodedArguments(value, text) if type(value) is dict else value


class _Memo:
    """source text -> what is remembered for it (canonical text, depth verdicts), LRU by characters."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._map: OrderedDict[str, dict[Any, Any]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, source: str, key: Any, make: Callable[[], Any]) -> Any:
        with self._lock:
            entry = self._map.get(source)
            if entry is not None:
                self._map.move_to_end(source)
                if key in entry:
                    return entry[key]
        value = make()
        size = len(source) + (len(value) if isinstance(value, str) else 0)
        with self._lock:
            entry = self._map.get(source)
            if entry is None:
                entry = self._map[source] = {}
                self._chars += len(source)
            if key not in entry:
                entry[key] = value
                self._chars += size - len(source)
            while self._chars > self.max_chars and self._map:
                old, kept = self._map.popitem(last=False)
                self._chars -= len(old) + sum(len(v) for v in kept.values() if isinstance(v, str))
        return value

    def clear(self) -> None:
        with self._lock:
            self._map.clear()
            self._chars = 0


_MEMO = _Memo(MAX_CHARS)
_CANONICAL = "canonical"
# `json.dumps(v, ensure_ascii=False)` builds an encoder per call (~5 us): one, made once, writes the same text.
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode


def canonical(value: Any) -> str:
    """`json.dumps(value, ensure_ascii=False)`: remembered by the source text of a `DecodedArguments`."""
    if type(value) is DecodedArguments:
        return str(_MEMO.get(value.source, _CANONICAL, lambda: _ENCODE(value)))
    return _ENCODE(value)


def nested_deeper_than(value: Any, max_depth: int, check: Callable[[Any, int], bool]) -> bool:
    """`check(value, max_depth)` (whether `value` nests deeper than `max_depth`), remembered by the source text
    of a `DecodedArguments`."""
    if type(value) is DecodedArguments:
        return bool(_MEMO.get(value.source, ("depth", max_depth), lambda: check(value, max_depth)))
    return check(value, max_depth)
