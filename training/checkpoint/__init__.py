"""Checkpoint storage: saving and loading, the folder layout, the JSON state, the writer's helper process."""
