"""Which of TFP's public functions, distribution methods and bijector methods go through a custom gradient, read
from TFP's installed source (no list kept by hand: a function TFP adds is found the day it is installed).

A *custom-gradient function* is one decorated by TFP's factory
(``tensorflow_probability.python.internal.custom_gradient``), or one that calls ``tfp.math.custom_gradient``
(the identity form), in a module of ``tensorflow_probability/python`` that is not a test, a substrate or a
backend. A public name *reaches* one where its body refers to it, or to a name that reaches one: within its
module by name, across modules by the public name it is imported under (``tfp_math.betainc``). Classes count by
their methods; a distribution's ``_log_prob`` is reached through ``log_prob``, as ``Distribution`` dispatches.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import tensorflow_probability

ROOT = pathlib.Path(tensorflow_probability.__file__).parent / "python"
_FACTORY = "tensorflow_probability.python.internal"
_SKIPPED_DIRS = {"backend", "substrates", "testing"}
# Distribution and Bijector dispatch a public method to its private twin; a distribution's cdf and log_prob
# also stand behind the public methods it derives from them (log_cdf = log(cdf) where _log_cdf is not defined).
PUBLIC_METHODS = {f"_{name}": (name,) for name in (
    "quantile", "mean", "variance", "stddev", "mode", "entropy", "forward", "inverse", "forward_log_det_jacobian",
    "inverse_log_det_jacobian")}
PUBLIC_METHODS |= {
    "_log_prob": ("log_prob", "prob"), "_prob": ("prob", "log_prob"),
    "_cdf": ("cdf", "log_cdf", "survival_function", "log_survival_function"), "_log_cdf": ("log_cdf", "cdf"),
    "_survival_function": ("survival_function", "log_survival_function"),
    "_log_survival_function": ("log_survival_function", "survival_function"), "_sample_n": ("sample",),
}


@dataclasses.dataclass(frozen=True)
class Entry:
    """A public name that reaches a custom gradient: ``module:name`` for a function, ``module:Class.method`` for
    a method; ``through`` names the custom-gradient functions it reaches."""

    module: str
    name: str
    method: str | None
    through: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.module.removeprefix('tensorflow_probability.python.')}:{self.name}" + (
            f".{self.method}" if self.method else "")


def _modules() -> dict[str, ast.Module]:
    trees = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if path.name.endswith("_test.py") or _SKIPPED_DIRS & set(relative.parts[:-1]):
            continue
        name = "tensorflow_probability.python." + ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        trees[name] = ast.parse(path.read_text(), str(path))
    return trees


def _factory_aliases(tree: ast.Module) -> set[str]:
    """The names a module binds TFP's custom-gradient factory to."""
    return {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module == _FACTORY for alias in node.names if alias.name == "custom_gradient"}


def _is_custom_gradient_definition(node: ast.AST, aliases: set[str]) -> bool:
    """A function decorated by the factory, or one whose body calls the identity form ``….custom_gradient(fx,
    gx, x)`` (a call with positional arguments; the factory is called with keywords)."""
    if not isinstance(node, ast.FunctionDef):
        return False
    for decorator in node.decorator_list:
        call = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(call, ast.Attribute) and call.attr == "custom_gradient" and \
                isinstance(call.value, ast.Name) and call.value.id in aliases:
            return True
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "custom_gradient"
               and isinstance(n.func.value, ast.Name) and n.func.value.id not in aliases and len(n.args) >= 2
               for n in ast.walk(node))


Key = tuple[str, str, "str | None"]  # module, function or class, method


def _aliases(tree: ast.Module, modules: set[str]) -> dict[str, tuple[str, str | None]]:
    """What each imported name of a module stands for: (a module, None) or (a module, a name in it)."""
    bound: dict[str, tuple[str, str | None]] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    bound[alias.asname] = (alias.name, None)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                bound[alias.asname or alias.name] = (full, None) if full in modules else (node.module, alias.name)
    return bound


def _targets(module: str, owner: str | None, node: ast.AST, aliases: dict[str, tuple[str, str | None]],
             definitions: set[Key]) -> set[Key]:
    """The definitions a body refers to: local functions, imported ones, ``module.name`` and ``self.method``."""
    found: set[Key] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            if (module, n.id, None) in definitions:
                found.add((module, n.id, None))
            elif n.id in aliases and aliases[n.id][1] is not None:
                found.add((aliases[n.id][0], aliases[n.id][1], None))  # type: ignore[arg-type]
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            if n.value.id in ("self", "cls") and owner is not None:
                found.add((module, owner, n.attr))
            elif n.value.id in aliases and aliases[n.value.id][1] is None:
                found.add((aliases[n.value.id][0], n.attr, None))
    return found


def _definitions(tree: ast.Module) -> dict[tuple[str, str | None], ast.AST]:
    """Module-level functions as (name, None) and class methods as (class, method)."""
    found: dict[tuple[str, str | None], ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[(node.name, None)] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found[(node.name, item.name)] = item
    return found


def _edges(trees: dict[str, ast.Module], nodes: dict[Key, ast.AST]) -> dict[Key, set[Key]]:
    """For each definition, the definitions its body refers to, a package's re-exports followed to the
    definition (tfp.math.betainc is math.special.betainc)."""
    modules = set(trees)
    aliases = {module: _aliases(tree, modules) for module, tree in trees.items()}
    exported = {(package, name): target for package, bound in aliases.items()
                for name, target in bound.items() if target[1] is not None}

    def resolve(key: Key) -> Key:
        for _ in range(4):  # a name re-exported through a few packages
            if key in nodes or key[2] is not None or (key[0], key[1]) not in exported:
                return key
            module, name = exported[(key[0], key[1])]
            key = (module, name, None)  # type: ignore[assignment]
        return key

    defined = set(nodes)
    return {key: {resolve(t) for t in _targets(key[0], key[1] if key[2] else None, node, aliases[key[0]], defined)}
            for key, node in nodes.items()}


def _propagated(reaches: dict[Key, set[str]], edges: dict[Key, set[Key]]) -> dict[Key, set[str]]:
    """To a fixed point: a definition reaches what the definitions it refers to reach."""
    dependents: dict[Key, set[Key]] = {}
    for key, targets in edges.items():
        for target in targets:
            dependents.setdefault(target, set()).add(key)
    work = list(reaches)
    while work:
        target = work.pop()
        for key in dependents.get(target, ()):
            new = reaches[target] - reaches.get(key, set())
            if new:
                reaches[key] = reaches.get(key, set()) | new
                work.append(key)
    return reaches


def entries() -> list[Entry]:
    """Every public function and method that reaches a custom-gradient function, sorted by id."""
    trees = _modules()
    nodes = {(module, *key): node for module, tree in trees.items() for key, node in _definitions(tree).items()}
    factories = {module: _factory_aliases(tree) for module, tree in trees.items()}
    defining = {key: {f"{key[0].rsplit('.', 1)[-1]}.{key[1]}"} for key, node in nodes.items()
                if _is_custom_gradient_definition(node, factories[key[0]])}
    found = set()
    for (module, name, method), through in _propagated(defining, _edges(trees, nodes)).items():
        if name.startswith("_") or ".internal" in module:
            continue  # private, or TFP's internal modules (reached through the public names that call them)
        publics = (method,) if method is None or not method.startswith("_") else PUBLIC_METHODS.get(method, ())
        found |= {Entry(module, name, public, tuple(sorted(through))) for public in publics}
    return sorted(found, key=lambda e: e.id)
