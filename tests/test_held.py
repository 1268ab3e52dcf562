"""engine/kv/held.py: the switches the engine's forwards read are per thread and nest."""

from __future__ import annotations

import threading

from jumpahead.engine.kv.held import Held


def test_held_nests_and_is_seen_only_by_its_own_thread() -> None:
    held = Held()
    seen: list[bool] = []
    assert not held.on
    with held:
        with held:
            assert held.on
        assert held.on  # the outer hold still stands
        other = threading.Thread(target=lambda: seen.append(held.on))
        other.start()
        other.join()
    assert not held.on and seen == [False]
