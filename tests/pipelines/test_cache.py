import threading

from pipelines.cache import LockedLRU


def test_least_recently_used_goes_first_and_a_peek_is_not_a_use():
    cache = LockedLRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    assert cache.peek("b") == 2  # b stays the least recent
    cache.put("c", 3)
    assert "b" not in cache and list(cache) == ["a", "c"]
    assert cache.get("b") is None and cache.peek("b") is None


def test_sizes_are_summed_and_a_value_larger_than_the_cache_is_not_kept():
    cache = LockedLRU(5, getsizeof=len)
    cache.put("x", [0, 0, 0])
    cache.put("y", [0, 0])
    assert cache.currsize == 5
    cache.put("z", [0])
    assert "x" not in cache and cache.currsize == 3
    cache.put("big", [0] * 6)
    assert "big" not in cache and len(cache) == 2


def test_get_or_make_computes_outside_the_lock_once_per_missing_key():
    cache = LockedLRU(8)
    made = []

    def make():
        # the lock is free while making: another thread can read the cache meanwhile
        reader = threading.Thread(target=cache.get, args=("other",))
        reader.start()
        reader.join(timeout=5)
        assert not reader.is_alive()
        made.append(1)
        return "value"

    assert cache.get_or_make("k", make) == "value"
    assert cache.get_or_make("k", make) == "value"
    assert made == [1]
