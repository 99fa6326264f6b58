"""The torch-free floor of the project: the config schema and everything derived from it.

`schema` (the dataclasses), `tree` (YAML/dict round trips and dotlist overrides), `finalize` and
`layout` (derived values), `paths` (the run directory and the checkpoint folder), `rules` (the
checker, one module per section, and `derive`: every derived value of a config it accepts),
`cost` (memory, FLOPs and time per step), `precision` (presets), `hardware` (GPU kinds) and
`registry` (data kinds, model architectures, Hugging Face families). Nothing here imports
torch, Megatron-Core or NeMo-Run, nor any other package of the project: models, data, the engine,
launchers and recipes all build on it.
"""
