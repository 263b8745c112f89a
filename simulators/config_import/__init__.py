"""A user's own RL configuration in, a scenario out (docs/importers.md).

``nemo_rl`` reads NeMo RL's GRPO YAMLs (``defaults:`` inheritance and Hydra-style
overrides, as NeMo RL's own loader applies them), ``roll`` ROLL's RLVR and agentic
pipeline YAMLs, ``rlix_pipelines`` RLix's per-pipeline YAMLs (each wrapping a NeMo RL or
ROLL config) into one multi-pipeline scenario. Each writes a scenario whose every field
carries, as a comment, the config key it came from (:mod:`.draft`), and refuses with
:class:`.common.ConfigRefused` — naming the key — what the scenario format cannot
represent.
"""
