"""stopgrad_math inside TFP and Keras pipelines; every test checks numbers."""

import keras
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
import tf_keras
from helpers import sibling

from stopgrad_math import custom_gradient

CustomDense = sibling("test_decorator_form").CustomDense

tfd = tfp.distributions


def log1pexp(x):
    """Stable value, exact gradient embedded."""
    return custom_gradient(tf.math.softplus(x), tf.math.sigmoid(x), x)


@custom_gradient
def log1pexp_decorated(x):
    return tf.math.softplus(x), lambda dy: dy * tf.math.sigmoid(x)


def logistic_data(n=200, d=3, seed=0):
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n, d))
    labels = (rng.uniform(size=n) < 1 / (1 + np.exp(-features @ np.array([1.5, -2.0, 0.5])))).astype(np.float64)
    return tf.constant(features), tf.constant(labels)


FEATURES, LABELS = logistic_data()


def logistic_nll(theta, softplus):
    # −log p(y | x, θ) = Σ softplus(logit) − y·logit
    logits = tf.linalg.matvec(FEATURES, theta)
    return tf.reduce_sum(softplus(logits) - LABELS * logits) + 0.5 * tf.reduce_sum(theta**2)


def test_value_and_gradient():
    x = tf.constant([-3.0, 0.0, 100.0])
    value, grad = tfp.math.value_and_gradient(lambda x: tf.reduce_sum(log1pexp(x)), x)
    assert float(value) == float(tf.reduce_sum(tf.math.softplus(x)))
    np.testing.assert_array_equal(grad, tf.math.sigmoid(x))


def test_lbfgs_reaches_the_same_optimum_as_plain_autodiff():
    def run(softplus):
        objective = lambda theta: tfp.math.value_and_gradient(lambda t: logistic_nll(t, softplus), theta)  # noqa: E731
        return tfp.optimizer.lbfgs_minimize(objective, tf.zeros(3, tf.float64), tolerance=1e-12)

    ours, plain = run(log1pexp), run(tf.math.softplus)
    assert bool(ours.converged) and bool(plain.converged)
    np.testing.assert_allclose(ours.position, plain.position, rtol=1e-8)
    np.testing.assert_allclose(ours.objective_gradient, 0.0, atol=1e-6)


def test_hmc_chain_is_identical_to_the_plain_model():
    def sample(softplus):
        target = lambda t: -logistic_nll(t, softplus)  # noqa: E731
        kernel = tfp.mcmc.HamiltonianMonteCarlo(target, step_size=0.05, num_leapfrog_steps=5)

        @tf.function(jit_compile=True)
        def chain():
            return tfp.mcmc.sample_chain(
                200, tf.zeros(3, tf.float64), kernel=kernel, num_burnin_steps=100, trace_fn=None, seed=(1, 2)
            )

        return chain()

    ours, plain = sample(log1pexp), sample(tf.math.softplus)
    np.testing.assert_allclose(ours, plain, rtol=1e-10)  # same gradients, same seed: the same chain
    assert np.all(np.sign(tf.reduce_mean(ours, 0)) == [1, -1, 1])


def test_variational_fit_matches_the_conjugate_posterior():
    # y_i ~ Normal(μ, 1), μ ~ Normal(0, 1): posterior Normal(Σy / (n + 1), 1 / (n + 1)).
    y = tf.constant(np.random.default_rng(1).normal(2.0, 1.0, size=50))

    def fit(embed):
        def log_prob(mu):  # mu: a batch of surrogate samples, so fx is a vector
            residual = y - mu[..., tf.newaxis]
            # The likelihood with its gradient embedded: d/dμ Σ −r²/2 = Σ r, one per sample.
            likelihood = embed(tf.reduce_sum(-0.5 * residual**2, -1), tf.reduce_sum(residual, -1), mu)
            return likelihood - 0.5 * mu**2

        loc = tf.Variable(0.0, dtype=tf.float64)
        scale = tfp.util.TransformedVariable(1.0, tfp.bijectors.Softplus(), dtype=tf.float64)
        tfp.vi.fit_surrogate_posterior(
            log_prob, tfd.Normal(loc, scale), tf_keras.optimizers.Adam(0.05), num_steps=500, sample_size=20, seed=(3, 4)
        )
        return float(loc), float(tf.convert_to_tensor(scale))

    n = 50
    loc, scale = fit(custom_gradient)
    np.testing.assert_allclose(loc, float(tf.reduce_sum(y)) / (n + 1), atol=0.02)
    np.testing.assert_allclose(scale, (1 / (n + 1)) ** 0.5, rtol=0.15)


