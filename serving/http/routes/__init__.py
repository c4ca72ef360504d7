"""The HTTP routes, one APIRouter per concern: v1.py the OpenAI API (/v1/models,
/v1/chat/completions), ops.py health and metrics, page.py the chat page. Handlers reach the
app's ServerContext as `request.app.state.ctx`; serving/http/server.py includes them."""
