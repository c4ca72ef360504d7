"""The server's plumbing: admission by latency budget, API keys, browser guards, uvicorn's request deadlines, metrics, the stats line and the request trace."""