class StableBernoulli(tfd.Bernoulli):
    """Bernoulli whose log_prob embeds the exact gradient: log p(y) = −log1pexp(−s·logit), s = 2y − 1."""

    def _log_prob(self, event):
        logits = self._logits_parameter_no_checks()
        sign = 2 * tf.cast(event, logits.dtype) - 1
        return -log1pexp_decorated(-sign * logits)


def test_a_distribution_whose_log_prob_uses_the_library():
    logits = tf.constant([-30.0, 0.0, 2.0, 100.0], tf.float64)
    events = tf.constant([1, 0, 1, 1])
    ours = StableBernoulli(logits=logits)
    plain = tfd.Bernoulli(logits=logits)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        ours_lp, plain_lp = ours.log_prob(events), plain.log_prob(events)
    np.testing.assert_allclose(ours_lp, plain_lp, rtol=1e-12)
    expected = tf.cast(events, tf.float64) - tf.math.sigmoid(logits)
    np.testing.assert_allclose(tape.gradient(ours_lp, logits), expected, rtol=1e-12, atol=1e-15)


def _model(x):
    model = keras.Sequential([keras.Input((3,)), CustomDense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def test_keras_fit_then_saved_model_keeps_gradients(tmp_path):
    x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    y = x @ np.array([[1.0], [-2.0], [0.5]], np.float32)
    model = _model(x)
    model.fit(x, y, epochs=40, batch_size=64, verbose=0)
    kernel = model.layers[0].kernel.numpy()
    np.testing.assert_allclose(kernel, [[1.0], [-2.0], [0.5]], atol=0.05)

    model.export(str(tmp_path / "model"))  # (no verbose=False: Keras 3.5 has no such argument)
    loaded = tf.saved_model.load(str(tmp_path / "model"))
    inputs = tf.constant(x[:4])
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        out = loaded.serve(inputs)
    np.testing.assert_allclose(out, x[:4] @ kernel, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tape.gradient(out, inputs), np.tile(kernel.T, (4, 1)), rtol=1e-6)


def test_mirrored_training_step_is_autodiff_of_the_stable_formula():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x = tf.constant(np.random.default_rng(2).normal(size=(8, 3)), tf.float32)
    y = tf.constant(np.random.default_rng(3).normal(size=(8, 1)), tf.float32)

    def loss_and_grads(kernel, xb, yb):
        @custom_gradient
        def matmul(a):
            return tf.matmul(a, kernel), lambda dy: tf.matmul(dy, kernel, transpose_b=True)

        with tf.GradientTape() as tape:
            prediction = log1pexp(matmul(xb))
            loss = tf.reduce_sum((prediction - yb) ** 2) / 8.0
        return tape.gradient(loss, kernel)

    with strategy.scope():
        mirrored = tf.Variable(tf.ones([3, 1]))
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))

    @tf.function
    def step(batch):
        grads = strategy.run(lambda xb, yb: loss_and_grads(mirrored, xb, yb), args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, grads, axis=None)

    distributed = step(next(iter(dataset)))
    kernel = tf.Variable(tf.ones([3, 1], tf.float64))  # the truth: autodiff of the stable formula, in float64
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum((tf.math.softplus(tf.cast(x, tf.float64) @ kernel) - tf.cast(y, tf.float64)) ** 2) / 8
    np.testing.assert_allclose(distributed, tape.gradient(loss, kernel), rtol=1e-5)
