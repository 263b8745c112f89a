"""Everything that reads or writes an event log: the invariant oracle, the outputs, replay,
the importers, the log's file format. Unlike the model core around it, this may touch files."""
