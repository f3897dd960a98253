"""A module apart from the tests that use it, whose functions read globals of its own by names the tests' modules
also define (issue 59): a reader of f's globals must never read the test module's value for one of these."""

import torch

GLOBAL_VALUE = object()  # test_outside_reads.py has a GLOBAL_VALUE of its own
WEIGHT = torch.tensor([-2.0, 0.5, 3.0, 1.0], dtype=torch.float64)  # as tests/torch/test_vjp_as_backward.py has a WEIGHT


def global_value():
    return GLOBAL_VALUE


def scaled_by_weight(ct):
    return ct * WEIGHT
