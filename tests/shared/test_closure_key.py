"""shared.closure_key: a VJP's closure opened into a key and its arrays, framework-free (issue 59's audit of the
last round's modules). Each promise of its docstring that a proof or compiled embedding reused under a wrong key
would break silently: two VJPs share a key only where they are one computation of their arrays."""

import sys
import types

import pytest

from stopgrad_math.shared import closure_key


class Array:
    """An array of a shape, found by identity, as a framework's is."""

    def __init__(self, shape):
        self.shape = shape


ARRAYS = closure_key.Arrays(lambda value: isinstance(value, Array), lambda array: ("array", array.shape),
                            lambda value: False)
SCALE = 2.0


def _key(vjp):
    opened = closure_key.opened(vjp, ARRAYS)
    return None if opened is None else opened.key


def _through_a_helper(k):
    def helper(ct):
        return ct * k

    return lambda ct: helper(ct)


def _two_levels_deep(k):
    def inner(ct):
        return ct * k

    def outer(ct):
        return inner(ct)

    return lambda ct: outer(ct)


def test_a_number_in_a_helpers_closure_is_in_the_key_one_and_two_levels_deep():
    for make in (_through_a_helper, _two_levels_deep):
        assert _key(make(2.0)) == _key(make(2.0))  # two closures, one computation
        assert _key(make(2.0)) != _key(make(3.0))  # another number: another computation


def _reads_a_global_through_a_helper():
    def helper(ct):
        return ct * SCALE

    return lambda ct: helper(ct)


def test_a_global_a_helper_reads_is_in_the_key(monkeypatch):
    before = _key(_reads_a_global_through_a_helper())
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 5.0)
    assert _key(_reads_a_global_through_a_helper()) != before


HELPERS = types.ModuleType("helpers")  # a user's module of helpers, read through its attribute
exec(compile("FACTOR = 2.0\ndef scale(ct):\n    return ct * FACTOR\n", "/home/user/project/helpers.py", "exec"),
     HELPERS.__dict__)


def _through_helpers(ct):
    return HELPERS.scale(ct)


def test_a_global_that_a_users_function_read_through_a_module_attribute_reads_is_in_the_key(monkeypatch):
    """``helpers.scale(ct)``: the function is the user's code, opened as a global function is, so rebinding the
    global it reads makes another key (a key by identity alone kept the first value's proof)."""
    before = _key(_through_helpers)
    assert before is not None and _key(_through_helpers) == before
    monkeypatch.setattr(HELPERS, "FACTOR", 5.0)
    assert _key(_through_helpers) != before


def test_a_librarys_function_read_through_a_module_attribute_is_taken_by_identity():
    """A library's function (Python's own here) is not opened: its globals are the library's, and opening it would
    refuse every VJP that calls one."""
    import os.path

    assert closure_key._library_code(os.path.join.__code__)
    assert not closure_key._library_code(HELPERS.scale.__code__)
    assert _key(lambda ct: os.path.join(ct)) is not None


def _closing_over(array):
    return lambda ct: ct * array


def test_the_arrays_go_in_by_shape_and_are_rebuilt_in_place():
    a, b = Array((3,)), Array((3,))
    first, second = (closure_key.opened(_closing_over(a), ARRAYS), closure_key.opened(_closing_over(b), ARRAYS))
    assert first.key == second.key and first.arrays == [a] and second.arrays == [b]
    assert closure_key.opened(_closing_over(Array((4,))), ARRAYS).key != first.key
    rebuilt = first.rebuild([b])
    assert isinstance(rebuilt, types.FunctionType) and rebuilt.__closure__[0].cell_contents is b


def test_what_a_key_cannot_capture_is_refused():
    held = [1.0]
    count = 0

    def assigns(ct):
        nonlocal count
        count += 1
        return ct

    assert _key(lambda ct: ct * held[0]) is None  # a list: mutable
    assert _key(assigns) is None  # assigns to its closure
    assert _key(types.SimpleNamespace(__call__=lambda ct: ct)) is None  # not a plain function


# ---------------------------------------------------------------- a nested function's part, remembered


OFFSET = 1.0


class Settings:
    """A class whose attribute a helper reads, as ``Config.scale``."""

    shift = 0.0


def _helper(ct, power=1.0, *, bias=0.0):
    return ct * OFFSET + Settings.shift + power + bias


def _through(helper):
    """A VJP made anew at each call, closing over one helper function that lives across calls."""
    return lambda ct: helper(ct)


def _part(vjp):
    """The helper's part of the VJP's key (the function in its closure)."""
    return closure_key.opened(vjp, ARRAYS).key[1][0][1]  # (the cells; the first; past "function")


def test_a_helpers_part_is_made_once_and_reused_while_what_it_read_is_the_same():
    """The part a nested function gives is remembered: a second VJP over the same helper gets the same object
    (cheap to compare), where a new helper of the same code gets an equal one made anew."""
    first = _part(_through(_helper))
    assert _part(_through(_helper)) is first
    copy = types.FunctionType(_helper.__code__, _helper.__globals__, "copy", _helper.__defaults__)
    copy.__kwdefaults__ = dict(_helper.__kwdefaults__)
    assert _part(_through(copy)) == first and _part(_through(copy)) is not first


def _rebinds(monkeypatch):
    """Each way to change what the helper computes between two calls, the helper object itself kept."""
    return {
        "a global it reads": lambda: monkeypatch.setattr(sys.modules[__name__], "OFFSET", 3.0),
        "a class attribute it reads": lambda: monkeypatch.setattr(Settings, "shift", 1.0),
        "its code": lambda: monkeypatch.setattr(_helper, "__code__", (lambda ct, power=1.0, *, bias=0.0: ct).__code__),
        "its defaults": lambda: monkeypatch.setattr(_helper, "__defaults__", (2.0,)),
        "a keyword default, in place": lambda: monkeypatch.setitem(_helper.__kwdefaults__, "bias", 5.0),
    }


@pytest.mark.parametrize("change", ["a global it reads", "a class attribute it reads", "its code", "its defaults",
                                    "a keyword default, in place"])
def test_a_remembered_part_is_made_again_when_anything_it_read_changed(monkeypatch, change):
    before = _part(_through(_helper))
    _rebinds(monkeypatch)[change]()
    after = _part(_through(_helper))
    assert after != before
    monkeypatch.undo()
    assert _part(_through(_helper)) == before


def test_a_remembered_part_follows_a_cell_its_maker_reassigns_and_a_helper_two_levels_down():
    """A helper's closure cell, reassigned by the function that made it, and a global read by a helper the helper
    reads: each changes the part."""
    factor = 2.0

    def scale(ct):
        return ct * factor

    def outer(ct):
        return _reads_offset(scale(ct))

    before = _part(_through(outer))
    factor = 4.0
    assert _part(_through(outer)) != before
    factor = 2.0
    assert _part(_through(outer)) == before
    global OFFSET
    try:
        OFFSET = 7.0
        assert _part(_through(outer)) != before
    finally:
        OFFSET = 1.0


def _reads_offset(ct):
    return ct + OFFSET


def test_a_helper_holding_an_array_is_opened_at_every_call():
    """A part with an array in it is not remembered (its arrays are the call's): each VJP passes its own."""
    a, b = Array((3,)), Array((3,))

    def helper_of(array):
        return lambda ct: ct * array

    shared = helper_of(a)
    first = closure_key.opened(_through(shared), ARRAYS)
    shared.__closure__[0].cell_contents = b
    second = closure_key.opened(_through(shared), ARRAYS)
    assert first.arrays == [a] and second.arrays == [b] and first.key == second.key
