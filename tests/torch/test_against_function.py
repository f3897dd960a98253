"""The table of docs/torch.md: log1pexp as torch.autograd.Function (as written, with a jvp, with setup_context and a
vmap rule) and on stopgrad_math.torch, in each mode, measured here."""

import pathlib

import pytest

torch = pytest.importorskip("torch")
import torch_functions  # noqa: E402

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "torch.md"


def test_the_identity_is_right_in_every_mode_and_zero_for_the_hessian_by_definition():
    row = {mode: torch_functions.outcome("`stopgrad_math.torch`", mode) for mode in torch_functions.MODES}
    assert row == {mode: "0" if mode == "`func.hessian`" else "right" for mode in torch_functions.MODES}


def test_the_decorator_has_every_mode_and_its_hessian_raises_at_order_1_and_is_right_at_order_2():
    for mechanism, hessian in [("`stopgrad_math.torch` decorator", "LookupError"),
                               ("the decorator, `order=2`", "right")]:
        row = {mode: torch_functions.outcome(mechanism, mode) for mode in torch_functions.MODES}
        assert row.pop("`func.hessian`") == hessian
        assert set(row.values()) == {"right"}


def test_a_function_as_written_has_no_forward_mode_and_one_with_a_jvp_no_compiled_backward():
    assert torch_functions.outcome("`autograd.Function` as written", "`forward_ad`") == "NotImplementedError"
    assert torch_functions.outcome("with `jvp`", "`compile(fullgraph)`, `backward`") == "Unsupported"


def test_the_docs_table_is_what_torch_does():  # on the oldest and the newest torch alike
    assert torch_functions.table() in DOCS.read_text()
