"""KVBatchMeta's pure-metadata transforms, after NeMo RL's ``tests/unit/data_plane/
test_kvbatchmeta.py`` (NVIDIA-NeMo/RL @ 7ea279ab): with_fields merges without duplicates
and shares nothing mutable with its source; slice / concat / drop keep rows, lengths and
tags together; the inverse permutation of DP sharding restores batch order. Data and
expectations are this project's own."""

from __future__ import annotations

import random

import pytest

from harness.dataplane.errors import DataPlaneInputError
from harness.dataplane.meta import KVBatchMeta, restore_order


def meta(n=5, fields=("prompt", "reward"), lens=True, extra=None):
    ids = tuple(f"s{i}" for i in range(n))
    return KVBatchMeta(
        "train",
        ids,
        tuple(fields),
        tuple(10 * (i + 1) for i in range(n)) if lens else None,
        tuple({"row": i, "std": i / 10} for i in range(n)),
        dict(extra or {"step": 3}),
    )


def test_with_fields_merges_in_order_without_duplicates():
    m = meta(fields=("prompt", "reward"))
    assert m.with_fields(["reward", "logprob", "logprob", "adv"]).fields == ("prompt", "reward", "logprob", "adv")
    assert m.with_fields([]).fields == ("prompt", "reward")
    assert KVBatchMeta("p", ("a",), (), None, ({},)).with_fields(["x", "y", "x"]).fields == ("x", "y")
    with pytest.raises(DataPlaneInputError, match="with_fields: must be a list"):
        m.with_fields("logprob")


def test_with_fields_copy_shares_no_mutable_state_with_its_source():
    m = meta()
    out = m.with_fields(["logprob"])
    out.extra_info["step"] = 99
    out.tags[0]["std"] = -1.0
    out.tags[1]["new"] = True
    assert m.extra_info == {"step": 3}
    assert m.tags[0] == {"row": 0, "std": 0.0} and m.tags[1] == {"row": 1, "std": 0.1}
    assert out.sample_ids == m.sample_ids and out.sequence_lengths == m.sequence_lengths


@pytest.mark.parametrize(
    "op",
    [
        lambda m: m.subset([2, 0]),
        lambda m: m.slice(1, 3),
        lambda m: m.drop([0]),
        lambda m: m.concat(),
        lambda m: m.shard_for_dp(2)[0],
    ],
)
def test_every_derived_meta_owns_its_dicts(op):
    m = meta()
    out = op(m)
    out.extra_info["x"] = 1
    for t in out.tags:
        t["row"] = -1
    assert "x" not in m.extra_info and [t["row"] for t in m.tags] == [0, 1, 2, 3, 4]


def test_slice_keeps_rows_lengths_and_tags_together():
    m = meta()
    s = m.slice(1, 3)
    assert s.sample_ids == ("s1", "s2") and s.sequence_lengths == (20, 30)
    assert [t["row"] for t in s.tags] == [1, 2] and s.fields == m.fields and s.partition_id == "train"
    assert m.slice(3, 99).sample_ids == ("s3", "s4")
    assert len(m.slice(4, 2)) == 0


def test_concat_rejoins_slices_and_refuses_mixed_partitions_and_repeated_ids():
    m = meta()
    joined = m.slice(0, 2).concat(m.slice(2, 4), m.slice(4, 5))
    assert joined.sample_ids == m.sample_ids and joined.sequence_lengths == m.sequence_lengths
    assert joined.tags == m.tags and joined.extra_info == m.extra_info
    no_lens = KVBatchMeta("train", ("x",), ("prompt",), None, ({"row": 9},))
    mixed = m.slice(0, 1).concat(no_lens)
    assert mixed.sample_ids == ("s0", "x") and mixed.sequence_lengths is None  # dropped unless every part has them
    assert [t["row"] for t in mixed.tags] == [0, 9]
    with pytest.raises(DataPlaneInputError, match="partition 'val' differs from 'train'"):
        m.concat(KVBatchMeta("val", ("v",), (), None, ({},)))
    with pytest.raises(DataPlaneInputError, match="duplicate ids"):
        m.slice(0, 2).concat(m.slice(1, 3))


def test_drop_is_the_complement_of_subset():
    m = meta()
    out = m.drop([3, 1, 1])
    assert out.sample_ids == ("s0", "s2", "s4") and out.sequence_lengths == (10, 30, 50)
    assert [t["row"] for t in out.tags] == [0, 2, 4]
    same = m.drop([])
    assert same == m and same is not m
    assert m.drop([4, 0, 1, 2, 3]) is None
    with pytest.raises(DataPlaneInputError, match="drop indices: 5 is not a row index of a 5-row batch"):
        m.drop([5])
    with pytest.raises(DataPlaneInputError, match="subset indices: -1 is not a row index"):
        m.subset([-1])


@pytest.mark.parametrize("seed", range(6))
def test_the_inverse_permutation_puts_dp_outputs_back_in_batch_order(seed):
    rng = random.Random(seed)
    n, dp = rng.randint(1, 17), rng.randint(1, 5)
    ids = tuple(f"u{rng.randrange(10**6)}-{i}" for i in range(n))
    lens = tuple(rng.randint(1, 400) for _ in range(n))
    m = KVBatchMeta("train", ids, ("x",), lens, tuple({} for _ in range(n)))
    shards, inverse = m.shard_for_dp_with_inverse(dp)
    # each rank "computes" an output per row; outputs are joined in rank order
    joined = [(sid, f"out-{sid}") for shard in shards for sid in shard.sample_ids]
    assert [sid for sid, _ in restore_order(joined, inverse)] == list(ids)
    if inverse is not None:  # not the identity, and a permutation of the rows
        assert inverse != list(range(n)) and sorted(inverse) == list(range(n))
        assert [joined[inverse[i]][0] for i in range(n)] == list(ids)
    else:
        assert [sid for sid, _ in joined] == list(ids)


def test_inverse_is_none_when_sharding_keeps_order_and_a_bad_inverse_is_refused():
    m = KVBatchMeta("train", ("a", "b"), (), (5, 5), ({}, {}))
    shards, inverse = m.shard_for_dp_with_inverse(1)
    assert inverse is None and shards[0].sample_ids == ("a", "b")
    lopsided = KVBatchMeta("train", ("a", "b", "c"), (), (1, 1, 9), ({}, {}, {}))
    shards, inverse = lopsided.shard_for_dp_with_inverse(2)
    assert [s.sample_ids for s in shards] == [("c",), ("a", "b")] and inverse == [1, 2, 0]
    with pytest.raises(DataPlaneInputError, match="not a permutation"):
        restore_order(["x", "y"], [0, 0])


def test_a_meta_survives_pickle_and_json_and_defaults_are_not_shared():
    import pickle

    m = meta()
    assert pickle.loads(pickle.dumps(m)) == m  # Ray hands metas to actors by pickling them
    assert KVBatchMeta.from_json(m.to_json()) == m  # the wire form the driver sends to workers
    a = KVBatchMeta("p", ("x",), (), None, ({},))
    b = KVBatchMeta("p", ("y",), (), None, ({},))
    a.extra_info["k"] = 1
    assert b.extra_info == {}
    assert len(KVBatchMeta("p", (), (), None, ())) == 0  # an empty meta is a value (an empty claim, an idle rank)
