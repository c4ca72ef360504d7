"""The HTTP layer: `graft serve`, the FastAPI server and the engine worker thread, grouped by
surface: openai/ (chat, completions, tools, sampling), fleet/ (what routers ask of a worker),
plumbing/ (admission, auth, guards, uvicorn, metrics, logs), routes/ (one APIRouter each)."""
