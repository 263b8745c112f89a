"""RLix's own scheduler, imported from a user's checkout and driven in simulated time
(docs/rlix-live.md): :mod:`.loader` imports it with the project's stand-ins for Ray,
:mod:`.driver` feeds it the scheduler inputs and runs its cycles, :mod:`.differential`
feeds the same inputs to the model and to it and reports the first cycle they decide
differently."""
