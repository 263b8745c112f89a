"""What every gate shares: the command line, process-group setup, the watchdog, the report,
event recording and the test hooks."""
