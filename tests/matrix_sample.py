"""How much of a block-by-mode matrix a run takes: all of it in ``make test``; in the runs on other framework
versions (``make test-oldest``, ``make test-torch-newest``) every k-th block from an offset, where the Makefile
sets ``STOPGRAD_MATRIX_SAMPLE=k:offset``. Those runs look for a version's differences, which a sample of the
blocks meets as well as every block does, and their whole matrices would take CI past its hour."""

import os

_SETTING = os.environ.get("STOPGRAD_MATRIX_SAMPLE", "1:0")
_EVERY, _OFFSET = (int(part) for part in _SETTING.split(":"))


def sample(names) -> list:
    """``names`` in order, every k-th of them (all where no sample is set).

    >>> sample(["a", "b", "c"]) if _EVERY == 1 else None
    ['a', 'b', 'c']
    """
    return list(names)[_OFFSET::_EVERY]
