"""A stand-in for llama-cpp-python's `python -m llama_cpp.server` (put on PYTHONPATH by the test):
an OpenAI chat endpoint that streams max_tokens one-word deltas, and records its command line
and every request body to the JSON-lines file $FAKE_LLAMA_CPP_LOG."""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = os.environ["FAKE_LLAMA_CPP_LOG"]


def record(entry: dict) -> None:
    with open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "fake-llama"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        record({"body": request})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for _ in range(request["max_tokens"]):
            chunk = {"choices": [{"index": 0, "delta": {"content": " word"}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": 10, "completion_tokens": request["max_tokens"], "total_tokens": 0}
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())


if __name__ == "__main__":
    argv = sys.argv[1:]
    record({"argv": argv})
    ThreadingHTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Handler).serve_forever()
