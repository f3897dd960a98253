"""Gradient checkpointing with the decorator, as PyTorch users write it (issue 57): f runs a block of a standard
layer, and its VJP recomputes the block and returns PyTorch's own backward of it (``torch.func.vjp`` or
``torch.autograd.grad`` inside the VJP). Every such backward is linear in the upstream, and linear_ops knows each
backward op of the standard layers as linear in its first argument. The truth is plain autodiff of the block
(``torch.func.vjp`` and ``torch.func.jvp`` of it), float64; every mode the PyTorch namespace claims."""

import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as forward_ad  # noqa: E402
from torch import nn  # noqa: E402
from torch_modes import fresh_compilation  # noqa: E402

import stopgrad_math.torch as sgm  # noqa: E402

D = torch.float64


def _blocks():
    """name → (module, input shape): one block per standard layer, float64, its weights drawn from a fixed seed."""
    torch.manual_seed(57)
    made = {
        "linear": (nn.Linear(6, 5), (3, 6)),
        "layer_norm": (nn.LayerNorm(6), (3, 6)),
        "rms_norm": (nn.RMSNorm(6), (3, 6)),
        "batch_norm_eval": (nn.BatchNorm1d(6).eval(), (3, 6)),
        "group_norm": (nn.GroupNorm(2, 4), (2, 4, 5)),
        "instance_norm": (nn.InstanceNorm1d(4, affine=True), (2, 4, 5)),
        "conv2d": (nn.Conv2d(2, 3, 3, padding=1), (1, 2, 5, 5)),
        "conv_transpose2d": (nn.ConvTranspose2d(2, 3, 3), (1, 2, 4, 4)),
        "conv1d_depthwise": (nn.Conv1d(4, 4, 3, groups=4), (1, 4, 7)),
        "conv3d": (nn.Conv3d(1, 2, 2), (1, 1, 3, 3, 3)),
        "max_pool1d": (nn.MaxPool1d(2), (1, 2, 6)),
        "max_pool2d": (nn.MaxPool2d(2), (1, 2, 4, 4)),
        "max_pool3d": (nn.MaxPool3d(2), (1, 1, 4, 4, 4)),
        "avg_pool1d": (nn.AvgPool1d(2), (1, 2, 6)),
        "avg_pool2d": (nn.AvgPool2d(2), (1, 2, 4, 4)),
        "avg_pool3d": (nn.AvgPool3d(2), (1, 1, 4, 4, 4)),
        "adaptive_avg_pool2d": (nn.AdaptiveAvgPool2d(2), (1, 2, 5, 5)),
        "adaptive_max_pool2d": (nn.AdaptiveMaxPool2d(2), (1, 2, 5, 5)),
        "relu": (nn.ReLU(), (3, 6)),
        "gelu": (nn.GELU(), (3, 6)),
        "gelu_tanh": (nn.GELU("tanh"), (3, 6)),
        "silu": (nn.SiLU(), (3, 6)),
        "mish": (nn.Mish(), (3, 6)),
        "elu": (nn.ELU(), (3, 6)),
        "leaky_relu": (nn.LeakyReLU(0.1), (3, 6)),
        "hardtanh": (nn.Hardtanh(), (3, 6)),
        "hardswish": (nn.Hardswish(), (3, 6)),
        "prelu": (nn.PReLU(), (3, 6)),
        "tanh": (nn.Tanh(), (3, 6)),
        "sigmoid": (nn.Sigmoid(), (3, 6)),
        "softplus": (nn.Softplus(), (3, 6)),
        "glu": (nn.GLU(), (3, 6)),
        "softmax": (nn.Softmax(-1), (3, 6)),
        "log_softmax": (nn.LogSoftmax(-1), (3, 6)),
        "dropout_eval": (nn.Dropout(0.5).eval(), (3, 6)),
        "upsample_bilinear": (nn.Upsample(scale_factor=2, mode="bilinear"), (1, 2, 3, 3)),
        "upsample_nearest": (nn.Upsample(scale_factor=2), (1, 2, 3)),
        "reflection_pad": (nn.ReflectionPad1d(1), (1, 2, 5)),
        "replication_pad": (nn.ReplicationPad1d(1), (1, 2, 5)),
        "rnn_cell": (nn.RNNCell(6, 4), (3, 6)),
        "gru_cell": (nn.GRUCell(6, 4), (3, 6)),
        "lstm_cell": (nn.LSTMCell(6, 4), (3, 6)),
    }
    return {name: (module.to(D), shape) for name, (module, shape) in made.items()}


