"""The model written once: the scheduler model, the control logic and its interpreter, the protocols
and the event log's vocabulary (the model core, free of I/O), and in ``harness/logs/`` what reads
and writes event logs."""

__version__ = "0.1.0"
