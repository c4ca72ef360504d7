"""The HTTP layer: OpenAI protocol, FastAPI server, the engine worker thread with admission
control, Prometheus metrics and `graft serve`."""
