"""The hub's library: group ledger, leases and the staleness gate, replay buffer, checkpoints.

The grouper service (`grpo_stream.services.grouper`) is a thin loop over these.
"""
