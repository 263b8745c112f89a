"""Streaming single-controller training (NeMo RL's SingleController, docs/modelled-systems.md#nemo-rl-streaming-single-controller).

* ``buffer``: the reserve -> commit -> remove_group rollout buffer with capacity accounting;
* ``samplers``: the ``PromptGroupSampler`` protocol and its four built-ins (+ ``custom``);
* ``split_step``: the split train API's state machine (begin / microbatch / finish / abort);
* ``controller``: the state the train and rollout pumps share, with the setup checks;
* ``apply``: what each pump effect does to that state, and the pumps' handlers.

None of this has a clock or touches a device: the pumps in ``harness.control`` drive it
and both runtimes (the simulator and the real CPU runtime) run the pumps through the
interpreter (``harness.control.interpret``) with ``apply.PumpHandlers``.
"""
