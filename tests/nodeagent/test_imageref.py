"""The image reference rule both sides use (nodeagent/imageref.py), against Docker's own reading."""

from __future__ import annotations

import pytest

from nodeagent import imageref

DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest", "canonical"),
    [
        ("busybox", "docker.io", "library/busybox", None, None, "docker.io/library/busybox:latest"),
        ("pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime", "docker.io", "pytorch/pytorch",
         "2.4.0-cuda12.4-cudnn9-runtime", None, "docker.io/pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"),
        ("nvcr.io/nvidia/pytorch:24.08-py3", "nvcr.io", "nvidia/pytorch", "24.08-py3", None,
         "nvcr.io/nvidia/pytorch:24.08-py3"),
        ("127.0.0.1:5000/team/trainer:v1", "127.0.0.1:5000", "team/trainer", "v1", None,
         "127.0.0.1:5000/team/trainer:v1"),
        ("localhost/x", "localhost", "x", None, None, "localhost/x:latest"),
        (f"ghcr.io/org/img@{DIGEST}", "ghcr.io", "org/img", None, DIGEST, f"ghcr.io/org/img@{DIGEST}"),
        (f"img:1@{DIGEST}", "docker.io", "library/img", "1", DIGEST, f"docker.io/library/img:1@{DIGEST}"),
        ("index.docker.io/library/ubuntu:24.04", "docker.io", "library/ubuntu", "24.04", None,
         "docker.io/library/ubuntu:24.04"),
        ("gpucp-busybox:test", "docker.io", "library/gpucp-busybox", "test", None,
         "docker.io/library/gpucp-busybox:test"),
    ],
)  # fmt: skip
def test_parse(text: str, registry: str, repository: str, tag: str | None, digest: str | None, canonical: str) -> None:
    ref = imageref.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag, digest)
    assert ref.canonical == canonical
    assert imageref.problem(text) is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "required"),
        ("PyTorch/pytorch", "repository name component"),
        ("pytorch/pytorch:", "not a tag"),
        ("pytorch/pytorch:-x", "not a tag"),
        ("img@sha256:abc", "not a digest"),
        ("img@md5:" + "a" * 32, "not a digest"),
        ("a b", "no spaces"),
        (" img", "no spaces"),
        ("reg.io/", "repository name component"),
        ("reg..io/x", "registry host"),
        ("a//b", "repository name component"),
        ("x" * 300, "longer than"),
    ],
)
def test_problems_in_words(text: str, words: str) -> None:
    problem = imageref.problem(text)
    assert problem is not None and words in problem


def test_docker_hub_api_host_and_mirror() -> None:
    ref = imageref.parse("pytorch/pytorch:2.4.0")
    assert ref.api_host == "registry-1.docker.io"
    mirrored = ref.with_registry("mirror.local:5000")
    assert mirrored.canonical == "mirror.local:5000/pytorch/pytorch:2.4.0"
    assert imageref.parse("127.0.0.1:5000/a/b").api_host == "127.0.0.1:5000"
