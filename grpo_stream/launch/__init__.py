"""`grpo-stream up`: start services as processes (locally or through a command prefix such as
ssh or `ip netns exec`), merge and show their logs, watch them, and stop them cleanly."""
