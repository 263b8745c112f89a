"""One simulated pipeline and its parts: training, rollouts, inference ranks and the router,
the engine's modes, the cache lock, the workload and the data plane."""
