"""Per-site tables' validation rows (``--eval-split validation``, what `silofl tune` selects on): carved from
each site's own training rows with the site's seeded stream, never from its test rows; whole persons with
--id-column; a site with too few rows refused in one line."""

import pytest

from silofl.core.errors import DataError
from silofl.data.sites import load_site_tables
from tests.helpers import write_survival_sites


def _times(pair) -> list[float]:
    """A site's rows by their event time (column 0 of the encoded survival target; unique when generated)."""
    return sorted(pair[1][:, 0].tolist())


def test_validation_rows_come_from_each_sites_training_rows_never_its_test_rows(tmp_path):
    schema, sites, _ = write_survival_sites(tmp_path, sites=2, rows=60)
    plain = load_site_tables(schema, sites, None, 0.2, 5)
    # the test file is never read in validation mode: a path that does not exist is not an error
    val = load_site_tables(schema, sites, str(tmp_path / "absent.csv"), 0.2, 5, validation=100)
    again = load_site_tables(schema, sites, None, 0.2, 5, validation=100)
    other = load_site_tables(schema, sites, None, 0.2, 6, validation=100)
    for k in range(2):
        train, test = set(_times(plain.parts[k])), set(_times(plain.internal[k]))
        fit, held = _times(val.parts[k]), _times(val.internal[k])
        assert len(held) == round(0.2 * len(train)) == 10 and len(fit) == len(train) - 10
        assert sorted(fit + held) == sorted(train)  # a split of the site's training rows ...
        assert not set(held) & test and not set(fit) & test  # ... and no test row is used at all
        assert held == _times(again.internal[k]) and held != _times(other.internal[k])  # seeded
    # the union of the sites' validation rows is the headline's set; the test rows are not in it
    assert sorted(val.external[0][1][:, 0].tolist()) == sorted(
        _times(val.internal[0]) + _times(val.internal[1])
    )
    assert val.test_set.startswith("validation: 10, 10 rows carved from the sites' own training rows")
    capped = load_site_tables(schema, sites, None, 0.2, 5, validation=4)  # validation_size caps each site
    assert [len(y) for _, y in capped.internal] == [4, 4]


def test_validation_with_an_id_column_holds_out_whole_persons(tmp_path):
    schema, sites, _ = write_survival_sites(tmp_path, sites=2, rows=80, persons=True)
    val = load_site_tables(schema, sites, None, 0.2, 3, id_column="pid", validation=100)
    assert val.persons is not None
    for k in range(2):
        fit, held = val.parts[k][1], val.internal[k][1]
        assert len(held) % 2 == 0 and len(held) > 0  # two rows per person, both held out together
        assert len(val.persons[k]) == len(fit) and int(val.persons[k].max()) + 1 == len(fit) // 2


def test_a_site_with_too_few_training_rows_for_a_validation_split_is_one_line(tmp_path):
    schema, sites, _ = write_survival_sites(tmp_path, sites=2, rows=3)
    load_site_tables(schema, sites, None, 0.2, 0)  # enough for a test row
    with pytest.raises(DataError) as e:
        load_site_tables(schema, sites, None, 0.2, 0, validation=100)
    msg = str(e.value)
    assert "\n" not in msg and "site0.csv: 2 rows are too few" in msg and "validation split" in msg
