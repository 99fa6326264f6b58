"""Resilience: exit signals and time limits, the hang watchdog, straggler detection, in-process restart."""
