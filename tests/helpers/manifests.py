"""Dependency manifests shaped like the upstreams' own (pyproject.toml of Megatron-LM and Megatron-Bridge)."""

# Shaped like Megatron-LM's pyproject at core_v0.19.0 (comments, tool tables, a dropped-only extra).
MLM_PYPROJECT = """\
[build-system]
requires = ["setuptools<80.0.0", "pybind11", "packaging>=24.2"]

[project]
name = "megatron-core"
dynamic = ["version", "readme"]
dependencies = ["torch>=2.6.0", "numpy", "packaging>=24.2"]

[project.optional-dependencies]
mlm = ["flask-restful", "sentencepiece", "tiktoken", "wandb", "transformers"]
dev = [
    "nvidia-modelopt[torch]>=0.44; sys_platform != 'darwin'",
    "nvidia-resiliency-ext==0.6.0",
    "tqdm",
    "einops~=0.8",                # keep me and my comment
    "flashinfer-python>=0.5.0,<0.7.0",
    "nvidia-cudnn-frontend[cutedsl]==1.26.0",
    "jax[cuda12,tpu]",
    "fastapi~=0.50",
]
te = ["transformer-engine[pytorch,core_cu13]"]
ssm = [
    "mamba-ssm",
    "causal-conv1d~=1.5",
]

[dependency-groups]
build = ["nvidia-mathdx", "pybind11"]

[tool.uv]
no-build-isolation-package = ["transformer-engine", "mamba-ssm"]

[tool.uv.sources]
transformer-engine = { git = "https://github.com/NVIDIA/TransformerEngine.git", rev = "5671fd36" }
"""

# Shaped like Megatron-Bridge's: megatron-core from the 3rdparty/Megatron-LM gitlink path source.
BRIDGE_PYPROJECT = """\
[project]
name = "megatron-bridge"
dependencies = [
    "transformers<5.0.0",
    "megatron-core[dev,mlm]>=0.15.0a0,<0.17.0",
    "transformer-engine[pytorch,core_cu13]>=2.10.0a0,<2.13.0",
    "nvidia-resiliency-ext~=0.4.1",
    "torch>=2.6.0",
]

[tool.uv.sources]
megatron-core = { path = "3rdparty/Megatron-LM/", editable = true }
nvidia-modelopt = { index = "nvidia" }
"""
