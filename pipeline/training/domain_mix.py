"""How CPT weighs the environments of its pool: each domain's share of the trajectory tokens (`cpt.domain_balance`).

A pool's environments are rarely of one size, and a CPT budget is a fraction of an epoch: each domain is then
trained on in proportion to its tokens. On the demo the text games are 13% of the cpt pool's trajectory tokens, so
`make learn`'s 32 steps of 1,024 tokens saw about 4 rows of them, and CPT moved the public ALFWorld turns by -0.1;
the same 32 steps on the games alone moved them +13.0 [+8.3, +17.5] (docs/performance.md, 2026-12-05).

`domain_balance` b makes each domain's share of the trajectory tokens proportional to its token count to the power b:
1 keeps the pool's own shares (nothing is repeated, the sequences are those of a pool never weighed); 0 gives every
domain the same share; in between is the temperature sampling of multilingual pretraining (XLM-R samples languages
at 0.3). The shares are reached by repeating whole windows of the smaller domains, never by leaving windows of the
larger ones out: a domain's factor is its target share over its own share, divided by the smallest such ratio, so the
domain that gains least keeps every window once and no window is lost. A window is written floor(factor) times, and
once more with the probability of the fraction, drawn from (seed, trajectory, first turn) so that the choice does not
depend on the order of the pool. Each copy after the first draws its own keep-ratio masks (its spans reseeded), so a
repeated echo is thinned differently, as another epoch would thin it.

The world-knowledge corpus is not a domain here: its ratio (`world_knowledge_token_ratio`) counts the trajectory
labels as weighed, so a corpus large enough keeps its share of the gradient, and one used whole (the demo's) weighs
less as the trajectories are repeated.
"""

import hashlib
import math
from collections.abc import Mapping

from pipeline.training.sequences import MaskSpan, TokenSequence

# Factors this close to an integer are that integer: float noise must not add a copy to one window in a billion.
EPSILON = 1e-9


def domain_factors(tokens: Mapping[str, int], balance: float) -> dict[str, float]:
    """Each domain's repetition factor (1 or more) for `balance`, from the domains' trajectory tokens."""
    present = {domain: count for domain, count in tokens.items() if count > 0}
    if balance == 1 or len(present) < 2:
        return dict.fromkeys(tokens, 1.0)
    total = sum(present.values())
    weights = {domain: count**balance for domain, count in present.items()}
    weight_sum = sum(weights.values())
    ratios = {domain: (weights[domain] / weight_sum) / (count / total) for domain, count in present.items()}
    lowest = min(ratios.values())
    return {domain: ratios[domain] / lowest if domain in ratios else 1.0 for domain in tokens}


def _hash64(*parts: object) -> int:
    """A 64-bit integer drawn from `parts`: the same on every run and in every process."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def copies(factor: float, seed: int, source: str, first_turn: int) -> int:
    """How many times one window is written: floor(factor), plus one with the probability of the fraction."""
    whole = math.floor(factor + EPSILON)
    fraction = factor - whole
    if fraction <= EPSILON:
        return whole
    return whole + (_hash64(seed, source, first_turn, "domain-mix") / 2**64 < fraction)


def reseeded(sequence: TokenSequence, copy: int) -> TokenSequence:
    """Copy `copy` of a window (0: the window itself): the same tokens and labels, its own keep-ratio masks."""
    if copy == 0:
        return sequence
    spans = [MaskSpan(span.start, span.end, span.keep_ratio, _hash64(span.seed, copy)) for span in sequence.spans]
    return TokenSequence(
        sequence.input_ids,
        sequence.labels,
        sequence.source,
        sequence.kind,
        list(sequence.turn_indices),
        spans,
        sequence.stratum,
    )
