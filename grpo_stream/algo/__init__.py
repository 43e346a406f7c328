"""The regularized GRPO update as pure functions and small stateful helpers.

advantages (rewards -> advantages), logprobs (model -> token log-probs), loss (the clipped
GRPO loss), regularizer (gradient-norm prox and clip), rollback (non-finite step recovery).
Importing this package imports nothing heavy: torch loads with the submodules.
"""
