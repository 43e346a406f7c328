"""The vLLM engine: the production generator (`generator.engine = "vllm"`).

- `engine`: `VLLMEngine`, one `vllm.LLM`/`AsyncLLM` behind the `Engine` interface;
- `loop`: the asynchronous request loop that keeps the engine full across PromptBatches;
- `update`: weight updates through vLLM's RL API (pause, load, resume);
- `weights`, `worker`, `plugin`: what runs inside vLLM's worker processes (the weight-transfer
  backend registered by the `vllm.general_plugins` entry point);
- `compat`: the one place that knows the differences between vLLM versions.

Importing this package imports no vLLM; the modules import it where an engine starts.
"""
