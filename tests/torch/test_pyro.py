"""A Pyro pipeline on stopgrad_math.torch: a logistic-regression model whose log-density takes log1pexp through
the identity, run by SVI and NUTS beside the same model on the stable formula (logaddexp(η, 0), differentiated by
PyTorch), and the naive formula that both replace."""

import pytest

torch = pytest.importorskip("torch")
pyro = pytest.importorskip("pyro")
import pyro.distributions as dist  # noqa: E402
from pyro.infer import MCMC, NUTS, SVI, Trace_ELBO  # noqa: E402
from pyro.infer.autoguide import AutoNormal  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402

torch.set_default_dtype(torch.float64)  # restored below: the pipeline compares in float64
FEATURES = torch.linspace(-1.0, 1.0, 12)[:, None] * torch.tensor([[1.0, 40.0]])  # |η| up to 41·|w|
LABELS = (torch.arange(12) % 3 == 0).double()
torch.set_default_dtype(torch.float32)


def identity_log1pexp(eta):
    return sgm.custom_gradient(torch.logaddexp(eta, torch.zeros_like(eta)), torch.sigmoid(eta), eta)


class _Log1pexp(torch.autograd.Function):
    """The anchor for a chain: the stable value and the same rule, σ(η)·cotangent, as PyTorch's own mechanism."""

    @staticmethod
    def forward(ctx, eta):
        ctx.save_for_backward(eta)
        return torch.logaddexp(eta, torch.zeros_like(eta))

    @staticmethod
    def backward(ctx, ct):
        return ct * torch.sigmoid(ctx.saved_tensors[0])


LOG1PEXP = {
    "identity": identity_log1pexp,
    "autograd.Function": _Log1pexp.apply,
    "stable": lambda eta: torch.logaddexp(eta, torch.zeros_like(eta)),  # softplus is linear above 20: not exact
    "naive": lambda eta: torch.log(1 + torch.exp(eta)),
}


def model(log1pexp):
    w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=torch.float64), 3.0).to_event(1))
    eta = FEATURES @ w
    # Bernoulli's log-likelihood: y·η − log(1 + exp(η)), added as a factor
    pyro.factor("likelihood", (LABELS * eta - log1pexp(eta)).sum())


def _svi(name, steps=30):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide = AutoNormal(lambda: model(LOG1PEXP[name]))
    svi = SVI(lambda: model(LOG1PEXP[name]), guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    losses = [svi.step() for _ in range(steps)]
    return losses, {k: v.detach().clone() for k, v in pyro.get_param_store().items()}


START = torch.tensor([20.0, 20.0], dtype=torch.float64)  # η up to 820: exp(η) overflows float64 from 709.8


def _nuts(name, samples=40):
    pyro.set_rng_seed(1)
    kernel = NUTS(lambda: model(LOG1PEXP[name]), max_tree_depth=5, jit_compile=False)
    mcmc = MCMC(kernel, num_samples=samples, warmup_steps=20, disable_progbar=True,
                initial_params={"w": START})
    mcmc.run()
    return mcmc.get_samples()["w"]


def test_the_potential_energys_gradient_is_the_stable_formulas_where_the_naive_one_is_nan():
    w = START
    grads = {}
    for name, log1pexp in LOG1PEXP.items():
        w_ = w.clone().requires_grad_(True)
        eta = FEATURES @ w_
        (grads[name],) = torch.autograd.grad((LABELS * eta - log1pexp(eta)).sum(), w_)
    closed_form = FEATURES.T @ (LABELS - torch.sigmoid(FEATURES @ w))
    torch.testing.assert_close(grads["identity"], closed_form, rtol=1e-15, atol=0)
    torch.testing.assert_close(grads["stable"], closed_form, rtol=1e-13, atol=0)
    assert torch.isnan(grads["naive"]).all()


def test_svi_steps_match_the_stable_formula():
    losses, params = _svi("identity")
    stable_losses, stable_params = _svi("stable")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(stable_losses), rtol=1e-10, atol=0)
    for key in params:
        torch.testing.assert_close(params[key], stable_params[key], rtol=1e-10, atol=1e-12)
    assert losses[-1] < losses[0]


def test_a_short_nuts_chain_matches_the_function_with_the_same_rule_and_the_naive_one_cannot_start():
    """Against the autograd.Function with the same rule, not the stable formula: logaddexp's own backward differs
    from σ(η) in the last bit, which 60 trajectories amplify by a factor that depends on the CPU's vector code
    (1e-7 on one machine, 4e-6 on another)."""
    samples, anchor = _nuts("identity"), _nuts("autograd.Function")
    torch.testing.assert_close(samples, anchor, rtol=1e-6, atol=1e-8)
    assert samples.std(0).min() > 0  # the chain moved
    with pytest.raises((RuntimeError, ValueError)):  # Pyro's check of the initial point: a NaN gradient
        _nuts("naive", samples=2)