BLOCKS = _blocks()


def _block(name):
    module, _ = BLOCKS[name]
    return (lambda x: module(x)[0]) if name == "lstm_cell" else module


def _recomputed_with_func_vjp(block):
    @sgm.custom_gradient
    def checkpointed(x):
        return block(x), lambda ct: torch.func.vjp(block, x)[1](ct)[0]

    return checkpointed


def _recomputed_with_autograd_grad(block):
    @sgm.custom_gradient
    def checkpointed(x):
        def vjp(ct):
            with torch.enable_grad():
                again = x.detach().requires_grad_(True)
                return torch.autograd.grad(block(again), again, ct)[0]

        return block(x), vjp

    return checkpointed


WAYS = {"torch.func.vjp": _recomputed_with_func_vjp, "torch.autograd.grad": _recomputed_with_autograd_grad}


def _reverse(fn, x, ct, how):
    if how == "backward":
        moving = x.clone().requires_grad_(True)
        fn(moving).backward(ct)
        return moving.grad
    if how == "func.vjp":
        return torch.func.vjp(fn, x)[1](ct)[0]
    if how == "func.jacrev":
        return torch.einsum("o,oi->i", ct.reshape(-1), torch.func.jacrev(fn)(x).reshape(ct.numel(), -1)
                            ).reshape(x.shape)
    return torch.compile(lambda x: torch.func.vjp(fn, x)[1](ct)[0], fullgraph=True, backend="aot_eager")(x)


def _forward(fn, x, v, how):
    if how == "forward_ad":
        with forward_ad.dual_level():
            return forward_ad.unpack_dual(fn(forward_ad.make_dual(x, v))).tangent
    if how == "func.jvp":
        return torch.func.jvp(fn, (x,), (v,))[1]
    if how == "func.jacfwd":
        jacobian = torch.func.jacfwd(fn)(x)
        out = jacobian.shape[: jacobian.dim() - x.dim()]
        return (jacobian.reshape(*out, -1) @ v.reshape(-1)).reshape(out)
    return torch.func.vmap(lambda t: torch.func.jvp(fn, (x,), (t,))[1])(v[None])[0]


def _data(name):
    _, shape = BLOCKS[name]
    generator = torch.Generator().manual_seed(len(name))
    x = torch.randn(shape, dtype=D, generator=generator)
    y = _block(name)(x).detach()
    return x, torch.randn(x.shape, dtype=D, generator=generator), torch.randn(y.shape, dtype=D, generator=generator)


