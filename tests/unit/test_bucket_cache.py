"""CPU bucket cache: layout, bit-exact round trips, bucket planning and version pointers."""

import threading

import pytest

torch = pytest.importorskip("torch")

from gpu_gates.sync.bucket_cache import (  # noqa: E402
    ALIGNMENT_BYTES,
    BucketRecord,
    VersionedBucketCache,
    build_buckets,
    pack_bucket,
    plan_buckets,
    state_digests,
    tensor_digest,
    unpack_bucket,
)


def _mixed_tensors():
    g = torch.Generator().manual_seed(0)
    return [
        ("bf16.w", torch.randn(7, 5, generator=g).to(torch.bfloat16)),
        ("fp16.w", torch.randn(3, 4, 2, generator=g).to(torch.float16)),
        ("fp32.b", torch.randn(13, generator=g)),
        ("int64.ids", torch.arange(-5, 6, dtype=torch.int64).reshape(1, 11)),
        ("scalar.step", torch.tensor(42, dtype=torch.int64)),
        ("empty", torch.empty(0, 3)),
    ]


def _assert_bit_exact(expected, actual):
    assert [n for n, _ in expected] == [n for n, _ in actual]
    for (name, a), (_, b) in zip(expected, actual):
        assert a.dtype == b.dtype, name
        assert a.shape == b.shape, name
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), name


def test_offsets_are_aligned_and_used_bytes_exclude_trailing_padding():
    tensors = _mixed_tensors()
    rec = pack_bucket(tensors)
    assert all(off % ALIGNMENT_BYTES == 0 for off in rec.offsets)
    assert rec.offsets[0] == 0
    last = rec.nbytes[-1]
    assert rec.used_bytes == rec.offsets[-1] + last
    assert rec.buffer.dtype == torch.uint8 and rec.buffer.dim() == 1
    assert rec.buffer.is_contiguous() and rec.buffer.device.type == "cpu"
    assert rec.buffer.numel() == rec.used_bytes
    assert rec.payload_bytes == sum(t.numel() * t.element_size() for _, t in tensors)
    assert rec.payload_bytes <= rec.used_bytes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int64])
@pytest.mark.parametrize("shape", [(17,), (4, 9), (2, 3, 5), ()])
def test_round_trip_each_dtype_and_shape(dtype, shape):
    base = torch.randn(shape) * 1000 if shape else torch.tensor(3.75)
    tensor = base.to(dtype)
    out = unpack_bucket(pack_bucket([("t", tensor)]))
    _assert_bit_exact([("t", tensor)], out)


def test_round_trip_preserves_nan_payloads_and_negative_zero():
    t = torch.tensor([float("nan"), -0.0, float("inf"), 1e-40], dtype=torch.float32)
    _assert_bit_exact([("t", t)], unpack_bucket(pack_bucket([("t", t)])))


def test_round_trip_many_small_tensors():
    tensors = [(f"p{i}", torch.full((i % 5 + 1,), i, dtype=torch.float16)) for i in range(300)]
    rec = pack_bucket(tensors)
    assert len(rec.offsets) == 300
    assert rec.offsets[-1] == 299 * ALIGNMENT_BYTES
    _assert_bit_exact(tensors, unpack_bucket(rec))


def test_unpacked_tensors_do_not_alias_the_buffer():
    rec = pack_bucket([("t", torch.ones(4))])
    ((name, out),) = unpack_bucket(rec)
    rec.buffer.zero_()
    assert torch.equal(out, torch.ones(4))


def test_non_contiguous_input_is_packed_by_value():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    ((_, out),) = unpack_bucket(pack_bucket([("t", t)]))
    assert torch.equal(out, t)


def test_metadata_round_trip_rebuilds_record():
    rec = pack_bucket(_mixed_tensors())
    clone = BucketRecord.from_metadata(rec.metadata(), rec.buffer.clone())
    _assert_bit_exact(unpack_bucket(rec), unpack_bucket(clone))


def test_duplicate_names_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        pack_bucket([("a", torch.ones(1)), ("a", torch.ones(1))])


