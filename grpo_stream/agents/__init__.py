"""Agents as user code: an OpenAI-compatible endpoint served by the generator for its
episodes, function calls through the model's chat template, agents in a sandbox.

See `grpo_stream.agents.player` for how a batch is played, `grpo_stream.agents.chat` for how
a conversation becomes token ids, `grpo_stream.agents.toolcalls` for the one parser of
function calls, and `grpo_stream.agents.pool` for where agent code runs.
"""
