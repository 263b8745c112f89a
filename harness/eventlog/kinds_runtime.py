"""Record kinds written by the runtimes that interpret control logic (simulator, gates).

``effect_start`` / ``effect_end`` bracket every effect a pipeline's control logic yields
(see harness/control/effects.py); the invariants in harness/logs/invariants read them, so a
simulator trace and a gate trace are checked by the same code. A gate rank's records carry its ``rank``.
"""

EFFECT_KINDS: dict = {
    "effect_start": {
        "required": {"pipeline_id": "str", "effect": "str", "args": "object"},
        "optional": {"scope": "str", "step": "int?", "cycle": "int?", "gpus": "int_list", "rank": "int"},
        "doc": "A control-logic effect starts; scope = init|step|shrink|expand, cycle = the scheduler cycle of a resize.",
    },
    "effect_end": {
        "required": {"pipeline_id": "str", "effect": "str", "args": "object"},
        "optional": {
            "scope": "str",
            "step": "int?",
            "cycle": "int?",
            "gpus": "int_list",
            "result": "any",
            "error": "str?",
            "rank": "int",
        },
        "doc": "The effect finished (result: its return value, e.g. GPUs granted or ranks refreshed).",
    },
}
