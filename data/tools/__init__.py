"""Offline data tools (`recipes data ...`, `python -m data.tools.<name>`): run before training, never on the ranks."""
