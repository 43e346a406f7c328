"""Models: `loading` (resolve_model, load_tokenizer, load_policy, the device and dtype a model
runs with), `adapter` (LoRA adapters: manifests, fingerprints, peft configs) and `testing`
(tiny configs for tests). The shipped models are built in `grpo_stream.builds`.

No imports here: importing the package must not import torch or transformers.
"""
