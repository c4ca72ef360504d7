"""The serving engine: paged KV cache, scheduler, model runner, OpenAI-compatible server."""