@pytest.mark.parametrize("how", ["backward", "func.vjp", "func.jacrev"])
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name", BLOCKS)
def test_a_recomputed_block_has_the_blocks_gradient_in_reverse_mode(name, way, how):
    block = _block(name)
    x, _, ct = _data(name)
    with torch.no_grad():
        truth = torch.func.vjp(block, x)[1](ct)[0]
    torch.testing.assert_close(_reverse(WAYS[way](block), x, ct, how), truth, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("how", ["forward_ad", "func.jvp", "func.jacfwd", "func.vmap(func.jvp)"])
@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name", BLOCKS)
def test_a_recomputed_block_has_the_blocks_derivative_in_forward_mode(name, way, how):
    """Forward mode, which no autograd.Function written as a checkpoint has: J·v from the backward's ops."""
    block = _block(name)
    x, v, _ = _data(name)
    with torch.no_grad():
        truth = torch.func.jvp(block, (x,), (v,))[1]
    torch.testing.assert_close(_forward(WAYS[way](block), x, v, how), truth, rtol=1e-10, atol=1e-12)


_WITH_WEIGHTS = ["linear", "layer_norm", "group_norm", "conv2d", "prelu", "gru_cell", "lstm_cell"]


@pytest.mark.parametrize("way", [*[("torch.func.vjp", name) for name in BLOCKS],
                                 *[("torch.autograd.grad", name) for name in _WITH_WEIGHTS]],
                         ids=lambda way_and_name: f"{way_and_name[1]}-{way_and_name[0]}")
def test_a_recomputed_block_is_exact_compiled_in_both_modes(way, monkeypatch):
    """Compiled with fullgraph, inside a compiled torch.func.vjp and torch.func.jvp. A module's weights, which its
    own forward reads, are reached through it (its parameters by name), so a VJP that detaches (autograd.grad) is
    embedded too. elu's backward is decomposed in the compiled graphs: compiled forward mode of elu_backward at a
    stopped input crashed the process (an efficient zero tensor written to). Each test compiles anew: Dynamo would
    otherwise take the shared code of ``_reverse`` with another block's shapes for dynamic sizes, where torch
    2.6's convolution double backward raises (``Cannot call numel() on tensor with symbolic sizes``)."""
    how, name = way
    block = _block(name)
    x, v, ct = _data(name)
    with torch.no_grad():
        backward_truth = torch.func.vjp(block, x)[1](ct)[0]
        forward_truth = torch.func.jvp(block, (x,), (v,))[1]
    checkpointed = WAYS[how](block)
    fresh_compilation(monkeypatch)
    torch.testing.assert_close(_reverse(checkpointed, x, ct, "compile(fullgraph) func.vjp"), backward_truth,
                               rtol=1e-10, atol=1e-12)
    fresh_compilation(monkeypatch)
    forward = torch.compile(lambda x, v: torch.func.jvp(checkpointed, (x,), (v,))[1], fullgraph=True,
                            backend="aot_eager")
    torch.testing.assert_close(forward(x, v), forward_truth, rtol=1e-10, atol=1e-12)


def test_a_recomputed_block_is_exact_through_a_compiled_backward(monkeypatch):
    """The decorated call itself compiled, its gradient taken by backward() outside."""
    fresh_compilation(monkeypatch)
    block = _block("conv2d")
    x, _, ct = _data("conv2d")
    with torch.no_grad():
        truth = torch.func.vjp(block, x)[1](ct)[0]
    moving = x.clone().requires_grad_(True)
    (torch.compile(_recomputed_with_func_vjp(block), fullgraph=True, backend="aot_eager")(moving) * ct
     ).sum().backward()
    torch.testing.assert_close(moving.grad, truth, rtol=1e-10, atol=1e-12)


def _with_non_finite_entries(x):
    x = x.clone()
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=x.dtype)
    return x


@pytest.mark.parametrize("name", BLOCKS)
def test_a_recomputed_block_at_nan_and_inf_has_the_vjps_derivative(name):
    """x holding NaN, inf and -inf: the gradient is the VJP's, and J·v its transpose's (PyTorch's autodiff of the
    pullback as a linear map), NaN and inf where those are, in both modes. Not the block's own JVP: PyTorch's
    forward mode of a linear layer at a NaN input is NaN everywhere (the weight's zero tangent times x), where J·v
    is finite."""
    block = _block(name)
    x, v, ct = _data(name)
    x = _with_non_finite_entries(x)
    with torch.no_grad():
        pullback = torch.func.vjp(block, x)[1]
        backward_truth = pullback(ct)[0]
        forward_truth = torch.func.vjp(lambda c: pullback(c)[0], torch.zeros_like(ct))[1](v)[0]
    checkpointed = _recomputed_with_func_vjp(block)
    torch.testing.assert_close(_reverse(checkpointed, x, ct, "backward"), backward_truth, rtol=1e-10, atol=1e-12,
                               equal_nan=True)
    torch.testing.assert_close(_forward(checkpointed, x, v, "func.jvp"), forward_truth, rtol=1e-10, atol=1e-12,
                               equal_nan=True)


