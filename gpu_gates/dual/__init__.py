"""The dual-pipeline gate's parts: its driver, the effects' real calls, the workers, the
scripted workload and its exploration delays."""
