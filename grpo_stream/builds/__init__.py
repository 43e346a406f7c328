"""The models that ship with the project, built from scratch by a script each (`tiny`, `calc`,
`guess`, `judge`, `tools`) and warm-started by `sft`'s supervised loop and shared save step.

`python -m grpo_stream.builds.tiny OUT` rebuilds the default model. No imports here: importing
the package must not import torch or transformers.
"""
