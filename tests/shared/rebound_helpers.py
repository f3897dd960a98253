"""A user's module of helpers, read by the tests' VJPs through its attribute (``rebound_helpers.scale(ct)``), whose
global a test rebinds between calls: a kept proof must read it as it is at each call."""

FACTOR = 2.0


def scale(ct):
    return ct * FACTOR
