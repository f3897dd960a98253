"""The package's declared dependencies: `make test-oldest` pins exactly the oldest versions setup.cfg allows."""

import configparser
import pathlib

from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _lower_bounds() -> dict[str, str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    requirements = [Requirement(line) for line in config["options"]["install_requires"].split("\n") if line.strip()]
    return {r.name: s.version for r in requirements for s in r.specifier if s.operator == ">="}


def _oldest_pins() -> dict[str, str]:
    lines = (ROOT / ".ci" / "oldest.txt").read_text().splitlines()
    pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {r.name: next(iter(r.specifier)).version for r in pins}


def test_the_oldest_environment_pins_every_lower_bound():
    lower = _lower_bounds()
    assert set(lower) == {"tensorflow", "tensorflow-probability", "tf-keras", "numpy"}
    pins = _oldest_pins()
    for name, version in lower.items():
        assert pins[name].startswith(version), (name, pins[name], version)
