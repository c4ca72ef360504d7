"""The fleet surface: what vllm-router and sglang-router ask of a worker (tokenize and
render, server and load info, KV events, the prefill/decode transfer protocol), shared encoder
caches, and `graft fleet`."""
