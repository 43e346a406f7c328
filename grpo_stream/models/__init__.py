"""Models: `loading` (resolve_model, load_tokenizer, load_policy) and `build_tiny`.

No imports here: importing the package must not import torch or transformers.
"""
