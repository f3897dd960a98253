"""partial_custom_gradient in PyTorch: a custom gradient for one argument, autodiff for the rest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from stopgrad_math.torch.identity_form import with_gradient
from stopgrad_math.torch.stops import stop_gradient


def partial_custom_gradient(f: Callable[..., Any], g: Callable[..., Any], x: Any, *others: Any) -> torch.Tensor:
    """Returns h = f(x, *others) with dh/dx = g(x, *others), autodiff for ``others``.

    f and g are evaluated at stop(x) with ``others`` live, and embedded with
    ``custom_gradient(fx, gx, x, fx_gx_manually_stopped=True)``: the value is
    f(x, y) bit for bit, dh/dx = g, dh/dy = ∂f/∂y, and the mixed second
    derivatives are ∂g/∂y.

    Examples:
        f = x·y with the custom dh/dx = 2y, and dh/dy = x by autodiff.

        >>> x, y = torch.tensor(3.0, requires_grad=True), torch.tensor(5.0, requires_grad=True)
        >>> h = partial_custom_gradient(lambda x, y: x * y, lambda x, y: 2 * y, x, y)
        >>> [float(d) for d in torch.autograd.grad(h, (x, y))]
        [10.0, 3.0]
    """
    stopped = stop_gradient(x)
    return with_gradient(f(stopped, *others), g(stopped, *others), x, fx_gx_manually_stopped=True,
                         stopped_by_caller=True)
