"""check_gradient in PyTorch: a function's reverse- and forward-mode derivatives against central differences."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.autograd.forward_ad as forward_ad
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from stopgrad_math.shared import tolerances
from stopgrad_math.shared.gradient_report import (
    GradientReport,
    assert_passed,
    central_differences,
    check_options,
    compare,
    output_weights,
    tolerance,
)

__all__ = ["GradientReport", "assert_gradient", "check_gradient"]


def _floating(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point


class _Reached(TorchDispatchMode):
    """Records the floating dtypes of every tensor an op computes from ``source`` (or from what was computed
    from it): the precisions fn computes in from that argument."""

    def __init__(self, source: torch.Tensor):
        super().__init__()
        self.reached: dict[int, torch.Tensor] = {id(source): source}  # held, so that no id is reused meanwhile
        self.dtypes: set[torch.dtype] = {source.dtype}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and id(t) in self.reached for t in pytree.tree_leaves((args, kwargs))):
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.reached[id(t)] = t
                    if t.dtype.is_floating_point:
                        self.dtypes.add(t.dtype)
        return out


def _computed_in(fn: Callable[..., Any], args: tuple[Any, ...], leaf: torch.Tensor) -> torch.dtype:
    """The narrowest floating dtype fn computes in from ``leaf`` (one of ``args``): read from the ops it runs
    (a float64 argument cast to float32 inside, as Keras's torch backend does, computes in float32)."""
    reached = _Reached(leaf)
    with torch.no_grad(), reached:
        fn(*args)
    names = {str(dtype).removeprefix("torch.") for dtype in reached.dtypes}
    return getattr(torch, tolerances.narrowest(names))  # type: ignore[no-any-return]


def _weighted_sum(fn: Callable[..., Any], args: Sequence[Any], weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """⟨w, fn(*args)⟩ over every floating output leaf, in float64 (w is zero where the output is not finite)."""
    total = torch.zeros((), dtype=torch.float64)
    for out, w in zip(pytree.tree_leaves(fn(*args)), weights, strict=True):
        if _floating(out):
            w = w.to(out.device)
            total = total + torch.where(w == 0, 0.0, out.to(torch.float64) * w).sum().cpu()
    return total


def _output_values(fn: Callable[..., Any], args: Sequence[Any]) -> list[np.ndarray | float]:
    """fn's output leaves at the point in float64 (a non-floating one as zeros), for ``output_weights``."""
    with torch.no_grad():
        outs = pytree.tree_leaves(fn(*args))
    return [out.detach().to(torch.float64).cpu().numpy() if _floating(out) else np.zeros(np.shape(out))
            for out in outs]


@dataclasses.dataclass
class _Point:
    """The arguments' leaves, flat, and how to put them back; each checked leaf is moved alone."""

    leaves: list[Any]
    paths: list[tuple[Any, ...]]
    structure: Any

    @classmethod
    def of(cls, args: Sequence[Any]) -> _Point:
        pairs, structure = pytree.tree_flatten_with_path(tuple(args))
        leaves = [_leaf_point(value, path) for path, value in pairs]
        return cls(leaves, [path for path, _ in pairs], structure)

    def args(self, index: int | None = None, value: Any = None) -> tuple[Any, ...]:
        leaves = list(self.leaves)
        if index is not None:
            leaves[index] = value
        return tuple(pytree.tree_unflatten(leaves, self.structure))

    def label(self, index: int) -> tuple[int, str]:
        """(the argument's position, the leaf's path inside it)."""
        path = self.paths[index]
        return int(path[0].idx), pytree.keystr(path[1:])


def _leaf_point(value: Any, path: tuple[Any, ...]) -> Any:
    """A leaf as the point to check at: a floating tensor (detached) wherever the value is a floating one."""
    if isinstance(value, (float, np.ndarray, np.floating, np.complexfloating, torch.Tensor)):
        tensor = torch.as_tensor(value).detach()
        if tensor.is_complex():
            raise TypeError(f"check_gradient compares real derivatives; argument {path[0].idx}"
                            f"{pytree.keystr(path[1:])} is {tensor.dtype}: check its real and imaginary parts as "
                            "two real arguments.")
        return tensor if tensor.dtype.is_floating_point else value
    return value


def _numeric(fn: Callable[..., Any], at: _Point, index: int, weights: Sequence[torch.Tensor],
             step_scale: float) -> np.ndarray:
    """Central differences of ⟨w, fn⟩ w.r.t. every element of leaf ``index`` of ``at``, moved in NumPy."""
    moving = at.leaves[index]

    def total_at(moved: np.ndarray) -> float:
        with torch.no_grad():
            moved_leaf = torch.as_tensor(moved, dtype=torch.float64).to(dtype=moving.dtype, device=moving.device)
            return float(_weighted_sum(fn, at.args(index, moved_leaf), weights))

    return central_differences(total_at, moving.detach().to(torch.float64).cpu().numpy(), step_scale)


def _differences(fn: Callable[..., Any], point: _Point, index: int, weights: Sequence[torch.Tensor],
                 step: float) -> tuple[np.ndarray, str]:
    """Central differences, and the dtype they are taken at: the narrowest fn computes in from the leaf. With every
    floating argument in float64 where fn then computes in float64 from it (a 0-d float64 tensor does not promote
    a float32 one, and a function may cast down inside); else with the arguments as they are, and the step
    eps^(1/3) that balances truncation and rounding in the dtype fn computes in."""
    wide = dataclasses.replace(point, leaves=[leaf.to(torch.float64) if _floating(leaf) else leaf
                                              for leaf in point.leaves])
    try:
        if _computed_in(fn, wide.args(), wide.leaves[index]) == torch.float64:
            return _numeric(fn, wide, index, weights, step), "float64"
    except RuntimeError:  # fn mixes the arguments with tensors of its own dtype
        pass
    name = str(_computed_in(fn, point.args(), point.leaves[index])).removeprefix("torch.")
    return _numeric(fn, point, index, weights, tolerances.difference_step(name)), name


def _reverse(total: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    x = x.detach().requires_grad_(True)
    value = total(x)
    if not value.requires_grad:  # nothing of fn's output reaches x: the derivative is zero
        return torch.zeros_like(x)
    (derivative,) = torch.autograd.grad(value, x, allow_unused=True)
    return torch.zeros_like(x) if derivative is None else derivative


def _forward(total: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The derivative element by element, each from one forward-mode pass with a one-hot tangent."""
    derivative = torch.zeros(x.shape, dtype=torch.float64)
    flat = derivative.view(-1)
    for k in range(x.numel()):
        tangent = torch.zeros_like(x).view(-1)
        tangent[k] = 1
        with forward_ad.dual_level():
            out = total(forward_ad.make_dual(x.detach(), tangent.view(x.shape)))
            tangent_out = forward_ad.unpack_dual(out).tangent
        flat[k] = 0.0 if tangent_out is None else float(tangent_out)
    return derivative


def check_gradient(fn: Callable[..., Any], *args: Any, rtol: float | None = None, atol: float | None = None,
                   step: float = 6e-6, seed: int = 0) -> GradientReport:
    """Compares fn's derivatives (``torch.autograd.grad`` and ``forward_ad``) with central finite differences.

    As the TensorFlow namespace's ``check_gradient``: for each floating
    leaf of the arguments (nests of tuples, lists and dicts, each leaf
    checked and reported by its path), the derivative of ⟨w, fn(*args)⟩ (w
    fixed random weights over every floating output leaf; the report's
    computed and numeric values are derivatives of this weighted sum) is
    compared elementwise with central differences, taken with every floating
    argument in float64 where fn computes in float64 from it; else at the
    narrowest precision its ops compute in from the argument (a float64
    argument cast to float32 inside is checked at float32's step and
    tolerance); the report says which.
    Tolerances and the rules for non-finite values are the TensorFlow
    checker's; a report of nothing checked never passes.

    Examples:
        >>> def log1pexp(x):
        ...   return custom_gradient(torch.logaddexp(x, torch.zeros(())), torch.sigmoid(x), x)
        >>> check_gradient(log1pexp, torch.tensor([-3.0, 0.0, 5.0])).passed
        True
    """
    check_options(step, rtol, atol)
    point = _Point.of(args)
    values, fn_not_finite = output_weights(_output_values(fn, point.args()), seed)
    weights = [torch.as_tensor(w, dtype=torch.float64) for w in values]
    rows = []
    for index in (k for k, leaf in enumerate(point.leaves) if _floating(leaf)):
        numeric, numeric_dtype = _differences(fn, point, index, weights, step)
        # at the precision fn computes in, and the leaf's (its derivative is computed at the leaf)
        leaf_dtype = str(point.leaves[index].dtype).removeprefix("torch.")
        leaf_tolerance = tolerance(tolerances.narrowest({numeric_dtype, leaf_dtype}), rtol, atol)

        def total(x: torch.Tensor, index: int = index) -> torch.Tensor:
            return _weighted_sum(fn, point.args(index, x), weights)

        argument, leaf = point.label(index)
        for mode, derivative in (("reverse", _reverse), ("forward", _forward)):
            computed = derivative(total, point.leaves[index]).detach().to(torch.float64).cpu().numpy()
            row = compare(argument, mode, computed, numeric, leaf_tolerance, numeric_dtype, fn_not_finite)
            rows.append(dataclasses.replace(row, leaf=leaf))
    return GradientReport(tuple(rows))


def assert_gradient(fn: Callable[..., Any], *args: Any, **options: Any) -> GradientReport:
    """Raises AssertionError with check_gradient's table unless it passed; returns the report.

    Examples:
        >>> assert_gradient(lambda x: x**2, torch.tensor([1.0, 2.0])).passed
        True
    """
    return assert_passed(check_gradient(fn, *args, **options))
