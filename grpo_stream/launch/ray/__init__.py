"""`grpo-stream up --launcher ray`: each service a Ray actor placed by the fingerprint plan.

- `cluster`: the Ray cluster's nodes and the placement of services onto them;
- `actor`: the actor that runs one service process and streams its log lines back;
- `runner`: `up`'s side, which starts the actors and supervises them.
"""
