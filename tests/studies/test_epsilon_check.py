"""The ε check's two accountants agree on one order grid (Opacus against Google's dp-accounting)."""

import pytest

from studies.epsilon_check import collapse, dp_accounting_epsilon, opacus_epsilon


@pytest.mark.parametrize(
    "history,delta",
    [
        ([[1.0, 0.25, 30]], 1e-3),
        ([[1.066, 1.0, 1], [0.1066, 1.0, 1], [0.2132, 1.0, 1]], 1e-3),  # client-level blocks, large ε
        ([[0.8, 0.01, 5000], [1.2, 0.02, 300]], 1e-5),
    ],
)
def test_opacus_and_dp_accounting_agree_on_one_grid(history, delta):
    assert opacus_epsilon(history, delta) == pytest.approx(dp_accounting_epsilon(history, delta), rel=1e-6)


def test_rows_that_differ_only_in_the_site_are_merged_wherever_they_are():
    row = {"method": "m", "who": "site 0", "unit": "example", "steps": 3, "printed": 1.0, "recomputed": 1.0}
    other = {**row, "unit": "hospital", "who": "server"}
    out = collapse([row, other, {**row, "who": "site 1"}, {**other}])
    assert [(r["who"], r["count"]) for r in out] == [("2 sites", 2), ("2 hospitals (server)", 2)]
