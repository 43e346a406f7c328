"""The session contract between the hub and every other service.

Hello / Welcome / heartbeat / rejoin / credits, one module for each side:
- `grpo_stream.session.service`: what a service does (`Session`, `run_service`);
- `grpo_stream.session.hub`: what the hub does (`HubSessions`);
- `grpo_stream.session.identity`: what both sides must agree on (the heartbeat identity).

Invariants:
- A service needs only the hub's address, its keys and how long to wait for Welcome
  (`Join`); every other setting, transport included, comes from the first Welcome.
- A service runs one config for its whole life: a later Welcome whose config digest differs
  is refused (the service stops with `EXIT_CONFIG_CHANGED`, which `up` restarts, so the new
  process takes the new config from its own first Welcome).
- A Welcome that answers a Hello after the first means the hub (re)registered the service and
  forgot what it asked for: the session asks for its credit window again, then runs the
  service's rejoin hooks. An unasked Welcome (peers changed) only updates peers.
"""
