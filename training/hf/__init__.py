"""The Hugging Face bridge: `recipes import` and `recipes export` (weights and LoRA adapters)."""
