"""Speculative decoding without a draft model: proposers guess the next tokens, the engine
verifies them in one multi-token step (see docs/engine.md, "Speculative decoding")."""
