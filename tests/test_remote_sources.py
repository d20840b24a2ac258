"""Checkpoints in object storage: `unshard convert s3://bucket/... OUT` against a local S3 server (moto's, run here,
never the internet) gives the bytes converting a local copy gives, downloads only what it reads (a DCP folder's
optimizer chunks never leave the bucket: counted by the server), and bad buckets or credentials are one line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import pytest
from conftest import SHIPPED
from test_cli_and_errors import leftovers

from unshard.sources import dcp

CASES = {  # name in the bucket -> (local checkpoint, extra arguments)
    "dcp": (SHIPPED / "llama-fsdp1-dcp" / "dcp", ["--config-from", str(SHIPPED / "llama-fsdp1-dcp" / "hf")]),
    # DCP's safetensors format: chunks where each file's header says, not where .metadata does (written in `s3`)
    "dcp-safetensors": (None, ["--config-from", str(SHIPPED / "llama-fsdp2" / "reference")]),
    "verl": (SHIPPED / "llama-fsdp2" / "global_step_1", []),
    "megatron": (SHIPPED / "megatron-qwen3-tp2-dp2" / "torch_dist", []),
}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on a free port of 127.0.0.1, the cases uploaded to bucket `runs`; `served` counts the bytes
    of the objects it sends (listings left out)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = DomainDispatcherApplication(create_backend_app)
    served = {"bytes": 0, "requests": 0}

    def counting(environ, start_response):
        result = app(environ, start_response)
        if environ["REQUEST_METHOD"] == "GET" and "list-type" not in environ.get("QUERY_STRING", ""):
            body = b"".join(result)
            served["bytes"] += len(body)
            served["requests"] += 1
            return [body]
        return result

    server = make_server("127.0.0.1", 0, counting, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{server.server_port}",
        AWS_EC2_METADATA_DISABLED="true",
    )
    import s3fs

    fs = s3fs.S3FileSystem(key="test", secret="test", endpoint_url=env["AWS_ENDPOINT_URL"])
    fs.mkdir("runs")
    CASES["dcp-safetensors"] = (safetensors_dcp(tmp_path_factory.mktemp("dcp") / "dcp"), CASES["dcp-safetensors"][1])
    for name, (local, _) in CASES.items():
        fs.put(str(local), f"runs/{name}", recursive=True)
    yield env, served
    server.shutdown()


def safetensors_dcp(folder):
    """The shipped Llama saved by torch.distributed.checkpoint with SerializationFormat.SAFETENSORS."""
    import torch.distributed.checkpoint as dcp_api
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.filesystem import FileSystemWriter, SerializationFormat

    state = load_file(SHIPPED / "llama-fsdp2" / "reference" / "model.safetensors")
    with pytest.warns(UserWarning):  # no process group: torch saves as a single process
        dcp_api.save(
            state, storage_writer=FileSystemWriter(folder, serialization_format=SerializationFormat.SAFETENSORS)
        )
    return folder


def convert(src, out, env, *extra):
    return subprocess.run(
        [sys.executable, "-m", "unshard", "convert", str(src), str(out), "--no-progress", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def files_of(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("case", CASES)
def test_a_bucket_gives_the_bytes_a_local_copy_gives(case, s3, tmp_path):
    env, _ = s3
    local, extra = CASES[case]
    (tmp_path / "tmp").mkdir()
    remote = convert(f"s3://runs/{case}", tmp_path / "remote", {**env, "TMPDIR": str(tmp_path / "tmp")}, *extra)
    assert remote.returncode == 0, remote.stderr
    assert convert(local, tmp_path / "local", env, *extra).returncode == 0
    ours, theirs = files_of(tmp_path / "remote"), files_of(tmp_path / "local")
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        if name != "README.md":
            assert ours[name] == theirs[name], name
    assert f"from `s3://runs/{case}" in ours["README.md"].decode()  # (the card names the URL, not the local mirror)
    assert not any((tmp_path / "tmp").iterdir())  # (the local mirror is gone)


def test_unread_tensors_are_not_downloaded(s3, tmp_path):
    """Of the DCP folder (a model and its optimizer, saved by torch.distributed.checkpoint), the server sends the
    .metadata, the first 9 bytes of each .distcp (the format's signature) and the model's chunks: no optimizer
    chunk."""
    env, served = s3
    local = CASES["dcp"][0]
    metadata = dcp.read_metadata(local)
    model = set(dcp.model_names(metadata)[0])
    chunks = dcp.storage_index(metadata)
    wanted = sum(info.length for (fqn, _), info in chunks.items() if fqn in model)
    optimizer = sum(info.length for (fqn, _), info in chunks.items() if fqn not in model)
    distcp = len({info.relative_path for info in chunks.values()})
    assert optimizer > 0
    served.update(bytes=0, requests=0)
    done = convert("s3://runs/dcp", tmp_path / "out", env, *CASES["dcp"][1])
    assert done.returncode == 0, done.stderr
    assert served["bytes"] == (local / ".metadata").stat().st_size + 9 * distcp + wanted
    code = subprocess.run(
        [sys.executable, "-m", "unshard", "inspect", "s3://runs/dcp", *CASES["dcp"][1]],
        env=env,
        capture_output=True,
        text=True,
    )
    assert "remote" in code.stdout and "s3://runs/dcp: read" in code.stdout, code.stdout


def test_bad_buckets_and_credentials_are_one_line(s3, tmp_path):
    env, _ = s3
    no_credentials = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    no_credentials.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"))
    cases = [
        ("s3://no-such-bucket/run", env, "not found"),
        ("s3://runs/no-such-run", env, "nothing here"),
        ("s3://runs/verl", no_credentials, "refused the credentials"),
    ]
    for src, environment, said in cases:
        done = convert(src, tmp_path / "out", environment)
        assert done.returncode == 1 and said in done.stderr, (src, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and src in done.stderr, done.stderr
        assert not (tmp_path / "out").exists() and not leftovers(tmp_path)
    done = convert(CASES["verl"][0], "s3://runs/out", env)
    assert done.returncode == 1 and "writes OUT to a local disk" in done.stderr, done.stderr
