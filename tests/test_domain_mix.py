"""cpt.domain_balance's arithmetic (pipeline/training/domain_mix.py): factors, copies, reseeded masks. The CPT stage
writing the copies is tested in tests/test_cpt_stage.py."""

import pytest

from pipeline.training.domain_mix import copies, domain_factors, reseeded
from pipeline.training.sequences import MaskSpan, TokenSequence, epoch_labels


def test_balance_one_repeats_nothing_and_zero_gives_every_domain_the_same_share():
    tokens = {"terminal": 3000, "text-game": 1000, "mcp": 2000}
    assert domain_factors(tokens, 1.0) == {"terminal": 1.0, "text-game": 1.0, "mcp": 1.0}
    factors = domain_factors(tokens, 0.0)
    assert factors == pytest.approx({"terminal": 1.0, "text-game": 3.0, "mcp": 1.5})
    trained = {domain: count * factors[domain] for domain, count in tokens.items()}
    assert len({round(value) for value in trained.values()}) == 1  # every domain alike


def test_a_balance_between_is_temperature_sampling_and_the_least_favoured_domain_keeps_factor_one():
    tokens = {"big": 9000, "small": 1000}
    factors = domain_factors(tokens, 0.5)
    # Shares proportional to sqrt(tokens): 3 : 1, where the pool holds 9 : 1.
    assert factors["big"] == 1.0
    assert factors["small"] == pytest.approx(3.0)
    assert min(domain_factors({"a": 5, "b": 7, "c": 11}, 0.3).values()) == pytest.approx(1.0)


def test_one_domain_or_an_empty_one_changes_nothing():
    assert domain_factors({"terminal": 500}, 0.0) == {"terminal": 1.0}
    assert domain_factors({"terminal": 500, "empty": 0}, 0.0) == {"terminal": 1.0, "empty": 1.0}


def test_copies_are_the_factor_on_average_drawn_per_window_whatever_the_order():
    drawn = [copies(2.25, 0, f"traj-{n}", 0) for n in range(4000)]
    assert set(drawn) == {2, 3}
    assert sum(drawn) / len(drawn) == pytest.approx(2.25, abs=0.03)
    assert [copies(2.25, 0, f"traj-{n}", 0) for n in reversed(range(4000))] == drawn[::-1]
    assert copies(2.25, 1, "traj-0", 0) in (2, 3)  # another seed, another draw
    assert all(copies(1.0, 0, f"traj-{n}", 0) == 1 for n in range(100))
    assert copies(3.0 - 1e-12, 0, "traj-0", 0) == 3  # float noise adds or loses no copy


def test_a_copy_keeps_tokens_and_labels_and_draws_its_own_masks():
    labels = list(range(100, 300))
    window = TokenSequence(list(range(200)), labels, "traj-1", "trajectory", [0, 1], [MaskSpan(0, 200, 0.25, 12345)])
    assert reseeded(window, 0) is window
    copy = reseeded(window, 1)
    assert copy.input_ids == window.input_ids and copy.labels == window.labels and copy.source == "traj-1"
    assert copy.spans[0].seed != window.spans[0].seed and (copy.spans[0].start, copy.spans[0].keep_ratio) == (0, 0.25)
    original, repeated = (epoch_labels(s.labels, s.spans, 0) for s in (window, copy))
    kept = [sum(label != -100 for label in labels) for labels in (original, repeated)]
    assert kept == [50, 50] and original != repeated
    assert reseeded(window, 2).spans[0].seed not in {window.spans[0].seed, copy.spans[0].seed}
    assert 0 <= copy.spans[0].seed < 2**64  # the Parquet column is uint64
