"""Trainable projectors from encoder features to LLM embeddings."""
