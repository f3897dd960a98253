"""How the PyTorch decorator reads its arguments' leaves: where each argument is a tensor or a tuple of tensors and
bools (a Function's ``needs_input_grad``), without pytree's walk; the truth is the walk itself (``Leaves.of``), and
``torch.utils._pytree`` for the structure."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from torch.utils import _pytree as pytree  # noqa: E402

from stopgrad_math.torch.vjp_conventions import Leaves  # noqa: E402

_TENSORS = [lambda: torch.ones(2), lambda: torch.zeros((), dtype=torch.float64), lambda: torch.arange(3),
            lambda: torch.nn.Parameter(torch.ones(1)), lambda: torch.ones(2, requires_grad=True)]
_ARGUMENT = st.one_of(
    st.sampled_from(_TENSORS).map(lambda make: make()),
    st.lists(st.one_of(st.booleans(), st.sampled_from(_TENSORS).map(lambda make: make())), max_size=3).map(tuple),
    st.sampled_from([1.5, 2, None, "s", [torch.ones(1)], {"k": torch.ones(1)}, (1.0, True)]))  # walked


def _walked(args, names):
    """The leaves as the walk reads them: labels by path, values, structure, differentiable positions."""
    return Leaves.of(list(args), "", lambda path: f"{names[path[0].idx]}{pytree.keystr(path[1:])}")


@settings(max_examples=200, deadline=None)
@given(args=st.lists(_ARGUMENT, max_size=5))
def test_the_leaves_read_without_a_walk_are_the_walks(args):
    names = [f"a{k}" for k in range(len(args))]
    got, want = Leaves.of_arguments(tuple(args), names), _walked(args, names)
    assert got.labels == want.labels
    assert len(got.values) == len(want.values) and all(g is w for g, w in zip(got.values, want.values, strict=True))
    assert got.structure == want.structure and got.differentiable == want.differentiable
    replaced = {k: torch.full((1,), float(k)) for k in got.differentiable}
    rebuilt, walked = got.with_values(replaced), want.with_values(replaced)
    assert pytree.tree_structure(rebuilt) == pytree.tree_structure(walked)
    assert all(g is w for g, w in zip(pytree.tree_leaves(rebuilt), pytree.tree_leaves(walked), strict=True))


def test_two_layouts_are_two_keys_and_one_layout_one_key():
    """A proof's key takes the layout: tensors and a tuple of three bools differ from a tuple of two."""
    x = torch.ones(2)
    three, again, two = (Leaves.of_arguments((x, needs), ["x", "needs"]).structure_key()
                         for needs in ((True, False, True), (False, False, False), (True, False)))
    assert three == again and three != two and hash(three) == hash(again)
