"""The data plane's real side: the client, the codec, the digests and the in-process store
(torch tensors and threads), behind the contract in ``harness/dataplane``."""
