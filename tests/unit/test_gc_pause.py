"""simulators.runtime.gc_pause: no collection inside; survivors in the oldest generation after."""

import gc

from simulators.runtime.gc_pause import gc_paused


def test_survivors_are_promoted_and_collection_is_back_on():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        kept = [[i] for i in range(50_000)]  # tracked containers, allocated young
        with gc_paused():  # nested: still off after the inner one
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    young = {id(o) for o in gc.get_objects(generation=0)} | {id(o) for o in gc.get_objects(generation=1)}
    assert not any(id(x) in young for x in kept[::997])
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(x) in oldest for x in kept[::997])


def test_garbage_made_while_paused_is_still_collected():
    class Node:
        pass

    with gc_paused():
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the cyclic collector frees it
        del a, b
    assert gc.collect() >= 2


def test_left_off_when_it_was_off():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_program_entry_leaves_its_heap_out_of_the_final_collection(monkeypatch):
    from rlharness import cli

    monkeypatch.setattr(cli, "main", lambda: 7)
    try:
        assert cli.run() == 7
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
