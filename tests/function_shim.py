"""The torch.autograd.Function API over stopgrad_math.torch's decorator, for the tests: a Function class's
``forward(ctx, *args)`` (or ``forward(*args)`` with ``setup_context``) and ``backward(ctx, *grads)``, run as the
decorator's ``f`` and VJP, so that a user's existing Function, backward and all, can be compared in every mode with
the Function itself. The context keeps what a backward reads: ``saved_tensors``, ``needs_input_grad`` (true for
every floating tensor argument: the decorator asks for them all), attributes set on it, and the outputs marked
non-differentiable (returned detached, with a zero cotangent in the VJP); ``mark_dirty``, an
argument changed in place, is outside the decorator's contract (f is a function of its arguments) and raises."""

import torch

import stopgrad_math.torch as sgm


class Context:
    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()
        self.materialize_grads = True
        self.non_differentiable = []

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors):
        del tensors

    def mark_non_differentiable(self, *outputs):
        self.non_differentiable += outputs

    def set_materialize_grads(self, value):
        self.materialize_grads = value

    def mark_dirty(self, *tensors):
        raise NotImplementedError("mark_dirty: the decorator's f is a function of its arguments, changed in place "
                                  "by no one")


def _has_setup_context(function):
    return any("setup_context" in vars(k) for k in function.__mro__ if k is not torch.autograd.Function
               and k.__module__ != "torch.autograd.function")


def through_decorator(function, order=1):
    """``function.apply``, as the decorator runs it; the outputs marked non-differentiable come back detached."""
    def apply(*args):
        needs = tuple(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args)
        marked = []

        @sgm.custom_gradient(order=order)
        def f(*args):
            ctx = Context(needs)
            if _has_setup_context(function):
                output = function.forward(*args)
                function.setup_context(ctx, args, output)
            else:
                output = function.forward(ctx, *args)

            outputs = output if isinstance(output, tuple) else (output,)
            marked[:] = [k for k, o in enumerate(outputs) if any(o is m for m in ctx.non_differentiable)]

            def vjp(ct):
                grads = function.backward(ctx, *(ct if isinstance(output, tuple) else (ct,)))
                grads = grads if isinstance(grads, tuple) else (grads,)
                return tuple(grads[:len(args)])  # a backward may return Nones past the arguments

            return output, vjp

        result = f(*args)
        if not marked:
            return result
        if not isinstance(result, tuple):
            return result.detach()
        return tuple(r.detach() if k in marked else r for k, r in enumerate(result))

    return apply
