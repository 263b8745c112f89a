"""The real transports: everything that moves bytes between processes or reads the clock.

``harness/`` defines protocols and contracts and must stay clock- and I/O-free (both the
simulator and the gates interpret it; tests/unit/test_layering.py enforces that). What
actually crosses a process boundary lives here, on the real-runtime side:

- zmq_stream.py    the refit stream protocol (harness/refit/stream.py) over pyzmq REQ/REP: the
                   one import of its users, over zmq_endpoint.py (the socket end both sides
                   share), zmq_sender.py (trainer side) and zmq_receiver.py (inference side)
- staging.py       its staging buffers: /dev/shm files on CPU, CUDA IPC handles on GPU
- private_dirs.py  per-run private folders for socket and staging files, and their cleanup
- measure.py       the transport measured on this machine (``rlharness calibrate refit``)
- served_store.py  an in-process row store served to other processes (multiprocessing manager)
- tq_store.py      TransferQueue on Ray as the real row-store backend
- worker_mixin.py  the data plane's worker side: replica-leader fetch over torch.distributed

The simulator never imports this package (it models these transports' costs instead);
``rlharness/`` may (``calibrate refit`` measures the real stream). Import the submodule you
need: importing the package pulls in nothing.
"""
