"""Fault hooks: failures users reported, and breaks of what the oracle checks."""
