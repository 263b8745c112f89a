"""How a run's log is judged: the oracle over two processes and the baseline files."""
