"""Set-up every test process shares: two logical CPUs once TensorFlow is imported, the hypothesis profile, the
sampled runs, the mutants. Each namespace's folder has its own fixtures and helpers beside its tests."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Inductor compiles in the process that asks, not in a pool of compile workers (set before PyTorch is imported; the
# tests' own subprocesses inherit it). On a machine with more cores than this one the pool is started, and its
# shutdown at a process's exit is known to wait or hang (pytorch/pytorch#162199, fixed after torch 2.6): stop
# 67's CI ran past its 90 minutes at the end of make test-oldest, every test passed and the run not ended.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import case_sample
import logical_cpus  # noqa: F401  (two logical CPUs, as TensorFlow is imported)
from hypothesis import HealthCheck, settings

settings.register_profile(
    "project",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# make test runs every case; the runs on other framework versions a sample of each file's test functions and of
# their cases (case_sample.py), and a k-th of hypothesis's examples (at least 10).
_EVERY, _OFFSET, _EVERY_FUNCTION = case_sample.parsed(os.environ.get(case_sample.ENVIRONMENT))
settings.register_profile("sampled", parent=settings.get_profile("project"), max_examples=max(40 // _EVERY, 10))
settings.load_profile("project" if _EVERY == 1 else "sampled")


def pytest_collection_modifyitems(config, items) -> None:
    if _EVERY == _EVERY_FUNCTION == 1:
        return
    keep = case_sample.kept([item.nodeid for item in items], _EVERY, _OFFSET, _EVERY_FUNCTION)
    config.hook.pytest_deselected(items=[item for item, k in zip(items, keep, strict=True) if not k])
    items[:] = [item for item, k in zip(items, keep, strict=True) if k]


if os.environ.get("STOPGRAD_MUTANT"):  # make test-mutants: one deliberately broken variant (tests/project/mutants.py)
    import mutants

    mutants.apply_the_one_named()
