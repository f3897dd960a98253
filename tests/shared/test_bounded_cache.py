"""The memo every namespace keeps its proofs, routes and compiled embeddings in: at most ``size`` entries, the least
recently used dropped first (issue 59: a get that did not count as a use made it first in, first out)."""

import threading

from stopgrad_math.shared.bounded_cache import BoundedCache


def test_a_recently_read_entry_survives_where_an_unread_one_is_dropped():
    cache = BoundedCache[str](2)
    cache.put("hot", "a")
    cache.put("cold", "b")
    assert cache.get("hot") == "a"  # read: now the most recently used
    cache.put("new", "c")
    assert "hot" in cache and "new" in cache and "cold" not in cache
    assert len(cache) == 2


def test_a_hot_entry_read_between_every_new_one_is_never_dropped():
    """A signature used at every step beside a stream of new ones: kept throughout, as a least-recently-used
    memo keeps it (first in, first out would drop it every ``size`` new entries)."""
    cache = BoundedCache[int](4)
    cache.put("hot", 0)
    for k in range(100):
        cache.put(k, k)
        assert cache.get("hot") == 0, k
    assert len(cache) == 4


def test_a_put_of_a_present_key_replaces_it_as_the_most_recent():
    cache = BoundedCache[str](2)
    cache.put("a", "1")
    cache.put("b", "2")
    cache.put("a", "3")
    cache.put("c", "4")
    assert cache.get("a") == "3" and cache.get("b") is None and cache.get("c") == "4"


def test_threads_reading_and_putting_at_once_keep_it_bounded_and_raise_nothing():
    cache = BoundedCache[int](8)
    errors = []

    def work(offset):
        try:
            for k in range(2000):
                cache.put((offset, k % 20), k)
                cache.get((offset, (k * 7) % 20))
        except Exception as error:  # any error at all is the failure
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(cache) <= 8
