"""The row order (pipeline/training/row_order.py): every stretch of an epoch holds each stratum in its share, rows
never mix strata, and the Trainer trains the rows in that order on every epoch, on a resume and across processes."""

import numpy as np
import pytest

from pipeline.training.packing import PackedCollator, PackedSequences, pack_rows
from pipeline.training.row_order import StratifiedRowSampler, stratified_order
from pipeline.training.sequences import IGNORE_INDEX
from tests.test_packing import ListSequences, tiny_model


def interleaved_strata(sizes, seed):
    strata = [f"s{i}" for i, size in enumerate(sizes) for _ in range(size)]
    np.random.default_rng(seed).shuffle(strata)
    return strata


@pytest.mark.parametrize("sizes", [(160, 41, 30, 11), (1, 1), (7,), (50, 49), (3, 200), (13, 13, 13)])
@pytest.mark.parametrize("epoch", [0, 3])
def test_every_prefix_of_the_order_holds_each_stratum_in_its_share(sizes, epoch):
    strata = interleaved_strata(sizes, seed=len(sizes))
    order = stratified_order(strata, seed=5, epoch=epoch)
    assert sorted(order) == list(range(len(strata)))
    taken = np.arange(1, len(strata) + 1)
    for i, size in enumerate(sizes):
        held = np.cumsum([strata[row] == f"s{i}" for row in order])
        assert np.abs(held - taken * size / len(strata)).max() < 2


def test_a_uniform_shuffle_is_what_the_stratified_order_improves_on():
    """The demo's case, 32 of 245 rows: the shuffle's first 32 rows miss the pool's shares by far more than two
    rows at some seed; the stratified order never does."""
    strata = interleaved_strata((162, 42, 30, 11), seed=0)
    share = 32 * 42 / len(strata)
    shuffled = [
        sum(strata[r] == "s1" for r in np.random.default_rng(seed).permutation(len(strata))[:32]) for seed in range(20)
    ]
    stratified = [sum(strata[r] == "s1" for r in stratified_order(strata, seed)[:32]) for seed in range(20)]
    assert max(abs(count - share) for count in shuffled) > 3
    assert max(abs(count - share) for count in stratified) < 2


def test_the_order_is_the_seeds_and_the_epochs():
    strata = interleaved_strata((20, 10, 5), seed=1)
    assert stratified_order(strata, 3, 1) == stratified_order(strata, 3, 1)
    assert stratified_order(strata, 3, 1) != stratified_order(strata, 3, 2)
    assert stratified_order(strata, 3, 1) != stratified_order(strata, 4, 1)
    # Which rows of a stratum come first is the seed's too, not always the same ones.
    firsts = {tuple(r for r in stratified_order(strata, seed) if strata[r] == "s0")[:3] for seed in range(10)}
    assert len(firsts) > 5


def test_rows_packed_by_stratum_hold_one_stratum_and_every_sequence_once():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, 300).tolist()
    strata = interleaved_strata((150, 100, 50), seed=2)
    rows = pack_rows(lengths, 64, seed=0, strata=strata)
    assert sorted(i for row in rows for i in row) == list(range(300))
    assert all(len({strata[i] for i in row}) == 1 and sum(lengths[i] for i in row) <= 64 for row in rows)
    # Without strata the rows mix them, as before.
    assert any(len({strata[i] for i in row}) > 1 for row in pack_rows(lengths, 64, seed=0))


class StrataSequences(ListSequences):
    def __init__(self, sequences, strata):
        super().__init__(sequences)
        self._strata = strata

    def strata(self):
        return self._strata


def row_sequences(count, width):
    """`count` sequences of one full row each, the first token naming the sequence."""
    return [{"input_ids": [i] + [1] * (width - 1), "labels": [IGNORE_INDEX] + [1] * (width - 1)} for i in range(count)]


def test_the_trainer_trains_the_rows_in_the_stratified_order_every_epoch_and_on_a_resume(tmp_path):
    from accelerate import skip_first_batches
    from transformers import TrainingArguments

    from pipeline.training.trainer import _packed_trainer_class

    width, strata = 16, interleaved_strata((9, 4, 2), seed=3)
    rows = PackedSequences(StrataSequences(row_sequences(len(strata), width), strata), width, seed=0, by_stratum=True)
    args = TrainingArguments(
        str(tmp_path),
        per_device_train_batch_size=1,
        seed=7,
        data_seed=7,
        use_cpu=True,
        report_to="none",
        remove_unused_columns=False,
    )
    trainer = _packed_trainer_class()(
        row_order="stratified",
        model=tiny_model(),
        args=args,
        train_dataset=rows,
        data_collator=PackedCollator(0, width),
    )
    loader = trainer.get_train_dataloader()
    trained = {}
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        trained[epoch] = [int(batch["input_ids"][0, 0]) for batch in loader]
        expected = [rows.rows[r][0] for r in stratified_order(rows.row_strata, 7, epoch)]
        assert trained[epoch] == expected
    assert trained[0] != trained[1]
    # A run resumed after 5 batches of epoch 1 trains the rest of that epoch's order.
    loader.set_epoch(1)
    assert [int(batch["input_ids"][0, 0]) for batch in skip_first_batches(loader, 5)] == trained[1][5:]
    # `shuffled` is the Trainer's own sampler.
    shuffled = _packed_trainer_class()(
        row_order="shuffled", model=tiny_model(), args=args, train_dataset=rows, data_collator=PackedCollator(0, width)
    )
    assert not isinstance(shuffled._get_train_sampler(), StratifiedRowSampler)


def test_processes_deal_out_one_stratified_order_between_them():
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    strata = interleaved_strata((12, 6, 2), seed=4)
    sampler = StratifiedRowSampler(strata, seed=1)
    sampler.set_epoch(2)
    shards = [list(BatchSamplerShard(BatchSampler(sampler, 2, False), 2, i)) for i in range(2)]
    dealt = [index for pair in zip(*shards, strict=True) for batch in pair for index in batch]
    assert dealt == stratified_order(strata, 1, 2)
