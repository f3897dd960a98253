"""A torch.autograd.Function ported as a user ports it: the same class body on ``stopgrad_math.torch.Function``
(its methods, attributes and docstring; PyTorch's own bookkeeping left out), so that a test runs one Function's
code through PyTorch's mechanism and through the library's, side by side."""

import torch

import stopgrad_math.torch as sgm

_PYTORCHS_OWN = {"__dict__", "__weakref__", "_backward_cls", "_compiled_autograd_key", "_is_traceable",
                 "_new_backward_cls"}


def ported(function, order=1):
    """``function``'s class body on ``sgm.Function`` (at ``order``), with the same name; a subclass of another
    Function brings what it inherits from it, as the port of both would."""
    body = {}
    for kind in reversed(function.__mro__[:function.__mro__.index(torch.autograd.Function)]):
        body.update({k: v for k, v in vars(kind).items() if k not in _PYTORCHS_OWN and not k.startswith("_backward")})
    return type(function.__name__, (sgm.Function,), {**body, "order": order})


def through_decorator(function, order=1):
    """``ported(function, order).apply``."""
    assert issubclass(function, torch.autograd.Function)
    return ported(function, order).apply
