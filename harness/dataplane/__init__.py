"""The data plane: per-sample tensors through a key-value store, metadata through the driver.

- codec.py   schema and jagged codec (strip/re-pad, 1-D promotion, object fields)
- meta.py    KVBatchMeta: ids, fields, lengths, 1:1 tags, disjoint DP shards
- client.py  DataPlaneClient: put_samples / get_samples / clear_samples / close + hop records
- store.py   RowStore interface, InProcessStore, RefuseOverwrite (Mooncake's -601 rule)
- served.py  an InProcessStore shared by several processes (the torchrun gate)
- tq_store.py  TransferQueue (Ray) as the real backend
- worker_mixin.py  replica-leader fetch, two-phase broadcast, leader-only write-back

Reference: docs/modelled-systems.md#nemo-rl-data-plane (NeMo RL ``nemo_rl.data_plane``).
"""