def _recomputed_with_func_grad(block):
    """The VJP as torch.func.grad of ⟨block(x), ct⟩, as a user who thinks in gradients writes it."""
    @sgm.custom_gradient
    def checkpointed(x):
        return block(x), lambda ct: torch.func.grad(lambda x: (block(x) * ct).sum())(x)

    return checkpointed


def _recomputed_with_jacrev(block):
    """The VJP as ct times torch.func.jacrev's Jacobian of the block."""
    @sgm.custom_gradient
    def checkpointed(x):
        def vjp(ct):
            jacobian = torch.func.jacrev(block)(x).reshape(ct.numel(), x.numel())
            return (ct.reshape(1, -1) @ jacobian).reshape(x.shape)

        return block(x), vjp

    return checkpointed


@pytest.mark.parametrize("name", ["linear", "layer_norm", "conv2d", "gelu", "softmax"])
@pytest.mark.parametrize("recomputed", [_recomputed_with_func_grad, _recomputed_with_jacrev],
                         ids=["torch.func.grad", "torch.func.jacrev"])
def test_a_vjp_made_with_torch_func_grad_or_jacrev_is_exact_under_every_transform(name, recomputed):
    """torch.func.grad and jacrev inside the VJP (issue 57): exact in reverse and forward mode, eagerly and under
    the outer torch.func transforms, never a zero."""
    block = _block(name)
    x, v, ct = _data(name)
    with torch.no_grad():
        backward_truth = torch.func.vjp(block, x)[1](ct)[0]
        forward_truth = torch.func.jvp(block, (x,), (v,))[1]
    checkpointed = recomputed(block)
    for how in ("backward", "func.vjp", "func.jacrev"):
        torch.testing.assert_close(_reverse(checkpointed, x, ct, how), backward_truth, rtol=1e-10, atol=1e-12)
    for how in ("forward_ad", "func.jvp", "func.jacfwd", "func.vmap(func.jvp)"):
        torch.testing.assert_close(_forward(checkpointed, x, v, how), forward_truth, rtol=1e-10, atol=1e-12)


def _pullback_closed_over(block):
    @sgm.custom_gradient
    def checkpointed(x):
        y, pullback = torch.func.vjp(block, x)  # the graph recorded as f runs, its pullback kept for the VJP
        return y, lambda ct: pullback(ct)[0]

    return checkpointed


