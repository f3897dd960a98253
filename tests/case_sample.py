"""Which parametrized cases a sampled run keeps (``STOPGRAD_CASE_SAMPLE=k:offset``, read by conftest.py).

make test runs every case. The runs on other framework versions (make test-oldest, make test-torch-newest) look
for a version's differences, which a sample of each test's cases meets as well as all of them do: every k-th case
of each test function, from the offset (wrapped round a test with fewer cases), so that every test function keeps
at least one, and two targets with different offsets take different cases.
"""

from __future__ import annotations

ENVIRONMENT = "STOPGRAD_CASE_SAMPLE"


def parsed(setting: str | None) -> tuple[int, int]:
    """``"k:offset"`` as (k, offset); unset is every case, (1, 0). ValueError for anything else."""
    every, _, offset = (setting or "1:0").partition(":")
    if not every.isdigit() or not offset.isdigit() or int(every) < 1:
        raise ValueError(f"{ENVIRONMENT} is 'k:offset' with whole numbers, k at least 1; got {setting!r}")
    return int(every), int(offset)


def kept(node_ids: list[str], every: int, offset: int) -> list[bool]:
    """For each test id, in order, whether the sample keeps it: ids that differ only in their parameters
    (``[...]``) are one test's cases, and of each test every ``every``-th case is kept from ``offset``."""
    cases: dict[str, list[int]] = {}
    for position, node_id in enumerate(node_ids):
        cases.setdefault(node_id.partition("[")[0], []).append(position)
    chosen = {position for group in cases.values() for position in group[offset % len(group)::every]}
    return [position in chosen for position in range(len(node_ids))]
