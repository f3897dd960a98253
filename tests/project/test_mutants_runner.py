"""make test-mutants' runner (mutants.py): a run is a catch only where the mutant's tests fail; a mutant whose
tests pass, a run that finds no tests, and a run past its time limit each fail the whole run. The runner runs
in a subprocess, as make test-mutants runs it: it forks, which a test process that may have started
TensorFlow must not."""

import os
import pathlib
import re
import subprocess
import sys

TESTS = pathlib.Path(__file__).parent

REAL = "the bounded cache forgets which entry was used last"
# Variants of one real mutant (the bounded cache's, whose tests are fast and use no framework, so the runner
# imports none before forking): as it is (caught), its function left unchanged (its tests pass: it survives),
# pointed at a test that does not exist.
PROGRAM = f"""
import dataclasses, sys
import mutants
real = mutants.MUTANTS[{REAL!r}]
mutants.MUTANTS["unchanged"] = dataclasses.replace(real, broken=lambda original: original)
mutants.MUTANTS["no such test"] = dataclasses.replace(
    real, caught_by=("tests/shared/test_bounded_cache.py::no_such_test",))
mutants.TIMEOUT_SECONDS = float(sys.argv[2])
mutants._IMPORTED_BEFORE_FORKING = ()
sys.exit(mutants.main(sys.argv[1].split(",")))
"""
# A line of the runner's output: its outcome and its mutant.
OUTCOME = re.compile(r"\s*(caught|SURVIVED|BROKEN)\S*(?: \(-?\d+\))?\s+\d+ s  (.+?)  \(")


def _run(names: list[str], timeout_seconds: float = 300) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != "STOPGRAD_MUTANT"}
    return subprocess.run([sys.executable, "-c", PROGRAM, ",".join(names), str(timeout_seconds)],
                          cwd=TESTS.parents[1], env={**environment, "PYTHONPATH": str(TESTS)}, capture_output=True,
                          text=True, timeout=600, check=False)


def test_a_caught_mutant_passes():
    caught = _run([REAL])
    assert caught.returncode == 0, caught.stdout[-3000:]
    assert caught.stdout.split()[0] == "caught"


def test_a_surviving_mutant_or_a_run_that_finds_no_test_fails_the_run():
    run = _run([REAL, "unchanged", "no such test"])
    assert run.returncode == 1, run.stdout[-3000:]
    outcomes = dict(reversed(found.groups()) for found in map(OUTCOME.match, run.stdout.splitlines()) if found)
    assert outcomes == {REAL: "caught", "unchanged": "SURVIVED", "no such test": "BROKEN"}, run.stdout[-3000:]


def test_a_run_past_its_time_limit_is_killed_and_fails_the_run():
    overdue = _run([REAL], timeout_seconds=0)
    assert overdue.returncode == 1 and "BROKEN (-9)" in overdue.stdout, overdue.stdout[-3000:]
