"""PyTorch's own autograd.Function test cases (torch.testing._internal.autograd_function_db, shipped in the wheel),
restated for the decorator and run side by side with the Function.

Each case's rule is the Function's backward, written as the VJP of ``f(*args) -> (y, vjp)``. The Functions there
have setup_context, a jvp and a vmap rule, so every mode below is theirs too: the anchor is right in each, and ours
must give its numbers. Where the contracts differ (PyTorch sums a broadcast or oversized gradient to the input's
shape; the decorator wants the argument's shape and names the shapes), the difference is tested as such.
"""

import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as forward_ad  # noqa: E402
from torch.testing._internal import autograd_function_db as db  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402


def _generator():
    return torch.Generator().manual_seed(0)


def _arg(*shape, low=-2.0, high=2.0):
    return torch.rand(*shape, generator=_generator(), dtype=torch.float64) * (high - low) + low


@sgm.custom_gradient
def cube(x):
    dinput = 3 * x**2
    return (x**3, dinput), lambda ct: ct[0] * dinput + 6 * ct[1] * x


@sgm.custom_gradient
def mul(x, y):
    return x * y, lambda ct: ((ct * y).sum_to_size(x.shape), (ct * x).sum_to_size(y.shape))


@sgm.custom_gradient
def sort(x, dim):
    ind = torch.argsort(x, dim=dim)
    ind_inv = torch.argsort(ind, dim=dim)
    return (torch.take_along_dim(x, ind, dim), ind, ind_inv), lambda ct: (torch.take_along_dim(ct[0], ind_inv, dim),
                                                                          None)


@sgm.custom_gradient
def take(x, ind, ind_inv, dim):
    return torch.take_along_dim(x, ind, dim), lambda ct: (torch.take_along_dim(ct, ind_inv, dim), None, None, None)


@sgm.custom_gradient
def select(x, idx):
    def vjp(ct):
        result = ct.new_zeros(x.shape)
        result[idx] = ct
        return result, None

    return x[idx], vjp


@sgm.custom_gradient
def scale_grad(x):
    return x.clone(), lambda ct: ct * 3.14


@sgm.custom_gradient
def zero_gradients(x, y):
    return (x.clone(), y.clone()), lambda ct: (torch.zeros(x.shape, dtype=x.dtype), torch.zeros(y.shape,
                                                                                               dtype=y.dtype))


@sgm.custom_gradient
def forward_has_default_args(x, idx=(2,)):
    def vjp(ct):
        result = ct.new_zeros(x.shape)
        result[idx] = ct
        return result

    return x[idx], vjp


_SORTED = _arg(3, 5)
_, _IND, _IND_INV = db.NumpySort.apply(_SORTED, 1)

CASES = {  # name: (the Function, ours, arguments, the positions of the differentiable ones)
    "NumpyCube": (db.NumpyCube.apply, cube, (_arg(1, low=0.8, high=2),), (0,)),
    "NumpyMul, same shapes": (db.NumpyMul.apply, mul, (_arg(3, 4), _arg(3, 4) + 3.0), (0, 1)),
    "MulGenVmap, same shapes": (db.MulGenVmap.apply, mul, (_arg(3, 4), _arg(3, 4) + 3.0), (0, 1)),
    "SortGenVmap": (db.SortGenVmap.apply, sort, (_SORTED, 1), (0,)),
    "NumpyTake": (db.NumpyTake.apply, take, (_SORTED, _IND, _IND_INV, 1), (0,)),
    "TakeGenVmap": (db.TakeGenVmap.apply, take, (_SORTED, _IND, _IND_INV, 1), (0,)),
    "Select": (db.Select.apply, select, (_arg(3, 5), 2), (0,)),
    "SelectGenVmap": (db.SelectGenVmap.apply, select, (_arg(3, 5), 2), (0,)),
    "ScaleGradGenVmap": (db.ScaleGradGenVmap.apply, scale_grad, (_arg(3, 5),), (0,)),
    "ForwardHasDefaultArgs": (db.ForwardHasDefaultArgs.apply, forward_has_default_args, (_arg(3, 5),), (0,)),
}


def _floats(outputs):
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return tuple(y for y in outputs if y.is_floating_point())


def _reverse(fn, args, positions):
    args = [a.detach().requires_grad_(True) if k in positions else a for k, a in enumerate(args)]
    ys = _floats(fn(*args))
    total = sum((y * torch.linspace(0.5, 1.5, y.numel(), dtype=y.dtype).reshape(y.shape)).sum() for y in ys)
    return torch.autograd.grad(total, [args[k] for k in positions])


def _forward(fn, args, positions):
    with forward_ad.dual_level():
        duals = [forward_ad.make_dual(a, torch.linspace(-1.0, 1.0, a.numel(), dtype=a.dtype).reshape(a.shape))
                 if k in positions else a for k, a in enumerate(args)]
        return tuple(forward_ad.unpack_dual(y).tangent for y in _floats(fn(*duals)))


