"""shared.outside_reads: where f reaches a value from outside its arguments, and a reader that reads it anew.

Pure Python: the values are plain objects found by identity, and each reader is checked against the value the
code itself reads after the closure, a global or an attribute is changed."""

import types

from stopgrad_math.shared import outside_reads


class Value:
    """An object found by identity, as a tensor is."""


class Holder:
    def __init__(self, **attributes):
        self.__dict__.update(attributes)


def is_leaf(value):
    return isinstance(value, Value)


GLOBAL_VALUE = Value()


def make(held, helper_value, layer):
    def helper():
        return helper_value

    def f(x):
        return x, held, helper(), layer.inner.weight, GLOBAL_VALUE
    return f


def test_a_path_for_each_value_by_the_names_the_code_reads():
    held, helped, weight = Value(), Value(), Value()
    f = make(held, helped, Holder(inner=Holder(weight=weight)))
    argument = Holder(weight=Value())
    found = outside_reads.paths(f, [1.0, argument], [held, helped, weight, GLOBAL_VALUE, argument.weight], is_leaf)
    assert found == [("cell", ("held",)), ("cell", ("helper", "helper_value")), ("cell", ("layer",), "inner", "weight"),
                     ("global", "GLOBAL_VALUE"), ("argument", 1, "weight")]


def test_the_reader_reads_the_current_values_of_the_cells_globals_and_arguments():
    global GLOBAL_VALUE
    held, helped, weight = Value(), Value(), Value()
    layer = Holder(inner=Holder(weight=weight))
    f = make(held, helped, layer)
    argument = Holder(weight=Value())
    wanted = [held, helped, weight, GLOBAL_VALUE, argument.weight]
    read = outside_reads.reader(f, outside_reads.paths(f, [1.0, argument], wanted, is_leaf))
    assert list(read(1.0, argument)) == wanted
    kept = GLOBAL_VALUE
    try:
        f.__closure__[f.__code__.co_freevars.index("held")].cell_contents = held_now = Value()
        layer.inner.weight = weight_now = Value()
        GLOBAL_VALUE = global_now = Value()
        other = Holder(weight=Value())
        assert list(read(1.0, other)) == [held_now, helped, weight_now, global_now, other.weight]
        assert list(read(1.0, other))[:4] == list(f(1.0)[1:])
    finally:
        GLOBAL_VALUE = kept


def test_a_value_no_name_reaches_gives_none():
    hidden = Value()
    items = [hidden]

    def f(x):
        return items[0]

    assert outside_reads.paths(f, [], [hidden], is_leaf) is None
    deep = Value()
    nested = Holder(a=Holder(b=Holder(c=deep)))

    def g(x):
        return nested.a.b.c  # three attributes: beyond DEPTH

    assert outside_reads.paths(g, [], [deep], is_leaf) is None
    assert outside_reads.paths(types.SimpleNamespace, [], [deep], is_leaf) is None  # not a plain function
    assert outside_reads.paths(g, [], [], is_leaf) == []


def test_an_unfilled_cell_is_passed_over():
    value = Value()

    def f(x):
        return later, value  # (bound after f is made)

    assert outside_reads.paths(f, [], [value], is_leaf) == [("cell", ("value",))]
    later = 1.0
    assert f(0.0) == (1.0, value)


def test_a_function_of_another_module_is_not_read_through_f_s_globals():
    """f holds a helper from another module that reads that module's GLOBAL_VALUE, a name this module defines too
    (issue 59): the helper's global is not reachable through f's globals, so no path is found (the caller then
    refuses or differentiates as written), where following it would read this module's GLOBAL_VALUE."""
    import outside_reads_helper

    helper = outside_reads_helper.global_value

    def f(x):
        return x, helper()

    wanted = outside_reads_helper.GLOBAL_VALUE
    found = outside_reads.paths(f, [1.0], [wanted], lambda value: isinstance(value, Value) or value is wanted)
    assert found is None or outside_reads.reader(f, found)()[0] is wanted


def test_a_member_that_only_the_held_objects_own_code_reads_is_found_through_members():
    """A module's parameter is read by the module's forward, not by f: f's code names the layer alone. Found where
    ``members`` names it (as the torch namespace names a module's parameters), and read anew; not found else."""
    bias = Value()
    layer = Holder(bias=bias)

    def f(x):
        return x, layer

    assert outside_reads.paths(f, [1.0], [bias], is_leaf) is None
    found = outside_reads.paths(f, [1.0], [bias], is_leaf, members=lambda value: ["bias", "not an identifier"]
                                if isinstance(value, Holder) else [])
    assert found == [("cell", ("layer",), "bias")]
    layer.bias = bias_now = Value()
    assert list(outside_reads.reader(f, found)(1.0)) == [bias_now]
