"""The OpenAI surface: chat and text completions, tools, sampling fields, their answers and /openapi.json."""
