"""The Hugging Face bridge: one mapping module per family (config.registry.HF_FAMILIES).

Each module declares, without torch, `to_model`, `to_hf`, `matches` and `weights` (see
config.registry.HfFamily); models/hf/mapping.py turns a declaration into reads and splits of
tensors, models/hf/safetensors_io.py reads and writes the files.
"""
