"""The order an epoch's packed rows are trained in (`row_order`): stratified, or a uniform shuffle.

A training budget under one epoch trains on the rows its order puts first. Under a uniform shuffle the
environments' shares of those rows are a draw: the demo's CPT trains on 32 of 245 rows (0.13 of an epoch), which
held terminal text for 27%, 12% and 20.5% of their tokens at seeds 0, 1 and 2 (17% of the pool), and the three
scored 46.0, 34.9 and 42.1 on the validation pool. A run that finishes its epochs sees every row either way; the
order then only decides when.

`stratified` gives every stretch of an epoch each stratum's share of the rows (a stratum: a row's environment, or
world knowledge; packing keeps a row within one, pipeline/training/packing.py). It is systematic sampling: a
stratum of n_s rows puts them, in a seeded order, at the positions (k + u_s) / n_s for k = 0 .. n_s - 1, with u_s
drawn uniformly from [0, 1) per stratum; the epoch is every row sorted by position. For every m, the first m rows
then hold less than two rows more or fewer of stratum s than its share, m * n_s / n. Which rows of a stratum come
first is still the seed's. Shares are of rows, not tokens: within a stratum packing fills every row but the last.

Measured on the demo's CPT (docs/performance.md, 2026-12-06): at seeds 0, 1 and 2 the stratified order's first 32
rows held terminal text for 17.7%, 17.0% and 18.8% of their tokens, and the three scored 38.6, 32.7 and 38.1 on the
same validation targets: a range of 5.9 points where the shuffle's was 11.1, and a mean 4.5 points below its 41.0.
What a seed decides there lies within the environments (whether tool-call answers close their JSON and stop,
whether a command that prints nothing is answered with nothing), so `shuffled` stays the default.

Each epoch draws its own order from (seed, epoch). Every process of a multi-device run draws the same one
(accelerate's BatchSamplerShard deals its batches out), and a run resumed mid-epoch draws it again and skips the
batches it trained, as the Trainer does with its own sampler.
"""

from collections.abc import Iterator, Sequence

import numpy as np


def stratified_order(strata: Sequence[str], seed: int, epoch: int = 0) -> list[int]:
    """The indices of `strata` (one entry per row) in an order whose every prefix holds each stratum in its share."""
    rng = np.random.default_rng([seed, epoch])
    labels = np.asarray(strata, dtype=object)
    positions = np.empty(len(labels), dtype=np.float64)
    for stratum in sorted(set(strata)):
        members = np.flatnonzero(labels == stratum)
        shuffled = members[rng.permutation(len(members))]
        positions[shuffled] = (np.arange(len(members)) + rng.random()) / len(members)
    # Two strata of the same size share their grid of positions up to the offset; a drawn key breaks exact ties.
    ties = rng.random(len(labels))
    return np.lexsort((ties, positions)).tolist()


class StratifiedRowSampler:
    """A sampler (for the Trainer's DataLoader) over rows with these strata: `stratified_order` for the epoch
    `set_epoch` last named (0 until then)."""

    def __init__(self, strata: Sequence[str], seed: int):
        self.strata = list(strata)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.strata)

    def __iter__(self) -> Iterator[int]:
        return iter(stratified_order(self.strata, self.seed, self.epoch))
