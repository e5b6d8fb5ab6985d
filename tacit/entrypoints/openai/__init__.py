"""OpenAI-compatible HTTP server: protocol (pydantic), serving (per endpoint), api_server (app)."""
