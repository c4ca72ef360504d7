"""The engine core: requests and sequences, scheduler, paged KV block manager, model runner,
sampler, outputs. Public names are re-exported by `graft.serving`."""
