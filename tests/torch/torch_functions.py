"""log1pexp written with PyTorch's own mechanism, torch.autograd.Function, in the three ways its documentation
shows, beside stopgrad_math.torch: the anchors of the PyTorch tests' side-by-side tables."""

import torch
import torch.autograd.forward_ad as forward_ad

import stopgrad_math.torch as sgm


def _value(x):
    """log(1 + exp(x)), exact in value, whose autodiff is NaN from x ≈ 89 (exp overflows in the branch not taken):
    a mode that differentiates the forward pass instead of the custom rule shows it."""
    return torch.where(x > 30, x, torch.log1p(torch.exp(x)))


def _backward(ctx, grad):  # every Function's rule: σ(x)·cotangent, and σ(x)·tangent for jvp
    (x,) = ctx.saved_tensors
    return grad * torch.sigmoid(x)


def _jvp(ctx, tangent):
    (x,) = ctx.saved_tensors
    return tangent * torch.sigmoid(x)


class AsWritten(torch.autograd.Function):
    """forward and backward, as the tutorial writes a Function."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return _value(x)

    backward = staticmethod(_backward)


class WithJvp(torch.autograd.Function):
    """and a jvp, for forward mode (the inputs saved for it with save_for_forward)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        return _value(x)

    backward = staticmethod(_backward)

    jvp = staticmethod(_jvp)


class WithVmapRule(torch.autograd.Function):
    """and setup_context with a generated vmap rule, which torch.func needs."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return _value(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)

    backward = staticmethod(_backward)

    jvp = staticmethod(_jvp)


def identity(x):
    return sgm.custom_gradient(_value(x), torch.sigmoid(x), x)


def _with_vjp(x):  # the decorator's f: the Function's value and rule, the rule written as a VJP alone
    return _value(x), lambda ct: ct * torch.sigmoid(x)


MECHANISMS = {
    "`autograd.Function` as written": AsWritten.apply,
    "with `jvp`": WithJvp.apply,
    "with `jvp`, `setup_context` and a vmap rule": WithVmapRule.apply,
    "`stopgrad_math.torch`": identity,
    "`stopgrad_math.torch` decorator": sgm.custom_gradient(_with_vjp),
    "the decorator, `order=2`": sgm.custom_gradient(order=2)(_with_vjp),
}


def _backward(fn, x):
    x = x.detach().requires_grad_(True)
    fn(x).sum().backward()
    return x.grad


def _forward_ad(fn, x):
    with forward_ad.dual_level():
        return forward_ad.unpack_dual(fn(forward_ad.make_dual(x, torch.ones_like(x)))).tangent


MODES = {
    "`backward`": _backward,
    "`forward_ad`": _forward_ad,
    "`func.grad`": lambda fn, x: torch.func.grad(lambda x: fn(x).sum())(x),
    "`func.jvp`": lambda fn, x: torch.func.jvp(fn, (x,), (torch.ones_like(x),))[1],
    "`func.vmap(grad)`": lambda fn, x: torch.func.vmap(torch.func.grad(fn))(x),
    "`func.hessian`": lambda fn, x: torch.func.hessian(lambda x: fn(x).sum())(x).diagonal(),
    "`compile(fullgraph)`, `backward`": lambda fn, x: _backward(torch.compile(fn, fullgraph=True), x),
    "`compile(fullgraph)`, `func.jvp`": lambda fn, x: torch.compile(
        lambda x: torch.func.jvp(fn, (x,), (torch.ones_like(x),))[1], fullgraph=True)(x),
}

POINTS = torch.tensor([-3.0, 0.0, 5.0, 100.0])


def outcome(mechanism: str, mode: str) -> str:
    """"right" where the mode's derivative is the closed form's (sigmoid, and for hessian σ(1 − σ)) to float32's
    rounding, "0" where it is zero (a gradient held constant), "wrong" otherwise, or the error's type."""
    torch._dynamo.reset()
    try:
        got = MODES[mode](MECHANISMS[mechanism], POINTS).detach()
    except Exception as error:  # the outcome is the error's kind
        return type(error).__name__
    sigmoid = torch.sigmoid(POINTS)
    truth = sigmoid * (1 - sigmoid) if mode == "`func.hessian`" else sigmoid
    if torch.allclose(got, truth, rtol=1e-6, atol=0):
        return "right"
    return "0" if torch.equal(got, torch.zeros(4)) else "wrong"


def table() -> str:
    """The side-by-side table as docs/torch.md shows it: a row per mechanism, a column per mode."""
    lines = ["| | " + " | ".join(MODES) + " |", "|---|" + "---|" * len(MODES)]
    for mechanism in MECHANISMS:
        cells = [outcome(mechanism, mode) for mode in MODES]
        lines.append(f"| {mechanism} | " + " | ".join(c if c in ("right", "wrong", "0") else f"`{c}`"
                                                        for c in cells) + " |")
    return "\n".join(lines)
