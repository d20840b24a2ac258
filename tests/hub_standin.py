"""A small local stand-in of the Hugging Face Hub's upload API, for huggingface_hub's real client to talk to.

It speaks what `HfApi.create_repo`, `create_branch`, `upload_folder` and `upload_file` send when Xet
storage is off (HF_HUB_DISABLE_XET=1): repository creation, the pre-upload survey, the LFS batch API with
basic PUT uploads, and the NDJSON commit; and what `snapshot_download` asks: a revision's file list, and
each file's metadata (HEAD) and bytes (GET). Files are kept in memory per repository and branch, and a
request without the expected token is refused with 401, as the Hub does. It listens on 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "hf_standin_write_token"


def validate_card(readme: str) -> list[dict]:
    """What the Hub refuses in a README's metadata: YAML that does not parse to a mapping, or a base_model
    that is not a model id (`owner/name`) or a list of them."""
    import yaml

    match = re.match(r"---\n(.*?)\n---\n", readme, re.S)
    if not match:
        return []
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as e:
        return [{"message": f"YAML does not parse: {e}"}]
    if not isinstance(data, dict):
        return [{"message": "metadata is not a mapping"}]
    bases = data.get("base_model", [])
    bases = [bases] if isinstance(bases, str) else bases
    if not isinstance(bases, list) or not all(
        isinstance(b, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", b) for b in bases
    ):
        return [{"message": f'"base_model" must be a model id or a list of them, not {bases!r}'}]
    return []


class Hub:
    def __init__(self):
        self.repos: dict[str, dict] = {}  # repo id -> {"private": bool, "branches": {name: {path: bytes}}}
        self.lfs: dict[str, bytes] = {}  # sha256 -> content
        self.commits: list[dict] = []  # (repo, branch, message, paths)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Hub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo: str, branch: str = "main") -> dict[str, bytes]:
        return self.repos[repo]["branches"][branch]

    def revision(self, repo: str, branch: str) -> str:
        """A commit id for the branch as it is (40 hex digits, as the Hub's)."""
        files = self.files(repo, branch)
        return hashlib.sha1(
            json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in sorted(files.items())}).encode()
        ).hexdigest()

    def branch_of(self, repo: str, revision: str) -> str | None:
        """The branch a revision names: a branch's name, or the commit id it is at."""
        branches = self.repos[repo]["branches"]
        if revision in branches:
            return revision
        return next((b for b in branches if self.revision(repo, b) == revision), None)

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, body: dict | list | None = None) -> None:
                data = json.dumps(body if body is not None else {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _authorised(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {TOKEN}":
                    return True
                self._reply(401, {"error": "Invalid credentials in Authorization header"})
                return False

            def _file(self):
                """The repository file a /{repo}/resolve/{revision}/{path} URL names, or None (replied 404)."""
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.path)
                repo = hub.repos.get(m.group(1)) if m else None
                branch = hub.branch_of(m.group(1), m.group(2)) if repo else None
                data = repo["branches"][branch].get(m.group(3)) if branch else None
                if data is None:
                    self._reply(404, {"error": "Entry not found"})
                    return None, None
                return data, hub.revision(m.group(1), branch)

            def _file_headers(self, data: bytes, commit: str) -> None:
                self.send_header("X-Repo-Commit", commit)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()

            def do_HEAD(self):
                data, commit = self._file()
                if data is not None:
                    self.send_response(200)
                    self._file_headers(data, commit)

            def do_GET(self):
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/?]+).*", self.path):
                    branch = hub.branch_of(m.group(1), m.group(2)) if m.group(1) in hub.repos else None
                    if branch is None:
                        return self._reply(404, {"error": "Repository not found"})
                    files = hub.files(m.group(1), branch)
                    return self._reply(
                        200,
                        {
                            "id": m.group(1),
                            "sha": hub.revision(m.group(1), branch),
                            "siblings": [{"rfilename": name} for name in sorted(files)],
                        },
                    )
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/?]+).*", self.path):
                    branch = hub.branch_of(m.group(1), m.group(2)) if m.group(1) in hub.repos else None
                    if branch is None:
                        return self._reply(404, {"error": "Revision not found"})
                    return self._reply(
                        200,
                        [
                            {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                            for name, data in sorted(hub.files(m.group(1), branch).items())
                        ],
                    )
                data, commit = self._file()
                if data is not None:
                    self.send_response(200)
                    self._file_headers(data, commit)
                    self.wfile.write(data)

            def do_PUT(self):
                m = re.fullmatch(r"/lfs-upload/([0-9a-f]{64})", self.path)
                data = self._body()
                if not m or hashlib.sha256(data).hexdigest() != m.group(1):
                    return self._reply(400, {"error": "content does not match its oid"})
                hub.lfs[m.group(1)] = data
                self._reply(200)

            def do_POST(self):
                if not self._authorised():
                    self._body()
                    return
                body = self._body()
                if self.path == "/api/validate-yaml":  # the model card's front matter, as the Hub checks it
                    return self._reply(200, {"errors": validate_card(json.loads(body)["content"]), "warnings": []})
                if self.path == "/api/repos/create":
                    request = json.loads(body)
                    repo = (
                        f"{request['organization']}/{request['name']}"
                        if request.get("organization")
                        else request["name"]
                    )
                    private = bool(request.get("private")) or request.get("visibility") == "private"
                    hub.repos.setdefault(repo, {"private": private, "branches": {"main": {}}})
                    return self._reply(200, {"url": f"{hub.endpoint}/{repo}", "name": repo})
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/branch/(.+)", self.path):
                    repo = hub.repos.get(m.group(1))
                    if repo is None:
                        return self._reply(404, {"error": "Repository not found"})
                    repo["branches"].setdefault(m.group(2), dict(repo["branches"]["main"]))
                    return self._reply(200)
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/preupload/(.+)", self.path):
                    if m.group(1) not in hub.repos:
                        return self._reply(404, {"error": "Repository not found"})
                    files = json.loads(body)["files"]
                    return self._reply(
                        200,
                        {
                            "files": [
                                {
                                    "path": f["path"],
                                    "uploadMode": "lfs" if f["size"] > 1024 else "regular",
                                    "shouldIgnore": False,
                                    "oid": None,
                                }
                                for f in files
                            ]
                        },
                    )
                if m := re.fullmatch(r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", self.path):
                    objects = json.loads(body)["objects"]
                    return self._reply(
                        200,
                        {
                            "transfer": "basic",
                            "objects": [
                                {
                                    "oid": o["oid"],
                                    "size": o["size"],
                                    "authenticated": True,
                                    "actions": {"upload": {"href": f"{hub.endpoint}/lfs-upload/{o['oid']}"}},
                                }
                                for o in objects
                            ],
                        },
                    )
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/(.+)", self.path):
                    return self._commit(m.group(1), m.group(2).replace("%2F", "/"), body)
                self._reply(404, {"error": f"no route {self.path}"})

            def _commit(self, repo_id: str, branch: str, body: bytes) -> None:
                repo = hub.repos.get(repo_id)
                if repo is None or branch not in repo["branches"]:
                    return self._reply(404, {"error": "Repository or revision not found"})
                lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                files, message = {}, None
                for line in lines:
                    value = line["value"]
                    if line["key"] == "header":
                        message = value["summary"]
                    elif line["key"] == "file":
                        files[value["path"]] = base64.b64decode(value["content"])
                    elif line["key"] == "lfsFile":
                        if value["oid"] not in hub.lfs:
                            return self._reply(400, {"error": f"{value['path']}: LFS object never uploaded"})
                        files[value["path"]] = hub.lfs[value["oid"]]
                repo["branches"][branch].update(files)
                hub.commits.append({"repo": repo_id, "branch": branch, "message": message, "paths": sorted(files)})
                oid = hashlib.sha1(json.dumps(hub.commits).encode()).hexdigest()
                self._reply(
                    200, {"success": True, "commitOid": oid, "commitUrl": f"{hub.endpoint}/{repo_id}/commit/{oid}"}
                )

        return Handler
