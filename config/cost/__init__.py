"""The cost model: memory per GPU and time per step of a checked config, torch-free."""
