"""Checkpointing: plans (schedules/, pure) and the levels that hold snapshots (storage/)."""
