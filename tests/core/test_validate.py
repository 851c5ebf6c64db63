"""silofl.core.validate: a hand-edited file's field of the wrong type is a one-line ConfigError naming it."""

from dataclasses import dataclass

import pytest

from silofl.core.errors import ConfigError
from silofl.core.validate import check_field_types


@dataclass
class Settings:
    name: str = "site-a"
    rate: float = 0.5
    count: int = 3
    flag: bool = True
    limit: float | None = None
    tag: list = None  # a type the check does not know: left to the dataclass


def test_good_values_pass_an_int_is_a_float_and_none_fills_an_optional():
    check_field_types(Settings(), "site.json")
    check_field_types(Settings(rate=2, limit=4, tag=["x"]), "site.json")


@pytest.mark.parametrize(
    "change, msg",
    [
        ({"rate": True}, "site.json: rate must be float, got True"),  # a bool is not a number here
        ({"rate": float("nan")}, "site.json: rate must be float, got nan"),
        ({"rate": "0.5"}, "site.json: rate must be float, got '0.5'"),
        ({"count": 3.0}, "site.json: count must be int, got 3.0"),
        ({"count": False}, "site.json: count must be int, got False"),
        ({"flag": 1}, "site.json: flag must be bool, got 1"),
        ({"name": None}, "site.json: name must be str, got None"),
        ({"limit": "lots"}, "site.json: limit must be float or null, got 'lots'"),
        ({"limit": float("nan")}, "site.json: limit must be float or null, got nan"),
    ],
)
def test_a_wrong_type_is_one_line_naming_the_file_and_field(change, msg):
    with pytest.raises(ConfigError) as e:
        check_field_types(Settings(**change), "site.json")
    assert str(e.value) == msg
