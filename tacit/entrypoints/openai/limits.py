"""Server limits that the CLI needs without importing the server (fastapi is an extra)."""

# Default cap on a request body: 16 MiB holds a prompt far beyond any context tacit serves
# (the default model's 8k tokens are ~40 KB of text) while a 52 MB body once took 31-43 s to
# refuse and left the server's RSS 3.6 GB larger. `tacit serve --max-request-bytes` sets it.
DEFAULT_MAX_REQUEST_BYTES = 16 << 20
