"""Choosing a job's next token for the SmolLM2 reference models: penalties, masks, temperature, top-k, top-p.

``sample(job, logits)`` applies, in order: the repetition, presence and frequency penalties; bad words and
``min_tokens`` (end ids and stop ids masked until then); the guide's bitmask (``smollm2_guide.py``); then greedy
(``temperature == 0`` or ``top_k == 1``) or temperature, top-k and top-p, drawing with the job's seeded generator.
It returns the token, its log-prob and, when ``job.top_logprobs`` is set, its rank and the most likely
alternatives (``ranked``), all read from one distribution: ``log_softmax`` of the logits after penalties, masks
and temperature, before top-k / top-p. ``logits`` is modified in place. The guide's mask raises
``smollm2_guide.GuideEnded`` when only an end is left but every end is masked (the engine then ends the request),
``GuideError`` when every token it allows is banned.

Imports neither Triton nor the engine.
"""

from __future__ import annotations

import torch
from smollm2_job import Job


def ranked(job: Job, log_probs: torch.Tensor, token: int) -> tuple[int, list[tuple[int, float]]] | None:
    """With alternatives asked for: the sampled token's rank (1 = most likely) in `log_probs`, the
    distribution it was sampled from (after penalties, masks and temperature; before top-k / top-p), and
    that distribution's `job.top_logprobs` most likely tokens, most likely first (masked ones left out)."""
    if job.top_logprobs is None:
        return None
    rank = int((log_probs > log_probs[token]).sum()) + 1
    if job.top_logprobs <= 0:
        return rank, []
    values, ids = torch.topk(log_probs, min(job.top_logprobs, log_probs.numel()))
    return rank, [(int(i), float(v)) for v, i in zip(values.tolist(), ids.tolist(), strict=True)
                  if v != float("-inf")]


def sample(job: Job, logits: torch.Tensor) -> tuple[int, float, tuple[int, list[tuple[int, float]]] | None]:
    """``job``'s next token from ``logits`` (its last position, 1-D over the vocabulary; changed in place): the
    token, its log-prob and, with alternatives asked for, ``ranked``'s rank and alternatives (else None)."""
    if job.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(job.prompt) | set(job.generated)), dtype=torch.long)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / job.repetition_penalty, vals * job.repetition_penalty)
    if job.counts and (job.presence_penalty or job.frequency_penalty):
        toks = torch.tensor(list(job.counts), dtype=torch.long)
        cnt = torch.tensor([job.counts[t] for t in job.counts], dtype=logits.dtype)
        logits[toks] -= job.presence_penalty + job.frequency_penalty * cnt
    masked = [t for t in job.bad_single if 0 <= t < logits.numel()]
    for word in job.bad_multi:
        prefix = word[:-1]
        if len(prefix) <= len(job.generated) and job.generated[len(job.generated) - len(prefix) :] == prefix:
            masked.append(word[-1])
    if len(job.generated) < job.min_tokens:
        masked += [t for t in (job.end_id, *job.stop_ids) if 0 <= t < logits.numel()]
    if masked:
        logits[torch.tensor(masked, dtype=torch.long)] = float("-inf")
    if job.guide_state is not None:
        job.guide_state.mask(logits, [job.end_id, *job.stop_ids])

    greedy = job.temperature == 0.0 or job.top_k == 1
    scaled = logits if greedy else logits / job.temperature
    log_probs = torch.log_softmax(scaled, dim=-1)
    if greedy:
        token = int(torch.argmax(scaled))
        return token, float(log_probs[token]), ranked(job, log_probs, token)
    filtered = scaled.clone()
    if job.top_k > 0 and job.top_k < filtered.numel():
        kth = torch.topk(filtered, job.top_k).values[-1]
        filtered[filtered < kth] = float("-inf")
    if 0.0 < job.top_p < 1.0:
        sorted_logits, order = torch.sort(filtered, descending=True)
        cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
        # Drop tokens once the mass before them already reaches top_p (the first always stays).
        drop = (cum - torch.softmax(sorted_logits, dim=-1)) >= job.top_p
        filtered[order[drop]] = float("-inf")
    probs = torch.softmax(filtered, dim=-1)
    token = int(torch.multinomial(probs, 1, generator=job.generator))
    return token, float(log_probs[token]), ranked(job, log_probs, token)