def test_a_vjp_closing_over_torch_func_vjps_pullback_is_exact_eagerly_and_refused_under_torch_func():
    """The pullback runs the graph recorded when f ran. Eagerly the VJP is traced with it as it is: exact in
    reverse and forward mode. Under torch.func the decorator traces a VJP outside the transform on stand-ins of
    the tensors it closes over, which carry no recorded graph: there it is refused naming the pullback and the
    rewrite, where it gave a zero derivative (issue 57)."""
    block = _block("linear")
    x, v, ct = _data("linear")
    with torch.no_grad():
        backward_truth = torch.func.vjp(block, x)[1](ct)[0]
        forward_truth = torch.func.jvp(block, (x,), (v,))[1]
    checkpointed = _pullback_closed_over(block)
    torch.testing.assert_close(_reverse(checkpointed, x, ct, "backward"), backward_truth, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(_forward(checkpointed, x, v, "forward_ad"), forward_truth, rtol=1e-10, atol=1e-12)
    for transform in (lambda: _forward(checkpointed, x, v, "func.jvp"),
                      lambda: _forward(checkpointed, x, v, "func.jacfwd"),
                      lambda: _reverse(checkpointed, x, ct, "func.vjp"),
                      lambda: torch.func.grad(lambda x: checkpointed(x).sum())(x)):
        with pytest.raises(ValueError, match=r"pullback.*Recompute inside the vjp"):
            transform()


def _attention():
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(4, 2, batch_first=True).to(D)
    return lambda x: attention(x, x, x, need_weights=False)[0]


_WITHOUT_DERIVATIVE = {"hardsigmoid": (nn.Hardsigmoid(), (6,), "hardsigmoid_backward"),
                       "multihead attention": (_attention(), (1, 3, 4),
                                               "_scaled_dot_product_flash_attention_for_cpu_backward")}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name", _WITHOUT_DERIVATIVE)
def test_a_backward_op_pytorch_cannot_differentiate_gives_reverse_mode_and_refuses_forward_mode_naming_it(name, way):
    """PyTorch implements no derivative in the upstream of hardsigmoid_backward nor of the CPU flash attention's
    backward, and the decorator's J·v is the backward's own derivative: forward mode raises naming the op, as
    PyTorch does for the block's double backward, eagerly and compiled. Reverse mode needs the VJP alone and is
    the block's gradient, as an autograd.Function written as the same checkpoint gives it. Truth: plain autodiff
    of the block, eagerly; compiled, the compiled block's own (Inductor computes hardsigmoid's backward in the
    dtype, where the eager kernel scales by a float32 1/6), bit for bit."""
    block, shape, op = _WITHOUT_DERIVATIVE[name]
    x = torch.randn(shape, dtype=D, generator=torch.Generator().manual_seed(3))
    ct = torch.randn(shape, dtype=D, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        truth = torch.func.vjp(block, x)[1](ct)[0]
    checkpointed = WAYS[way](block)
    for how in ("backward", "func.vjp"):
        torch.testing.assert_close(_reverse(checkpointed, x, ct, how), truth, rtol=1e-10, atol=1e-12)
    message = rf"runs aten::{op}, which is linear .* no derivative in PyTorch"
    for how in ("forward_ad", "func.jvp"):
        with pytest.raises(RuntimeError, match=message):
            _forward(checkpointed, x, ct, how)

    def compiled_backward(fn):
        moving = x.clone().requires_grad_(True)
        torch.compile(fn, fullgraph=True)(moving).backward(ct)
        return moving.grad

    try:  # (a compiled torch.func.vjp of the attention block fails in Inductor: the truth is its backward)
        compiled_truth = compiled_backward(block)
    except RuntimeError as error:  # torch 2.6's Inductor: "expected scalar type Double but found Float" in the
        assert name == "multihead attention" and torch.__version__ < "2.7", error  # float64 block's own backward
        compiled_truth = None
        with pytest.raises(RuntimeError, match="expected scalar type Double"):  # the checkpoint's raises as its does
            compiled_backward(checkpointed)
    if compiled_truth is not None:
        assert torch.equal(compiled_backward(checkpointed), compiled_truth)
        assert torch.equal(torch.compile(lambda x: torch.func.vjp(checkpointed, x)[1](ct)[0], fullgraph=True)(x),
                           compiled_truth)
    with pytest.raises(Exception, match=message):
        torch.compile(lambda x: torch.func.jvp(checkpointed, (x,), (ct,))[1], fullgraph=True)(x)


def test_a_block_torch_func_cannot_differentiate_raises_as_it_does():
    """BatchNorm in training mode updates its running statistics in place, which torch.func refuses: the block's
    own torch.func.vjp raises, and so does the decorated checkpoint, with PyTorch's reason."""
    block = nn.BatchNorm1d(6).to(D)
    x = torch.randn(3, 6, dtype=D)
    with pytest.raises(RuntimeError, match="in-place"):
        torch.func.vjp(block, x)
    with pytest.raises(Exception, match="in-place"):
        _reverse(_recomputed_with_func_vjp(block), x, torch.ones(3, 6, dtype=D), "backward")
