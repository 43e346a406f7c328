"""Direct payloads (`hub.payloads = "direct"`): rollouts stay with their generator.

- `store`: a generator's bounded store of the Rollouts it sampled, and the client that
  scorers and the trainer fetch with;
- `refs`: the references (ScoreRef, step refs) the hub hands out instead of payloads;
- `direct`: the hub's side: where each live group's payload is, and what a lost one costs.
"""
