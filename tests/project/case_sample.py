"""Which tests a sampled run keeps (``STOPGRAD_CASE_SAMPLE=k:offset`` or ``k:offset:m``, read by conftest.py).

make test runs every case. The runs on other framework versions (make test-oldest, make test-torch-newest) look
for a version's differences: an API that moved, an op that changed. A sample meets those as well as the whole
suite does, at a fraction of CI's hour: of each test file every m-th test function (all of them unless m is
given), and of each such function every k-th parametrized case, each from the offset (wrapped round a file or a
test with fewer), so that every file keeps a test function and every kept function a case, and two targets with
different offsets take different functions and cases.
"""

from __future__ import annotations

ENVIRONMENT = "STOPGRAD_CASE_SAMPLE"


def parsed(setting: str | None) -> tuple[int, int, int]:
    """``"k:offset"`` or ``"k:offset:m"`` as (k, offset, m), m 1 where not given; unset is every test, (1, 0, 1).
    ValueError for anything else."""
    parts = (setting or "1:0").split(":")
    if len(parts) == 2:
        parts.append("1")
    if len(parts) != 3 or not all(part.isdigit() for part in parts) or int(parts[0]) < 1 or int(parts[2]) < 1:
        raise ValueError(f"{ENVIRONMENT} is 'k:offset' or 'k:offset:m' with whole numbers, k and m at least 1; "
                         f"got {setting!r}")
    every, offset, every_function = (int(part) for part in parts)
    return every, offset, every_function


def _groups(keys: list[str]) -> dict[str, list[int]]:
    """Positions by key, in order."""
    groups: dict[str, list[int]] = {}
    for position, key in enumerate(keys):
        groups.setdefault(key, []).append(position)
    return groups


def _sampled(group: list[int], step: int, offset: int) -> list[int]:
    """Every ``step``-th of the group from ``offset`` (wrapped round it); the whole group where step is 1."""
    return group[offset % len(group)::step] if step > 1 else group


def kept(node_ids: list[str], every: int, offset: int, every_function: int = 1) -> list[bool]:
    """For each test id, in order, whether the sample keeps it: ids that differ only in their parameters
    (``[...]``) are one test function's cases, and functions of one file (before the first ``::``) one file's.
    Of each file every ``every_function``-th function is kept from ``offset``, and of each kept function every
    ``every``-th case from ``offset``."""
    functions = [node_id.partition("[")[0] for node_id in node_ids]
    named = list(dict.fromkeys(functions))
    files = _groups([function.partition("::")[0] for function in named])
    chosen_functions = {named[index] for group in files.values() for index in _sampled(group, every_function, offset)}
    chosen = {position for function, group in _groups(functions).items() if function in chosen_functions
              for position in _sampled(group, every, offset)}
    return [position in chosen for position in range(len(node_ids))]