def test_plan_buckets_respects_explicit_size():
    tensors = [(f"w{i}", torch.ones(100, dtype=torch.float32)) for i in range(10)]  # 400 B each
    groups = plan_buckets(tensors, bucket_size_bytes=1024)
    # slots at 0 and 512 fit (512 + 400 <= 1024); a third would start at 1024.
    assert [len(g) for g in groups] == [2] * 5
    for group in groups:
        assert pack_bucket(group).used_bytes <= 1024
    flat = [name for g in groups for name, _ in g]
    assert flat == [name for name, _ in tensors]


def test_build_buckets_round_trip_across_buckets():
    tensors = _mixed_tensors() * 1
    buckets = build_buckets(tensors, bucket_size_bytes=600)
    assert len(buckets) > 1
    out = [pair for b in buckets for pair in unpack_bucket(b)]
    _assert_bit_exact(tensors, out)


def test_oversized_tensor_is_a_clear_error():
    with pytest.raises(ValueError, match=r"tensor 'big' needs 4000 bytes.*bucket_size_bytes=1024"):
        plan_buckets([("small", torch.ones(2)), ("big", torch.ones(1000))], bucket_size_bytes=1024)


def test_missing_bucket_size_is_an_error():
    with pytest.raises(TypeError):
        plan_buckets([("a", torch.ones(1))])  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="required"):
        plan_buckets([("a", torch.ones(1))], bucket_size_bytes=None)
    with pytest.raises(ValueError, match="positive"):
        plan_buckets([("a", torch.ones(1))], bucket_size_bytes=0)


def test_digest_sensitive_to_bits_dtype_and_shape():
    a = torch.arange(6, dtype=torch.float16)
    assert tensor_digest(a) == tensor_digest(a.clone())
    assert tensor_digest(a) != tensor_digest(a.reshape(2, 3))
    assert tensor_digest(a) != tensor_digest(a.view(torch.bfloat16))
    b = a.clone()
    b.view(torch.uint8)[3] ^= 1
    assert tensor_digest(a) != tensor_digest(b)
    assert set(state_digests([("x", a), ("y", b)])) == {"x", "y"}


def _cache_with(versions):
    cache = VersionedBucketCache()
    for v in versions:
        cache.build_latest(v, [pack_bucket([("w", torch.full((4,), float(v)))])])
    return cache


def test_version_pointers_and_reading():
    cache = _cache_with([-1])
    assert cache.latest_version == -1 and cache.active_version is None
    assert cache.is_version_built(-1)
    with pytest.raises(RuntimeError, match="promoted"):
        with cache.reading():
            pass
    cache.promote(-1)
    with cache.reading() as buckets:
        ((_, w),) = unpack_bucket(buckets[0])
        assert torch.equal(w, torch.full((4,), -1.0))
    assert cache.active_version == -1


def test_get_active_buckets_requires_lock_and_promote():
    cache = _cache_with([0])
    with pytest.raises(RuntimeError):
        cache.get_active_buckets()


def test_promote_unknown_version_is_key_error():
    cache = _cache_with([0])
    with pytest.raises(KeyError):
        cache.promote(5)


def test_gc_keeps_only_latest_and_active():
    cache = _cache_with([-1])
    cache.promote(-1)
    cache.build_latest(0, [pack_bucket([("w", torch.zeros(4))])])
    cache.build_latest(1, [pack_bucket([("w", torch.zeros(4))])])
    assert cache.versions_held() == [-1, 1]  # active -1 kept, 0 collected
    cache.promote(1)
    assert cache.versions_held() == [1]
    assert not cache.is_version_built(-1)
    cache.build_latest(2, [pack_bucket([("w", torch.zeros(4))])])
    assert cache.versions_held() == [1, 2]
    assert cache.host_bytes() == 2 * 16


def test_versions_must_increase():
    cache = _cache_with([3])
    with pytest.raises(ValueError, match="not newer"):
        cache.build_latest(3, [])
    with pytest.raises(ValueError):
        cache.build_latest(2, [])


def test_build_waits_for_reader():
    cache = _cache_with([0])
    cache.promote(0)
    built = threading.Event()

    def build():
        cache.build_latest(1, [])
        built.set()

    with cache.reading():
        worker = threading.Thread(target=build)
        worker.start()
        assert not built.wait(0.2), "build_latest ran while a reader held the cache"
    worker.join(5)
    assert built.is_set() and cache.latest_version == 1
