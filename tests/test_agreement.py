"""Policy agreement's statistics (issue 31, deliver 2) on hand-made tables: Wilson intervals for a success rate,
Newcombe's interval for the paired difference simulator - real, Kendall's tau-b with ties, and the rates, pairs and
ranks per environment and pooled over all of them.

Published values where there are any: Wilson's interval of 81 of 263 is Newcombe's (1998, Statist. Med. 17:857,
Table I); the paired difference of Cavo et al. (2012), 59 / 6 / 16 / 80, is the value Fagerland, Lydersen and Laake
give for Newcombe's square-and-add interval (Statistical Analysis of Contingency Tables, chapter 8; the
contingencytables R package's test). The rest are worked by hand in the comments.
"""

import pytest

from pipeline.fidelity.agreement import (
    ALL_ENVIRONMENTS,
    Outcome,
    agreement_table,
    kendall_tau,
    paired_difference_interval,
    policy_agreement,
    tau_text,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("successes", "episodes", "expected"),
    [
        (81, 263, (0.3080, 0.2553, 0.3662)),  # Newcombe 1998, Table I
        (10, 10, (1.0, 0.7225, 1.0)),  # all of ten: at least 0.72, not the certainty [1, 1] a bootstrap gives
        (0, 10, (0.0, 0.0, 0.2775)),
        (5, 10, (0.5, 0.2366, 0.7634)),  # symmetric about a half
        (1, 2, (0.5, 0.0945, 0.9055)),
    ],
)
def test_wilson_interval(successes, episodes, expected):
    interval = wilson_interval(successes, episodes)
    assert (round(interval.mean, 4), round(interval.low, 4), round(interval.high, 4)) == expected
    assert interval.n == episodes


def test_no_episodes_give_no_rate():
    assert wilson_interval(0, 0).mean is None and paired_difference_interval([]).mean is None


def pairs(both: int, first_only: int, second_only: int, neither: int) -> list[tuple[bool, bool]]:
    """(first, second) outcomes: both succeeded, only the first, only the second, neither."""
    return (
        [(True, True)] * both
        + [(True, False)] * first_only
        + [(False, True)] * second_only
        + [(False, False)] * neither
    )


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ((59, 6, 16, 80), (-0.0621, -0.1186, -0.0046)),  # Cavo et al. 2012, as Fagerland et al. give it
        # Ten agreeing successes: no difference, but ten episodes cannot exclude one of +-0.28 (the Wilson margins).
        ((10, 0, 0, 0), (0.0, -0.2775, 0.2775)),
        ((0, 0, 10, 0), (-1.0, -1.0, -0.6075)),  # the simulator fails all ten the real environment passes
        ((3, 2, 0, 5), (0.2, -0.1027, 0.4493)),  # two extra successes in ten: not measurable
    ],
)
def test_the_paired_difference_is_newcombes_square_and_add_interval(table, expected):
    interval = paired_difference_interval(pairs(*table))
    assert (round(interval.mean, 4), round(interval.low, 4), round(interval.high, 4)) == expected
    assert interval.n == sum(table)


@pytest.mark.parametrize(
    ("real", "simulated", "tau", "why"),
    [
        ([1.0, 0.8, 0.5, 0.2, 0.0], [0.9, 0.7, 0.6, 0.1, 0.0], 1.0, None),
        ([1.0, 0.8, 0.5, 0.2, 0.0], [0.0, 0.1, 0.6, 0.7, 0.9], -1.0, None),
        # Two ties in the real rates (pairs 2-3 and 4-5): 8 concordant pairs of 10, none discordant; tau-b =
        # 8 / sqrt((10 - 2) x (10 - 0)) = 0.894, where tau-a would say 0.8.
        ([1.0, 0.5, 0.5, 0.0, 0.0], [1.0, 0.8, 0.6, 0.2, 0.0], 0.8944, None),
        # One swap among five: 9 concordant, 1 discordant: (9 - 1) / 10.
        ([1.0, 0.8, 0.5, 0.2, 0.0], [1.0, 0.5, 0.8, 0.2, 0.0], 0.8, None),
        ([1.0, 0.8, 0.5, 0.2, 0.0], [0.0] * 5, None, "the simulator gives every policy the same success rate"),
        ([0.0] * 3, [1.0, 0.5, 0.0], None, "the real environment gives every policy the same success rate"),
        ([1.0], [1.0], None, "fewer than two policies"),
    ],
)
def test_kendall_tau_b(real, simulated, tau, why):
    rank = kendall_tau("terminal", real, simulated)
    assert rank.environment == "terminal" and rank.policies == len(real)
    assert (None if rank.tau is None else round(rank.tau, 4)) == tau
    assert (rank.why is None) if why is None else why in rank.why


