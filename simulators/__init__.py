"""The simpy runtime: interprets the harness's control logic in simulated time.

The discrete-event simulator is the next milestone (issue "Discrete-event simulator");
until it lands this package holds nothing, and the main job is scheduler-trace replay.
"""
