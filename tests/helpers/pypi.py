"""A real PEP 691 JSON index served on loopback, with sdists the tests build themselves."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import tarfile
import threading
from pathlib import Path


def make_sdist(
    path: Path, dist: str, version: str, files: dict[str, str], pkg_info_extra: str = "", members=()
) -> Path:
    """Write ``<dist>-<version>.tar.gz`` with a top directory, PKG-INFO and ``files``."""
    top = f"{dist.replace('-', '_')}-{version}"
    path.mkdir(parents=True, exist_ok=True)
    out = path / f"{top}.tar.gz"
    all_files = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n{pkg_info_extra}",
        **files,
        f"{dist.replace('-', '_')}.egg-info/SOURCES.txt": "generated\n",
    }
    with tarfile.open(out, "w:gz") as tar:
        for rel, text in sorted(all_files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(data)
            info.mode = 0o755 if rel.endswith(".sh") else 0o644
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
        for info in members:
            tar.addfile(info, io.BytesIO(b"") if info.isfile() else None)
    return out


class Index:
    """Serves /simple/<name>/ as PEP 691 JSON and /files/<filename>; counts downloads."""

    def __init__(self, root: Path):
        self.root = root
        self.files: dict[str, list[dict]] = {}
        self.hits: dict[str, int] = {}
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                parts = self.path.strip("/").split("/")
                if parts[0] == "simple" and len(parts) == 2 and parts[1] in index.files:
                    body = json.dumps(
                        {"meta": {"api-version": "1.0"}, "name": parts[1], "files": index.files[parts[1]]}
                    ).encode()
                    ctype = "application/vnd.pypi.simple.v1+json"
                elif parts[0] == "files" and (index.root / parts[1]).is_file():
                    index.hits[parts[1]] = index.hits.get(parts[1], 0) + 1
                    body, ctype = (index.root / parts[1]).read_bytes(), "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/simple"

    def add(self, name: str, sdist: Path, sha256: str | None = None, upload_time: str = "2025-03-01T00:00:00Z"):
        data = sdist.read_bytes()
        self.files.setdefault(name, []).append(
            {
                "filename": sdist.name,
                "url": f"/files/{sdist.name}",
                "hashes": {"sha256": sha256 or hashlib.sha256(data).hexdigest()},
                "upload-time": upload_time,
            }
        )

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
