"""Where user code runs: worker processes forked from multiprocessing's fork server, each with
the parent's `sys.path`, an address-space cap and a pipe of msgpack messages, started,
replaced and stopped by one lifecycle (`pool.WorkerPool`) for rewards, environments and agents.

`worker` is the child's side (`serve`: load the user code, then answer messages), `pool` the
parent's. What a message means is each sandbox's own: `grpo_stream.rewards.sandbox`,
`grpo_stream.envs.sandbox`, `grpo_stream.agents.pool`.
"""
