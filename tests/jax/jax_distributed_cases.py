"""The JAX namespace over 8 simulated CPU devices: run by test_distributed.py in a process of its own, with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (JAX reads it once, when its backend starts).

Each case is the loss Σ fn(x) (log1pexp by the identity form, by the decorator, and scale_gradient), sharded, in
float64, against plain autodiff of the stable formula (softplus) on one device: jit with NamedSharding on a 1-D
and a 2-D mesh (grad and jvp), shard_map with its default checks and a psum in the loss (the gradient taken
outside the map and inside it), and pmap with a psum (against softplus autodiffed there, since pmap's psum
transposes to a psum); and Keras 3's model.fit under keras.distribution.DataParallel (KERAS_BACKEND=jax)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import stopgrad_math.jax as sgm

jax.config.update("jax_enable_x64", True)

try:
    shard_map = jax.shard_map  # JAX 0.7 and later; check_vma=True by default
except AttributeError:
    from jax.experimental.shard_map import shard_map  # JAX 0.4.35 to 0.6; check_rep=True by default

X = np.linspace(-4.0, 4.0, 16) + 0.05  # no element at 0, where scale_gradient's straight-through is still exact


@sgm.custom_gradient
def _decorated(x):
    return jnp.logaddexp(x, 0.0), lambda ct: ct * jax.nn.sigmoid(x)


@sgm.custom_gradient(order=2)
def _decorated_at_order_2(x):  # J moves with x: its embedding is the mapped zero, a primitive with a jaxpr in it
    return jnp.logaddexp(x, 0.0), lambda ct: ct * jax.nn.sigmoid(x)


FORMS = {
    "identity form": lambda x: sgm.custom_gradient(jnp.logaddexp(x, 0.0), jax.nn.sigmoid(x), x),
    "decorator": _decorated,
    "decorator at order 2": _decorated_at_order_2,
    "scale_gradient": lambda x: sgm.scale_gradient(jax.nn.softplus(x), 0.5),
}
# of the truth, softplus' = sigmoid
SLOPES = {"identity form": 1.0, "decorator": 1.0, "decorator at order 2": 1.0, "scale_gradient": 0.5}


def _truth(form):
    return SLOPES[form] * np.asarray(jax.nn.sigmoid(jnp.asarray(X)))


def _mesh(shape, names):
    assert len(jax.devices()) == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    return Mesh(np.array(jax.devices()).reshape(shape), names)


MESHES = {"1-D mesh of 8": ((8,), ("data",), P("data")), "2-D mesh of 4x2": ((4, 2), ("data", "model"),
                                                                            P(("data", "model")))}


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("form", FORMS)
def test_jit_with_named_sharding(form, mesh):
    shape, names, spec = MESHES[mesh]
    sharding = NamedSharding(_mesh(shape, names), spec)
    x = jax.device_put(jnp.asarray(X), sharding)
    fn = FORMS[form]
    loss = jax.jit(lambda x: jnp.sum(fn(x)))
    gradient = jax.jit(jax.grad(lambda x: jnp.sum(fn(x))))(x)
    assert gradient.sharding.is_equivalent_to(sharding, 1)
    np.testing.assert_allclose(gradient, _truth(form), rtol=1e-13, atol=1e-15)
    _, tangent = jax.jit(lambda x, t: jax.jvp(lambda x: fn(x), (x,), (t,)))(x, jnp.ones_like(x))
    np.testing.assert_allclose(tangent, _truth(form), rtol=1e-13, atol=1e-15)  # scale_gradient scales both modes
    np.testing.assert_allclose(loss(x), np.sum(np.logaddexp(X, 0.0)), rtol=1e-13)


def _shard_mapped(function, mesh, out_spec):
    return shard_map(function, mesh=mesh, in_specs=P("data"), out_specs=out_spec)


@pytest.mark.parametrize("form", FORMS)
def test_shard_map_with_its_default_checks_and_a_psum_in_the_loss(form):
    """The gradient taken outside the map (of a psum'd loss), against the truth on one device; and inside it (each
    device's part), against softplus autodiffed there: what psum transposes to inside is JAX's (a psum, 8 times
    the share, with 0.4.35's check_rep; the share with check_vma)."""
    mesh = _mesh((8,), ("data",))
    fn = FORMS[form]
    x = jax.device_put(jnp.asarray(X), NamedSharding(mesh, P("data")))
    total = _shard_mapped(lambda xs: jax.lax.psum(jnp.sum(fn(xs)), "data"), mesh, P())
    np.testing.assert_allclose(jax.jit(jax.grad(total))(x), _truth(form), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(jax.jit(total)(x), np.sum(np.logaddexp(X, 0.0)), rtol=1e-13)

    def inside(fn):
        return jax.jit(_shard_mapped(jax.grad(lambda xs: jax.lax.psum(jnp.sum(fn(xs)), "data")), mesh, P("data")))

    plain = SLOPES[form] * np.asarray(inside(jax.nn.softplus)(x))
    np.testing.assert_allclose(inside(fn)(x), plain, rtol=1e-13, atol=1e-15)
    assert np.allclose(plain, _truth(form)) or np.allclose(plain, 8.0 * _truth(form))


@pytest.mark.parametrize("form", FORMS)
def test_jvp_jacfwd_and_vmap_inside_shard_map_with_its_default_checks(form):
    """Inside the map each device differentiates its own part: jvp along ones, the diagonal of jacfwd, and vmap of
    grad over the part's elements, against softplus differentiated the same way in the same map, and that against
    the truth on one device (scale_gradient scales both modes)."""
    mesh = _mesh((8,), ("data",))
    x = jax.device_put(jnp.asarray(X), NamedSharding(mesh, P("data")))

    def ways(fn):
        def per_device(xs):
            tangent = jax.jvp(fn, (xs,), (jnp.ones_like(xs),))[1]
            diagonal = jnp.diagonal(jax.jacfwd(fn)(xs))
            elementwise = jax.vmap(jax.grad(fn))(xs)
            return tangent, diagonal, elementwise
        mapped = shard_map(per_device, mesh=mesh, in_specs=P("data"), out_specs=(P("data"),) * 3)
        return [np.asarray(part) for part in jax.jit(mapped)(x)]

    plain = ways(jax.nn.softplus)
    for got, want in zip(ways(FORMS[form]), plain, strict=True):
        np.testing.assert_allclose(got, SLOPES[form] * want, rtol=1e-13, atol=1e-15)
    for part in plain:
        np.testing.assert_allclose(part, _truth("identity form"), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("form", FORMS)
def test_pmap_with_a_psum(form):
    """Under pmap the gradient of a psum'd loss w.r.t. a device's part is the axis size (8) times its share, as
    plain autodiff gives it there (psum's transpose is a psum): ours against softplus autodiffed in the same pmap,
    and that against 8 times the truth on one device."""
    def gradient_of(fn):
        @functools.partial(jax.pmap, axis_name="devices")
        def gradient(xs):
            return jax.grad(lambda xs: jax.lax.psum(jnp.sum(fn(xs)), "devices"))(xs)
        return np.ravel(gradient(jnp.asarray(X).reshape(8, 2)))

    plain = SLOPES[form] * gradient_of(jax.nn.softplus)
    np.testing.assert_allclose(gradient_of(FORMS[form]), plain, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(plain, 8.0 * _truth(form), rtol=1e-13, atol=1e-15)


def _keras_weights(activation, distributed):
    """Weights after 3 epochs of SGD on a small regression, batch 16 over 8 devices with Keras's DataParallel
    (each device a share of the batch, the gradients all-reduced) or on one device, float64."""
    keras = pytest.importorskip("keras")
    assert keras.backend.backend() == "jax", "run with KERAS_BACKEND=jax"
    keras.config.set_floatx("float64")
    if distributed:
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(8), keras.layers.Activation(activation),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(64, 2)) * 3.0, rng.normal(size=(64, 1))
        model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
        return [np.asarray(w) for w in model.weights]
    finally:
        keras.distribution.set_distribution(None)
        keras.config.set_floatx("float32")


_SPD = np.array([[4.0, 1.0], [1.0, 3.0]])


def _cg_steps(matvec, b):
    """Two CG steps by hand, no tolerance: exact for a 2×2 symmetric positive definite operator, 0/0 at b = 0."""
    x, r = jnp.zeros_like(b), b
    p = r
    for _ in range(2):
        applied = matvec(p)
        alpha = (r @ r) / (p @ applied)
        x, r_next = x + alpha * p, r - alpha * applied
        p, r = r_next + (r_next @ r_next) / (r @ r) * p, r_next
    return x


def test_a_declared_solve_inside_shard_map_gives_zero_on_a_device_whose_right_hand_side_is_zero():
    """``linear_solve`` inside shard_map, one right-hand side a device, four of them zero (issue 78's guard, a cond on
    each device's own b): the solution where b is not zero and 0 where it is, in value, in a zero tangent, in the
    gradient of a zero loss, and a weighted gradient (A⁻ᵀw per device), against NumPy's solve."""
    mesh = _mesh((8,), ("data",))
    rows = np.array([[1.0, 2.0]] * 4 + [[0.0, 0.0]] * 4)
    solved = shard_map(lambda bs: sgm.linear_solve(lambda v: jnp.asarray(_SPD) @ v, bs[0], _cg_steps,
                                                   symmetric=True)[None], mesh=mesh, in_specs=P("data"),
                       out_specs=P("data"))
    bs = jax.device_put(jnp.asarray(rows), NamedSharding(mesh, P("data")))
    assert np.isnan(_cg_steps(lambda v: jnp.asarray(_SPD) @ v, jnp.zeros(2))).all()  # the solver itself at b = 0
    np.testing.assert_allclose(jax.jit(solved)(bs), np.linalg.solve(_SPD, rows.T).T, rtol=1e-13, atol=0)
    np.testing.assert_array_equal(jax.jit(lambda t: jax.jvp(solved, (bs,), (t,))[1])(jnp.zeros_like(bs)), 0.0)
    np.testing.assert_array_equal(jax.jit(jax.grad(lambda bs: 0.0 * jnp.sum(solved(bs))))(bs), 0.0)
    weights = np.arange(8.0)[:, None] * np.ones((1, 2))
    np.testing.assert_allclose(jax.jit(jax.grad(lambda bs: jnp.sum(solved(bs) * weights)))(bs),
                               np.linalg.solve(_SPD.T, weights.T).T, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("form", ["identity form", "decorator"])
def test_keras_fit_under_data_parallel(form):
    """model.fit with keras.distribution.DataParallel over the 8 devices, log1pexp as the activation through
    stopgrad_math.keras: the weights of the same run on one device (the 8 shares' gradients all-reduced, to the
    order of a float64 sum), and of the model whose activation is softplus, differentiated by JAX, to 1e-7: the
    forms' value is Keras's logaddexp, which differs from softplus in the last bits, and 12 steps carry that."""
    from keras import ops

    import stopgrad_math.keras as sgk

    @sgk.custom_gradient
    def decorated(x):
        return ops.logaddexp(x, 0.0), lambda upstream: upstream * ops.sigmoid(x)

    activation = decorated if form == "decorator" else (
        lambda x: sgk.custom_gradient(ops.logaddexp(x, 0.0), ops.sigmoid(x), x))
    distributed, one_device, truth = (_keras_weights(activation, True), _keras_weights(activation, False),
                                      _keras_weights(ops.softplus, True))
    for got, single, softplus in zip(distributed, one_device, truth, strict=True):
        np.testing.assert_allclose(got, single, rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(got, softplus, rtol=0, atol=1e-7)
