"""The traces the fleet benchmark replays (deterministic for a seed): chat/agent conversations whose every turn
extends the conversation's prefix.

A conversation is a system message (a prompt shared by every conversation of the trace, then the
conversation's own context: an agent's tool docs, a file, a retrieved document), then turns: each a user
message (a question, a tool result) whose answer is streamed back and appended before the next turn, after a
think time. So turn k's prompt is turn k-1's prompt + its answer + a new message: a replica that served turn
k-1 holds all but the new tail in its KV cache.

* ``multi_turn``: many conversations, each with a prefix of its own, started staggered.
* ``skewed``: one hot conversation context (several concurrent clients, an agent fanning out over one
  document: every request starts with the same long prefix) plus background conversations. Sending
  every request to the holder of its prefix would pile the hot one onto one replica.

Text is words drawn from a fixed vocabulary of common English words (about one SmolLM2 token each, some
two), so sizes are given in words; the replicas count real tokens from the gateway's tokenizer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

VOCAB = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part over new sound take only little work know place year live me back give most very "
    "after thing our just name good sentence man think say great where help through much before line right "
    "too mean old any same tell boy follow came want show also around form three small set put end does "
    "another well large must big even such because turn here why ask went men read need land different home "
    "us move try kind hand picture again change off play spell air away animal house point page letter "
    "mother answer found study still learn should world high every near add food between own below country "
    "plant last school father keep tree never start city earth eye light thought head under story saw left "
    "few while along might close something seem next hard open example begin life always those both paper "
    "together got group often run important until children side feet car mile night walk white sea began grow"
).split()


@dataclass
class Turn:
    user: str
    max_tokens: int
    think_s: float  # pause after this turn's answer, before the next turn


@dataclass
class Conversation:
    cid: str
    group: str  # "conv" (multi-turn), "hot" or "background" (skewed)
    start_s: float
    system: str
    turns: list[Turn] = field(default_factory=list)


@dataclass
class TraceShape:
    """Sizes of one trace; ``quick`` shrinks them to a smoke run of a few seconds."""

    conversations: int = 32
    turns: int = 6
    context_words: tuple[int, int] = (900, 1800)  # the conversation's own prefix (~1-2k tokens)
    user_words: tuple[int, int] = (40, 200)
    max_tokens: tuple[int, int] = (24, 64)
    think_s: float = 1.0  # mean, exponential, capped at 3x
    stagger_s: float = 6.0  # conversations start uniformly over this window
    # skewed only
    hot_clients: int = 12
    hot_turns: int = 6
    hot_context_words: int = 1800
    hot_think_s: float = 0.3
    background: int = 16
    background_turns: int = 4


QUICK = TraceShape(conversations=6, turns=3, context_words=(300, 600), user_words=(10, 40), max_tokens=(4, 8),
                   think_s=0.05, stagger_s=0.2, hot_clients=4, hot_turns=2, hot_context_words=600,
                   hot_think_s=0.02, background=3, background_turns=2)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def _turns(rng: random.Random, shape: TraceShape, n: int, think_s: float) -> list[Turn]:
    return [Turn(user=words(rng, rng.randint(*shape.user_words)), max_tokens=rng.randint(*shape.max_tokens),
                 think_s=min(rng.expovariate(1 / think_s), 3 * think_s) if think_s > 0 else 0.0)
            for _ in range(n)]


def _system(rng: random.Random, name: str) -> str:
    # The part every conversation of a trace shares (an operator's system prompt), ~120 words.
    return f"You are {name}, a careful assistant. " + words(rng, 120)


def multi_turn(shape: TraceShape, seed: int = 1) -> list[Conversation]:
    rng = random.Random(seed)
    shared = _system(rng, "multi-turn agent")
    convs = []
    for i in range(shape.conversations):
        context = words(rng, rng.randint(*shape.context_words))
        convs.append(Conversation(cid=f"c{i}", group="conv", start_s=rng.uniform(0, shape.stagger_s),
                                  system=f"{shared}\nContext {i}: {context}",
                                  turns=_turns(rng, shape, shape.turns, shape.think_s)))
    return sorted(convs, key=lambda c: c.start_s)


def skewed(shape: TraceShape, seed: int = 2) -> list[Conversation]:
    rng = random.Random(seed)
    shared = _system(rng, "skewed agent")
    hot = f"{shared}\nContext hot: {words(rng, shape.hot_context_words)}"
    convs = [Conversation(cid=f"hot{i}", group="hot", start_s=rng.uniform(0, shape.stagger_s / 4), system=hot,
                          turns=_turns(rng, shape, shape.hot_turns, shape.hot_think_s))
             for i in range(shape.hot_clients)]
    for i in range(shape.background):
        context = words(rng, rng.randint(*shape.context_words))
        convs.append(Conversation(cid=f"bg{i}", group="background", start_s=rng.uniform(0, shape.stagger_s),
                                  system=f"{shared}\nContext {i}: {context}",
                                  turns=_turns(rng, shape, shape.background_turns, shape.think_s)))
    return sorted(convs, key=lambda c: c.start_s)


TRACES = {"multi_turn": multi_turn, "skewed": skewed}
