"""Paired statistics: McNemar's exact p-values and bootstrap intervals on known cases."""

from __future__ import annotations

import pytest

from pask_agent.errors import ConfigError
from pask_agent.eval.paired import compare_paired, mcnemar_exact, paired_table


def test_mcnemar_exact_matches_the_binomial() -> None:
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)  # all six discordant one way
    assert mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)
    assert mcnemar_exact(9, 1) == mcnemar_exact(1, 9)


def test_bootstrap_interval_brackets_the_difference_and_shrinks_with_n() -> None:
    a = {f"c{i}": i % 4 != 0 for i in range(40)}  # 75 %
    b = {f"c{i}": i % 2 == 0 for i in range(40)}  # 50 %
    c = compare_paired(a, b, resamples=2000)
    assert c.n == 40 and c.difference == pytest.approx(0.25)
    assert c.ci_low < 0.25 < c.ci_high and c.ci_low < 0  # 40 cases cannot tell
    assert (c.only_a, c.only_b) == (20, 10)
    big = compare_paired(
        {f"{k}{i}": v for k in "xyzw" for i, v in a.items()},
        {f"{k}{i}": v for k in "xyzw" for i, v in b.items()},
        resamples=2000,
    )
    assert big.ci_high - big.ci_low < c.ci_high - c.ci_low and big.p_value < c.p_value
    assert big.ci_low > 0 and big.p_value < 0.01  # 160 can
    assert "| pask | 40 | 75.0 | 50.0 | +25.0 |" in paired_table([("pask", c)])


def test_runs_without_shared_cases_are_refused() -> None:
    with pytest.raises(ConfigError, match="share no case"):
        compare_paired({"a": True}, {"b": True})
