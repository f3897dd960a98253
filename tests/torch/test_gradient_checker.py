"""stopgrad_math.torch.check_gradient: right derivatives pass, wrong ones fail, in both modes."""

import pytest

torch = pytest.importorskip("torch")

import stopgrad_math.torch as sgm  # noqa: E402

X = [-3.0, 0.0, 5.0]


def log1pexp(scale=1.0):
    return lambda x: sgm.custom_gradient(torch.logaddexp(x, torch.zeros((), dtype=x.dtype)),
                                         scale * torch.sigmoid(x), x)


def test_a_right_gradient_passes_in_both_modes_with_differences_in_float64():
    report = sgm.check_gradient(log1pexp(), torch.tensor(X))
    assert report.passed and {row.numeric_dtype for row in report.rows} == {"float64"}
    assert {row.mode for row in report.rows} == {"reverse", "forward"}


@pytest.mark.parametrize("scale", [1.005, 0.995, -1.0])
def test_a_gradient_wrong_by_half_a_percent_fails_in_both_modes(scale):
    report = sgm.check_gradient(log1pexp(scale), torch.tensor(X))
    assert not report.passed and not any(row.passed for row in report.rows)
    with pytest.raises(AssertionError, match="gradient check failed"):
        sgm.assert_gradient(log1pexp(scale), torch.tensor(X))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_arguments_get_their_own_tolerance(dtype):
    """bfloat16's tolerance is looked up by name (NumPy has no bfloat16): a right gradient passes, one 10% off fails."""
    x = torch.tensor([1.0, 2.0], dtype=dtype)
    assert sgm.check_gradient(lambda x: x**2, x).passed
    assert not sgm.check_gradient(lambda x: sgm.custom_gradient(x**2, 2.2 * x, x), x).passed


def test_float64_is_checked_to_float64s_tolerance():
    report = sgm.check_gradient(log1pexp(), torch.tensor(X, dtype=torch.float64))
    assert report.passed and report.max_rel_error < 1e-8
    assert not sgm.check_gradient(log1pexp(1.0 + 1e-5), torch.tensor(X, dtype=torch.float64)).passed


def test_a_wrong_forward_mode_alone_fails_its_row():
    """A derivative right in reverse mode and wrong in forward mode: sin, scaled by 1.01 under forward_ad alone."""
    def fn(x):
        y = torch.sin(x)
        return y if not torch.autograd.forward_ad._current_level >= 0 else y * 1.01

    report = sgm.check_gradient(fn, torch.tensor(X))
    assert {row.mode: row.passed for row in report.rows} == {"reverse": True, "forward": False}


def test_differences_in_the_arguments_dtype_where_fn_refuses_float64():
    weight = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    report = sgm.check_gradient(lambda x: weight @ x, torch.tensor([0.5, -1.0]))
    assert report.passed and {row.numeric_dtype for row in report.rows} == {"float32"}


def test_a_float64_argument_that_does_not_make_the_output_float64_is_not_taken_for_float64_differences():
    """A 0-d tensor does not promote a dimensioned one in PyTorch: 2.0 (float64, 0-d) · sin(b) (float32) is
    float32; its differences are labelled so, with float32's step, and pass (0.4% off with float64's step)."""
    b = torch.tensor([0.1, 0.3])
    report = sgm.check_gradient(lambda a: a * torch.sin(b), torch.tensor(2.0))
    assert report.passed and {row.numeric_dtype for row in report.rows} == {"float32"}


def test_a_nan_derivative_where_the_function_is_finite_fails():
    """sqrt with its derivative written NaN below x = 0.5: fails at 0.25, where the finite difference is finite."""
    fn = lambda x: sgm.custom_gradient(torch.sqrt(x), torch.where(x > 0.5, 0.5 / torch.sqrt(x), torch.nan), x)  # noqa: E731
    assert not sgm.check_gradient(fn, torch.tensor([0.25, 4.0])).passed
    assert sgm.check_gradient(fn, torch.tensor([1.0, 4.0])).passed


def test_several_arguments_and_outputs_and_a_non_floating_argument():
    fn = lambda a, b, n: (a * b, {"s": torch.sin(a) * n})  # noqa: E731
    report = sgm.check_gradient(fn, torch.tensor([0.5, 1.0]), torch.tensor([2.0, -1.0]), 3)
    assert report.passed and sorted({row.argument for row in report.rows}) == [0, 1]


def test_nothing_to_check_never_passes_and_complex_is_refused():
    assert not sgm.check_gradient(lambda n: n * 2, 3).passed
    with pytest.raises(TypeError, match="real and imaginary parts"):
        sgm.check_gradient(torch.exp, torch.tensor([1.0 + 1.0j]))
    with pytest.raises(ValueError, match="step must be a finite number above 0"):
        sgm.check_gradient(torch.sin, torch.ones(2), step=0.0)


def test_arguments_are_nests_each_leaf_checked_and_named():
    report = sgm.check_gradient(lambda p, t: p["a"] * torch.sin(p["b"]) + t[0] * t[1],
                                {"a": torch.tensor(2.0), "b": torch.tensor([0.1, 0.3])},
                                (torch.ones(2), 3.0 * torch.ones(2)))
    assert report.passed
    assert sorted({(row.argument, row.leaf) for row in report.rows}) == [(0, "['a']"), (0, "['b']"), (1, "[0]"),
                                                                         (1, "[1]")]
    assert "0['b']" in str(report)
    wrong = sgm.check_gradient(lambda t: sgm.custom_gradient(t[0] * t[1], 5.0 * t[1], t[0]), (2.0, 3.0))
    assert not wrong.passed  # each leaf's wrong gradient is found
    assert sorted(row.leaf for row in wrong.rows if not row.passed) == ["[0]", "[0]", "[1]", "[1]"]


def _logaddexp_in_float32(x):  # as Keras's torch backend computes ops.logaddexp: the float64 argument cast down
    return torch.logaddexp(x.float(), torch.zeros(())).double()


@pytest.mark.parametrize("scale, passes", [(1.0, True), (1.1, False)])
def test_a_function_computing_in_float32_from_a_float64_argument_is_checked_at_float32(scale, passes):
    """Its ops read as float32, so the differences take float32's step and tolerance (float64's step made a right
    gradient 12% off); the gradient 10% off still fails. The truth is the closed form σ(x)."""
    x = torch.tensor([-3.0, 0.5, 4.0], dtype=torch.float64)
    report = sgm.check_gradient(
        lambda x: sgm.custom_gradient(_logaddexp_in_float32(x), scale * torch.sigmoid(x), x), x)
    assert report.passed == passes
    assert {row.numeric_dtype for row in report.rows} == {"float32"}
