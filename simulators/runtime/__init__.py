"""The simulation's engine room: the ordered simpy environment, the scheduler loop and run,
the cluster's ledgers, RLix's timeouts and schedule exploration."""