POLICIES = ["solver", "solver-noise-0.5", "random"]


def outcomes(environment: str, table: dict[str, str]) -> list[Outcome]:
    """{policy: "1101"} -> one outcome per seed, 1 a success."""
    return [
        Outcome(environment, policy, seed, mark == "1")
        for policy, marks in table.items()
        for seed, mark in enumerate(marks)
        if mark != "-"  # an episode that did not finish
    ]


REAL = outcomes("terminal", {"solver": "1111", "solver-noise-0.5": "1100", "random": "0000"}) + outcomes(
    "text-game", {"solver": "11", "solver-noise-0.5": "01", "random": "00"}
)
# The simulator ranks the terminal ladder right but gives the random policy a success; in the text game it never
# succeeds; one terminal episode of the noisy solver did not finish (its request failed).
SIMULATED = outcomes("terminal", {"solver": "1110", "solver-noise-0.5": "1-00", "random": "0100"}) + outcomes(
    "text-game", {"solver": "00", "solver-noise-0.5": "00", "random": "00"}
)


def test_rates_pairs_and_ranks_per_environment_and_pooled():
    agreement = policy_agreement("tiny", REAL, SIMULATED, POLICIES)
    rates = {(row.environment, row.policy): row for row in agreement.rates}
    assert [row.environment for row in agreement.rates] == ["terminal"] * 3 + ["text-game"] * 3 + ["all"] * 3
    noisy = rates[("terminal", "solver-noise-0.5")]
    assert (noisy.real.mean, noisy.real.n) == (0.5, 4)
    assert (round(noisy.simulated.mean, 4), noisy.simulated.n) == (0.3333, 3)  # the unfinished episode left out
    # Paired on the three seeds both finished: seeds 0, 2, 3 -> (1, 1), (0, 0), (0, 0): no difference.
    assert (noisy.difference.mean, noisy.difference.n) == (0.0, 3)
    pooled = rates[(ALL_ENVIRONMENTS, "solver")]
    assert (pooled.real.mean, pooled.real.n) == (1.0, 6) and pooled.simulated.mean == 0.5
    assert pooled.difference.mean == -0.5 and pooled.difference.high < 0  # measurably worse
    ranks = {rank.environment: rank for rank in agreement.ranks}
    # terminal: real 1, 0.5, 0; simulated 0.75, 0.33, 0.25: the same order.
    assert ranks["terminal"].tau == 1.0
    assert ranks["text-game"].tau is None and "simulator gives every policy" in ranks["text-game"].why
    # all: real 1, 0.5, 0 over 6 seeds; simulated 3/6, 1/5, 1/6: the same order.
    assert ranks["all"].tau == 1.0 and agreement.tau() == 1.0 and tau_text(agreement) == "+1.00 over 3 policies"


def test_the_agreement_table_reads_as_the_rates_do():
    table = agreement_table([policy_agreement("tiny", REAL, SIMULATED, POLICIES)])
    assert "\ntiny: terminal\n" in table and "\ntiny: all\n" in table
    assert "solver                   4/4  1.00 [0.51, 1.00]     0.75 [0.30, 0.95]     -0.25 [-0.70, +0.28] (4)" in table
    assert "solver-noise-0.5         4/3  0.50 [0.15, 0.85]     0.33 [0.06, 0.79]     +0.00 [-0.47, +0.47] (3)" in table
    assert "Kendall tau-b: undefined (the simulator gives every policy the same success rate: no ranking)" in table
