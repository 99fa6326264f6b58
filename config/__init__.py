"""The torch-free floor of the project: the config schema and everything derived from it.

`schema` (the dataclasses), `tree` (YAML/dict round trips and dotlist overrides), `finalize` and
`layout` (derived values), `rules` (the checker, one module per section, and `derive`: every
derived value of a config it accepts), `estimate` (memory and FLOPs), `precision` (presets),
`hardware` (GPU kinds) and `registry` (data kinds and model architectures). Nothing here imports
torch, Megatron-Core or NeMo-Run, nor any other package of the project: models, data, the engine,
launchers and recipes all build on it.
"""
