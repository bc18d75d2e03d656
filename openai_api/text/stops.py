"""Stop strings that never leak, not even partly, into what is sent to the client."""

from __future__ import annotations


class StopStringMatcher:
    """Text goes in as it is generated; text that is safe to send comes out.

    The matcher holds back the longest tail of the text that could still be the start of a stop
    string, so a stop split across tokens ("<|im" + "_end|>") is never partly sent. Work per call is
    bounded by the new text plus the longest stop string, independent of how much came before.
    """

    __slots__ = ("_held", "_max", "_stops", "matched", "stopped")

    def __init__(self, stops: list[str]) -> None:
        self._stops = sorted({s for s in stops if s}, key=len, reverse=True)
        self._max = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def push(self, text: str) -> str:
        """Return the part of the text so far that is safe to emit; sets `stopped` on a match."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        # The stop that completes first wins (ties: the one that starts earlier), exactly as if the
        # text had arrived one character at a time, so the cut never depends on how Triton chunked it.
        first, first_end = -1, -1
        for s in self._stops:
            i = buf.find(s)
            if i != -1 and (first == -1 or (i + len(s), i) < (first_end, first)):
                first, first_end, self.matched = i, i + len(s), s
        if first != -1:
            self.stopped = True
            self._held = ""
            return buf[:first]
        keep = 0
        for k in range(min(self._max - 1, len(buf)), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self._stops):
                keep = k
                break
        if keep:
            self._held = buf[-keep:]
            return buf[:-keep]
        self._held = ""
        return buf

    def flush(self) -> str:
        """At the end of generation the held-back tail turned out not to be a stop: release it."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