def _jacobian(transform):
    def run(fn, args, positions):
        def floats_of(*differentiable):
            full = list(args)
            for k, value in zip(positions, differentiable, strict=True):
                full[k] = value
            return _floats(fn(*full))

        return transform(floats_of, argnums=tuple(range(len(positions))))(*[args[k] for k in positions])

    return run


def _vmap_of_vjp(fn, args, positions):
    """Per-example VJPs of the first argument along a new leading axis of size 2."""
    def one(x):
        full = list(args)
        full[positions[0]] = x
        ys, pullback = torch.func.vjp(lambda x: _floats(fn(*full[:positions[0]], x, *full[positions[0] + 1:])), x)
        return pullback(tuple(torch.ones_like(y) for y in ys))[0]

    x = args[positions[0]]
    return torch.func.vmap(one)(torch.stack([x, 2 * x]))


MODES = {
    "backward": _reverse,
    "forward_ad": _forward,
    "func.jacrev": _jacobian(torch.func.jacrev),
    "func.jacfwd": _jacobian(torch.func.jacfwd),
    "func.vmap(func.vjp)": _vmap_of_vjp,
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_the_decorator_gives_the_functions_derivatives(case, mode):
    function, ours, args, positions = CASES[case]
    expected = MODES[mode](function, args, positions)
    got = MODES[mode](ours, args, positions)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("case", CASES)
def test_the_decorator_gives_the_functions_values(case):
    function, ours, args, _ = CASES[case]
    torch.testing.assert_close(_floats(ours(*args)), _floats(function(*args)))


def test_two_cases_whose_anchor_is_not_its_own_derivative_are_restated_by_the_math():
    """CubeGenVmap's backward gives g·3x² + 6·3x² where its jvp (and NumpyCube's backward) give g·3x² + 6·g'·x,
    and NumpySort returns x unsorted with a backward that permutes: each disagrees with its own forward or jvp.
    Ours follows the math: cube against autodiff of (x³, 3x²), sort against torch.sort's autodiff."""
    x = _arg(1, low=0.8, high=2)
    assert not torch.allclose(_reverse(db.CubeGenVmap.apply, (x,), (0,))[0], _reverse(db.NumpyCube.apply, (x,),
                                                                                       (0,))[0])
    torch.testing.assert_close(_reverse(cube, (x,), (0,)), _reverse(lambda x: (x**3, 3 * x**2), (x,), (0,)))
    assert not torch.equal(db.NumpySort.apply(_SORTED, 1)[0], torch.sort(_SORTED, 1).values)
    for mode in ("backward", "forward_ad"):
        torch.testing.assert_close(MODES[mode](sort, (_SORTED, 1), (0,)),
                                   MODES[mode](lambda x, dim: torch.sort(x, dim).values, (_SORTED, 1), (0,)))


def test_a_broadcast_gradient_pytorch_sums_is_a_value_error_naming_the_shapes():
    """NumpyMul's sample broadcasts x (4,) against y (3, 4), and its backward returns a (3, 4) gradient for x, which
    PyTorch sums to (4,); the decorator wants each cotangent in its argument's shape (its VJP sums itself)."""
    x, y = _arg(4) + 1.0, _arg(3, 4) + 1.0

    @sgm.custom_gradient
    def mul_unsummed(x, y):
        return x * y, lambda ct: (ct * y, ct * x)

    expected = _reverse(db.NumpyMul.apply, (x, y), (0, 1))
    torch.testing.assert_close(_reverse(mul, (x, y), (0, 1)), expected)
    with pytest.raises(ValueError, match=r"shape \(3, 4\) for args\[0\] of shape \(4,\)"):
        _reverse(mul_unsummed, (x, y), (0, 1))


def test_zero_gradients_of_another_shape_are_refused_where_pytorch_sums_them():
    """ZeroGradientsGenVmap's backward returns zeros of shape (3, 4, *x.shape) for x; PyTorch sums them to x's
    shape. Restated with zeros of x's shape, the decorator's derivative is the Function's, 0, and its outputs stay
    connected to x as the Function's are."""
    x, y = _arg(3, 5), _arg(3, 5)
    for mode in ("backward", "forward_ad"):
        expected = MODES[mode](db.ZeroGradientsGenVmap.apply, (x, y), (0, 1))
        torch.testing.assert_close(MODES[mode](zero_gradients, (x, y), (0, 1)), expected)

    @sgm.custom_gradient
    def oversized(x):
        return x.clone(), lambda ct: torch.zeros(3, 4, *ct.shape, dtype=ct.dtype)

    with pytest.raises(ValueError, match=r"shape \(3, 4, 3, 5\) for args\[0\] of shape \(3, 5\)"):
        _reverse(oversized, (x,), (0,))
