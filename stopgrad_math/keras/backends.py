"""Which namespace a call of ``stopgrad_math.keras`` runs on, and what it is given there.

Keras 3 runs on one backend per process, ``keras.backend.backend()``; each
name of this namespace looks it up when called and runs the namespace of
that framework (``stopgrad_math.tensorflow``, ``stopgrad_math.jax`` or
``stopgrad_math.torch``), which is imported then. A ``keras.Variable`` is
given to the TensorFlow namespace as it is (TensorFlow takes it for a
tensor, and a tape watches it), and to the others as its ``value``, the
backend's array, as Keras's own ``ops.custom_gradient`` does on JAX.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

NAMESPACES = {"tensorflow": "stopgrad_math.tensorflow", "jax": "stopgrad_math.jax", "torch": "stopgrad_math.torch"}


def backend() -> str:
    """The backend Keras runs on."""
    import keras

    return str(keras.backend.backend())


_RESOLVED: dict[str, ModuleType] = {}  # by backend: each namespace imported once


def namespace() -> ModuleType:
    """The stopgrad_math namespace of Keras's backend, imported at its first call and looked up after that (so
    that torch.compile, which traces no import, traces the lookup); NotImplementedError naming a backend it has
    none for."""
    name = backend()
    if name in _RESOLVED:
        return _RESOLVED[name]
    if name not in NAMESPACES:
        raise NotImplementedError(f"stopgrad_math.keras runs on Keras's {', '.join(NAMESPACES)} backends; this Keras "
                                  f"runs on {name!r} (set KERAS_BACKEND to one of them).")
    _RESOLVED[name] = _imported(name)
    return _RESOLVED[name]


def _imported(name: str) -> ModuleType:
    """The namespace imported by import statements, which torch.compile's tracer runs (it skips importlib)."""
    if name == "tensorflow":
        import stopgrad_math.tensorflow as module
    elif name == "jax":
        import stopgrad_math.jax as module  # type: ignore[no-redef]
    else:
        import stopgrad_math.torch as module  # type: ignore[no-redef]
    return module


def values(tree: Any) -> Any:
    """The nest with each keras.Variable its value, where the backend is not TensorFlow."""
    import keras

    if backend() == "tensorflow":
        return tree
    return keras.tree.map_structure(lambda v: v.value if isinstance(v, keras.Variable) else v, tree)
