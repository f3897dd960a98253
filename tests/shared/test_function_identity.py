"""When two functions are the same function: one code, one closure (what TFP's factory's fresh wrappers share)."""

import gc

import tensorflow as tf

from stopgrad_math.shared import function_identity


def _factory(vjp_fwd, kept):
    """As TFP's factory builds its wrapper at every call: one code, a fresh dict of kept arguments."""
    closure = dict(kept)

    def wrapped(*args):
        return vjp_fwd(*args, **closure)

    return wrapped


def _forward(x, **_):
    return x


def _other_forward(x, **_):
    return -x


def test_a_factorys_fresh_wrappers_of_one_function_are_the_same_function():
    assert _factory(_forward, {}) is not _factory(_forward, {})
    assert function_identity.key(_factory(_forward, {})) == function_identity.key(_factory(_forward, {}))
    assert hash(function_identity.key(_factory(_forward, {1: "i"}))) == hash(
        function_identity.key(_factory(_forward, {1: "i"})))


def test_another_wrapped_function_or_other_kept_arguments_are_another_function():
    key = function_identity.key(_factory(_forward, {1: "i"}))
    assert key != function_identity.key(_factory(_other_forward, {1: "i"}))
    assert key != function_identity.key(_factory(_forward, {1: "j"}))
    assert key != function_identity.key(_factory(_forward, {1: 1}))  # "i" and 1, 1 and 1.0 and True: not one
    assert function_identity.key(_factory(_forward, {1: 1})) != function_identity.key(_factory(_forward, {1: 1.0}))


def _closing_over(value):
    return lambda x: value * x


def test_a_tensor_or_a_list_in_the_closure_is_compared_by_identity():
    t = tf.constant(2.0)
    assert function_identity.key(_closing_over(t)) == function_identity.key(_closing_over(t))
    assert function_identity.key(_closing_over(t)) != function_identity.key(_closing_over(tf.constant(2.0)))
    kept = []
    before = function_identity.key(_closing_over(kept))
    kept.append(tf.constant(1.0))  # a grad_fn appending its upstreams: the same function still
    assert function_identity.key(_closing_over(kept)) == before
    assert before != function_identity.key(_closing_over([]))


def test_a_key_never_takes_a_new_object_for_a_dead_one_with_its_id():
    key = function_identity.key(_closing_over(tf.constant(2.0)))  # the tensor dies with the lambda
    gc.collect()
    later = [function_identity.key(_closing_over(tf.constant(2.0))) for _ in range(50)]  # ids are reused
    assert all(k != key for k in later)


def test_a_function_that_refers_to_itself_and_a_callable_object():
    def recursive(n):
        return 0 if n == 0 else recursive(n - 1)

    assert function_identity.key(recursive) == function_identity.key(recursive)

    class Call:
        def __call__(self, x):
            return x

    first, second = Call(), Call()
    assert function_identity.key(first) == function_identity.key(first) != function_identity.key(second)
