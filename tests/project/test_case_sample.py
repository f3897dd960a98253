"""The sample of cases the runs on other framework versions take (case_sample.py): the truth is written out by
hand for a small collection."""

import pytest
from case_sample import kept, parsed

IDS = ["t.py::a[0]", "t.py::a[1]", "t.py::a[2]", "t.py::a[3]", "t.py::a[4]", "t.py::b", "t.py::c[x]", "t.py::c[y]",
       "u.py::a[0]"]


def _names(every, offset, every_function=1):
    return [node_id for node_id, k in zip(IDS, kept(IDS, every, offset, every_function), strict=True) if k]


def test_every_case_is_kept_unsampled():
    assert _names(1, 0) == IDS


def test_every_kth_case_of_each_test_from_the_offset_and_at_least_one_per_test():
    assert _names(2, 0) == ["t.py::a[0]", "t.py::a[2]", "t.py::a[4]", "t.py::b", "t.py::c[x]", "u.py::a[0]"]
    assert _names(3, 1) == ["t.py::a[1]", "t.py::a[4]", "t.py::b", "t.py::c[y]", "u.py::a[0]"]


def test_two_offsets_take_different_cases_of_a_test_with_enough():
    first, second = set(_names(5, 0)), set(_names(5, 2))
    assert "t.py::a[0]" in first - second and "t.py::a[2]" in second - first


def test_every_mth_function_of_each_file_from_the_offset_and_at_least_one_per_file():
    assert _names(1, 0, 2) == ["t.py::a[0]", "t.py::a[1]", "t.py::a[2]", "t.py::a[3]", "t.py::a[4]", "t.py::c[x]",
                               "t.py::c[y]", "u.py::a[0]"]
    assert _names(1, 1, 2) == ["t.py::b", "u.py::a[0]"]
    assert _names(2, 1, 2) == ["t.py::b", "u.py::a[0]"]
    assert _names(3, 0, 2) == ["t.py::a[0]", "t.py::a[3]", "t.py::c[x]", "u.py::a[0]"]


@pytest.mark.parametrize("setting", ["3", "0:1", "a:b", "3:-1", "3:1:0", "3:1:2:4", "3:1:"])
def test_a_malformed_setting_is_refused_naming_the_variable(setting):
    with pytest.raises(ValueError, match="STOPGRAD_CASE_SAMPLE"):
        parsed(setting)


def test_unset_is_every_case():
    assert parsed(None) == (1, 0, 1) and parsed("10:3") == (10, 3, 1) and parsed("5:1:2") == (5, 1, 2)
