"""Vision encoders behind one interface (preprocess, encode, num_tokens, hidden_size)."""
