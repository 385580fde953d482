"""A stand-in for the Hugging Face hub on 127.0.0.1, for genuine `hf_hub_download` calls.

It answers HEAD and GET on /datasets/{repo}/resolve/{revision}/{filename} with the file from a
local directory and the headers huggingface_hub reads (X-Repo-Commit, ETag, Content-Length),
and 404 otherwise, so downloads go through the same code path as against the real hub.
"""

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

COMMIT = "0" * 40


@contextmanager
def serve_hub(files: Path, repo_id: str) -> Iterator[tuple[str, list[str]]]:
    """Serve `files` as the dataset repo `repo_id`; yields (endpoint URL, log of GET paths)."""
    gets: list[str] = []
    prefix = f"/datasets/{repo_id}/resolve/"

    class Handler(BaseHTTPRequestHandler):
        def _file(self) -> Path | None:
            path = unquote(self.path.split("?")[0])
            if not path.startswith(prefix):
                return None
            _, _, name = path[len(prefix) :].partition("/")  # after the revision
            f = files / name
            return f if f.is_file() else None

        def _headers(self, f: Path | None) -> None:
            if f is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = f.read_bytes()
            self.send_response(200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()

        def do_HEAD(self) -> None:
            self._headers(self._file())

        def do_GET(self) -> None:
            f = self._file()
            self._headers(f)
            if f is not None:
                gets.append(f.name)
                self.wfile.write(f.read_bytes())

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", gets
    finally:
        server.shutdown()
        server.server_close()
