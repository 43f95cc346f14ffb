"""The operator-wide templates the project ships (docs/templates.md, "Shipped templates"). They name public
images; nothing here pulls one. Loaded once by a data migration; an operator may change or delete them."""

from __future__ import annotations

from typing import Any

SHIPPED: list[dict[str, Any]] = [
    {
        "name": "pytorch",
        "title": "PyTorch (NVIDIA NGC)",
        "description": "NVIDIA's PyTorch container (CUDA, cuDNN, NCCL, Apex). The container idles so you can "
        "SSH in and run training; replace the command to run a script instead.",
        "container": {
            "image": "nvcr.io/nvidia/pytorch:25.01-py3",
            "command": ["sleep", "infinity"],
            "env": {},
            "secrets": [],
            "volumes": [],
            "network": "none",
        },
        "spec": {"min_memory_mib": 16384, "gpu_count": 1},
        "ports": [{"name": "tensorboard", "port": 6006, "protocol": "http", "path": "/", "auth": "none"}],
        "duration_s": 4 * 3600,
    },
    {
        "name": "jupyterlab",
        "title": "JupyterLab with PyTorch (CUDA 12)",
        "description": "The Jupyter project's PyTorch notebook image with CUDA 12. Open JupyterLab from the "
        "reservation's page: the web proxy signs you in (docs/proxy.md).",
        "container": {
            "image": "quay.io/jupyter/pytorch-notebook:cuda12-latest",
            "command": [],
            "env": {},
            "secrets": [],
            "volumes": [],
            "network": "none",
        },
        "spec": {"min_memory_mib": 8192, "gpu_count": 1},
        "ports": [{"name": "jupyter", "port": 8888, "protocol": "http", "path": "/lab", "auth": "jupyter"}],
        "duration_s": 2 * 3600,
    },
    {
        "name": "vllm",
        "title": "vLLM OpenAI-compatible server",
        "description": "Serves a model from Hugging Face with vLLM's OpenAI-compatible API on port 8000. It "
        "downloads the model, so it needs the project's egress network; for a gated model add a secret "
        "(container.secrets) as HUGGING_FACE_HUB_TOKEN. Change --model in the command for another model.",
        "container": {
            "image": "vllm/vllm-openai:v0.8.5",
            "command": ["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--port", "8000"],
            "env": {},
            "secrets": [],
            "volumes": [],
            "network": "egress",
        },
        "spec": {"min_memory_mib": 24576, "gpu_count": 1},
        "ports": [{"name": "api", "port": 8000, "protocol": "http", "path": "/docs", "auth": "none"}],
        "duration_s": 8 * 3600,
    },
]


# What the jupyterlab template said before the web proxy: a template still saying it is brought up to date.
JUPYTERLAB_BEFORE_PROXY = {
    "description": "The Jupyter project's PyTorch notebook image with CUDA 12. JupyterLab listens on port 8888; "
    "its login token is in the container's log.",
    "ports": [{"name": "jupyter", "port": 8888, "protocol": "http"}],
}


def open_jupyterlab_in_the_proxy(template_model: Any, *, now: Any) -> int:
    """The operator-wide jupyterlab template as shipped before the web proxy gets its signing-in port and its new
    description; one an operator changed is left alone. Returns how many it changed."""
    current = next(d for d in SHIPPED if d["name"] == "jupyterlab")
    return template_model.objects.filter(
        project__isnull=True,
        name="jupyterlab",
        description=JUPYTERLAB_BEFORE_PROXY["description"],
        ports=JUPYTERLAB_BEFORE_PROXY["ports"],
    ).update(description=current["description"], ports=current["ports"], updated_at=now)


def load(template_model: Any, *, now: Any) -> int:
    """Creates each shipped template that has no operator-wide template of its name yet (one changed, or
    created by an operator under that name, is left as it is). Returns how many it created."""
    created = 0
    for definition in SHIPPED:
        if template_model.objects.filter(project__isnull=True, name=definition["name"]).exists():
            continue
        template_model.objects.create(project=None, created_at=now, updated_at=now, **definition)
        created += 1
    return created
