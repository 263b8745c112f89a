"""Which pipeline and cluster names a finding's message names (harness/logs/expect.py)."""

from harness.logs.expect import named_in


def test_names_are_found_as_whole_words_only():
    names = ["p0", "p1", "p10", "roll-a"]
    assert named_in("GPU 3 granted to p0_actor_infer while p10/dp1 holds it", names) == ["p0", "p10"]
    assert named_in("xp0 and p1x and roll-ab", names) == []
    assert named_in("roll-a: shrink [0, 1]", names) == ["roll-a"]
    assert named_in("nothing here", names) == []
