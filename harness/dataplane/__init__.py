"""The data plane: per-sample tensors through a key-value store, metadata through the driver.

- codec.py   schema and jagged codec (strip/re-pad, 1-D promotion, object fields)
- meta.py    KVBatchMeta: ids, fields, lengths, 1:1 tags, disjoint DP shards
- client.py  DataPlaneClient: put_samples / get_samples / clear_samples / close + hop records
- store.py   RowStore interface, InProcessStore, RefuseOverwrite (Mooncake's -601 rule)

What crosses a process boundary lives on the real-runtime side, in gpu_gates/transports/:
served_store.py (an InProcessStore served to the torchrun gate's ranks), tq_store.py
(TransferQueue on Ray, the real backend) and worker_mixin.py (replica-leader fetch, two-phase
broadcast over torch.distributed, leader-only write-back). ``harness/`` stays I/O-free.

Reference: docs/modelled-systems.md#nemo-rl-data-plane (NeMo RL ``nemo_rl.data_plane``).
"""
