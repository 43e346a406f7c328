"""Multi-turn environments: episodes in which the policy and an environment take turns.

See `grpo_stream.envs.base` for the interface, `grpo_stream.envs.episodes` for how an
episode becomes a token-exact trajectory, and `grpo_stream.envs.sandbox` for where
environment code runs.
"""
