"""`graft bench` implementations (tools, not library code): engine, serve, grafts, kernels, train."""
