"""shared.closure_key: a VJP's closure opened into a key and its arrays, framework-free (issue 59's audit of the
last round's modules). Each promise of its docstring that a proof or compiled embedding reused under a wrong key
would break silently: two VJPs share a key only where they are one computation of their arrays."""

import sys
import types

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
