"""Exit codes that tell `up` what a service's end means (0: done, or asked to stop)."""

EXIT_ABORTED = 3
"""The hub stopped a run that cannot make progress (say, a reward that always fails):
restarting cannot help, so `up` fails at once with the hub's reason."""
EXIT_HUB_GONE = 75
"""A service lost its hub before the run ended: not a clean end; `up` restarts it."""
EXIT_CONFIG_CHANGED = 76
"""The hub came back with another config than the one the service runs (a later Welcome's
digest differs): the service refuses it and stops; `up` restarts it, and the new process takes
the new config from its first Welcome."""
EXIT_ENGINE_FAILED = 77
"""A generator's inference engine cannot go on (vLLM's engine core or a worker was killed, or
a version failed to load twice): the generator says so and exits; `up` restarts it while
`run.restarts` lasts."""
