"""Weight sync in simulated time: the refit timing model, the sync groups' creation, and the
refit costs fitted to a machine."""
