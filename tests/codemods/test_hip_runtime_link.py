"""hip-runtime-link: before/after, and the unified-memory allocator's build as the HIP simulation (the
real bootstrap verify installs) and the CUDA control see it: the link flags load_inline gets and the
source as torch's hipify hands it to the compiler."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rocmport.codemods.runner import helper_text
from rocmport.verify.orchestration import environment
from rocmport.verify.orchestration import firewall
from rocmport.verify.runtime import hip_sim
from tests.helpers.codemods import assert_codemod, rewrite

# Shaped like megatron/core/inference/unified_memory.py's compile_allocator (v0.16+), cut down; the C
# source keeps what matters on HIP: the runtime header, managed allocation, and the CUDA-13 branch.
ALLOCATOR = '''\
import os
from pathlib import Path

import torch
from torch.utils.cpp_extension import CUDA_HOME, load_inline

_so_path = None
_error = None


def compile_allocator():
    """Attempt to compile UVM allocator."""
    global _so_path, _error
    _mempool_c_src = r"""
    #include <cuda_runtime_api.h>
    #include <cstddef>

    extern "C" void* managed_malloc(size_t size, int device, void* stream) {
      void* ptr = nullptr;
      if (cudaMallocManaged(&ptr, size, cudaMemAttachGlobal) != cudaSuccess) return nullptr;
      #if CUDART_VERSION >= 13000
        cudaMemLocation location;
        location.type = cudaMemLocationTypeDevice;
        location.id = device;
        cudaMemAdvise(ptr, size, cudaMemAdviseSetPreferredLocation, location);
      #else
        cudaMemAdvise(ptr, size, cudaMemAdviseSetPreferredLocation, device);
      #endif
      return ptr;
    }

    extern "C" void managed_free(void* ptr, size_t size, int device, void* stream) {
      if (ptr) cudaFree(ptr);
    }
    """
    _extra_ldflags = ["-lcudart"]
    if CUDA_HOME:
        _cuda_lib = os.path.join(CUDA_HOME, "lib64")
        if os.path.isdir(_cuda_lib):
            _extra_ldflags = [f"-L{_cuda_lib}", "-lcudart"]
    try:
        _mod = load_inline(
            name="managed_alloc_runtime",
            cpp_sources=[_mempool_c_src],
            functions=[],
            with_cuda=True,
            extra_ldflags=_extra_ldflags,
            verbose=True,
        )
        _so_path = Path(_mod.__file__).as_posix()
    except (RuntimeError, ImportError, OSError) as e:
        _error = str(e)
'''

REL = "megatron/core/inference/unified_memory.py"


def test_exact_before_after():
    after = ALLOCATOR.replace(
        "from torch.utils.cpp_extension import CUDA_HOME, load_inline\n",
        "from torch.utils.cpp_extension import CUDA_HOME, load_inline\nfrom megatron.core._rocm import hip_runtime_ldflags\n",
    ).replace("extra_ldflags=_extra_ldflags,", "extra_ldflags=hip_runtime_ldflags(_extra_ldflags),")
    assert_codemod("hip-runtime-link", ALLOCATOR, after, REL, sites=1)


def test_literal_list_aliased_builder_and_what_is_left():
    src = (
        "import torch.utils.cpp_extension as ce\n"
        "from torch.utils.cpp_extension import load as build\n\n"
        "flags = ['-lnccl']\n"
        "a = ce.load_inline(name='a', cpp_sources='', extra_ldflags=['-L/x', '-lcudart'])\n"
        "b = build(name='b', sources=[], extra_ldflags=flags)\n"
        "c = build(name='c', sources=[], extra_ldflags=['-lcudart_static'])\n"
        "d = print(extra_ldflags=['-lcudart'])\n"
    )
    after, sites = rewrite("hip-runtime-link", src, REL)
    assert sites == 1
    assert "extra_ldflags=hip_runtime_ldflags(['-L/x', '-lcudart']))" in after
    # Not the CUDA runtime, not a cpp_extension builder: left as they are.
    for kept in ("extra_ldflags=flags)", "extra_ldflags=['-lcudart_static'])", "print(extra_ldflags=['-lcudart'])"):
        assert kept in after


# load_inline stands in for torch's: it records the link flags and hands the C++ source to torch's
# hipify exactly as torch's _jit_compile does on a HIP build (is_pytorch_extension, the build
# directory as the project), then fails the build as a machine without a compiler would.
PROBE = r"""
import json, os, sys, torch
from torch.utils import cpp_extension
seen = {}
def recording_load_inline(name, cpp_sources, functions=None, with_cuda=None, extra_ldflags=None, **kw):
    seen["ldflags"] = extra_ldflags
    seen["is_hip_extension"] = cpp_extension.IS_HIP_EXTENSION
    build = os.path.join(os.environ["BUILD_DIR"], name)
    os.makedirs(build, exist_ok=True)
    main = os.path.join(build, "main.cpp")
    with open(main, "w") as f:
        f.write("\n".join(cpp_sources))
    if cpp_extension.IS_HIP_EXTENSION and with_cuda:
        from torch.utils.hipify import hipify_python
        result = hipify_python.hipify(project_directory=build, output_directory=build, header_include_dirs=[],
                                      extra_files=[main], show_detailed=False, show_progress=False, is_pytorch_extension=True)
        main = result[main].hipified_path or main
    seen["compiled"] = open(main).read()
    raise RuntimeError("no compiler here")
cpp_extension.load_inline = recording_load_inline
"""


def run_sim(tree: Path, files: dict[str, str], code: str, hip: bool) -> dict:
    """Run ``code`` after PROBE in a process verify would start: the real bootstrap, with the HIP
    simulation (an MI300X, ROCm 7.1, ROCM_HOME=/opt/rocm) or without it (the CUDA control)."""
    for rel, text in {
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": "",
        "megatron/core/inference/__init__.py": "",
        "megatron/core/_rocm.py": helper_text(["hip-runtime-link"]),
        **files,
    }.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    boot = firewall.write_bootstrap(tree.parent / f"boot-{tree.name}")
    extra: dict[str, str | None] = {"BUILD_DIR": str(tree.parent / f"build-{tree.name}"), "CUDA_HOME": None}
    if hip:
        extra.update(hip_sim.child_env(hip_sim.DEFAULT_VERSION))
    proc = subprocess.run(
        [sys.executable, "-c", PROBE + textwrap.dedent(code) + "\nprint(json.dumps(seen))\n"],
        env=environment.child_env(tree, boot, extra),
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compiled_branch(source: str) -> str:
    """What the compiler sees of a hipified source: comments dropped and, `CUDART_VERSION` being
    undefined on HIP (hipify leaves it; an undefined name is 0 in #if), the #else side of each
    `#if CUDART_VERSION >= 13000`."""
    source = re.sub(r"//[^\n]*", "", source)
    return re.sub(r"#if CUDART_VERSION >= 13000.*?#else(.*?)#endif", r"\1", source, flags=re.S)


def assert_hip_build(seen: dict) -> None:
    assert seen["is_hip_extension"] is True
    assert seen["ldflags"] == ["-L/opt/rocm/lib", "-lamdhip64"]
    code = compiled_branch(seen["compiled"])
    assert "#include <hip/hip_runtime_api.h>" in code and "hipMallocManaged(" in code and "hipMemAdvise(" in code
    # Nothing of the CUDA runtime is left for the HIP compiler (hipify mapped every name it meets).
    assert re.findall(r"\bcuda\w*", code) == [], code


CALL = """
import megatron.core.inference.unified_memory as um
um.compile_allocator()
assert um._so_path is None and "no compiler here" in um._error
"""


@pytest.mark.torch
def test_hip_links_the_hip_runtime_cuda_unchanged(tmp_path):
    after, _ = rewrite("hip-runtime-link", ALLOCATOR, REL)
    assert_hip_build(run_sim(tmp_path / "hip", {REL: after}, CALL, hip=True))
    # Upstream's tree under the simulation: what ROCm users get today (a -lcudart link, which fails).
    assert run_sim(tmp_path / "hip-up", {REL: ALLOCATOR}, CALL, hip=True)["ldflags"] == ["-lcudart"]
    # The CUDA control: exactly upstream's flags and source.
    cuda = run_sim(tmp_path / "cuda", {REL: after}, CALL, hip=False)
    upstream = run_sim(tmp_path / "cuda-up", {REL: ALLOCATOR}, CALL, hip=False)
    assert cuda == upstream and cuda["ldflags"] == ["-lcudart"] and "cudaMallocManaged(" in cuda["compiled"]


# ---- the real files, every line (a Megatron-LM mirror) --------------------------------------------

MLM = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")
RELEASES = {
    "v0.15": "core_v0.15.3",
    "v0.16": "core_v0.16.1",
    "v0.17": "core_v0.17.1",
    "v0.18": "core_v0.18.2",
    "v0.19": "core_v0.19.0",
}
REPO = Path(__file__).resolve().parents[2]
# What the allocator module imports from megatron (its one dependency).
UTILS = "def is_torch_min_version(version, check_equality=True):\n    return True\n"
# v0.16+ gathers the build's outcome across ranks on the current device: one CPU rank here.
V016_CALL = """
import torch.distributed as dist
torch.cuda.current_device = lambda: "cpu"
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=0, world_size=1)
import megatron.core.inference.unified_memory as um
um.compile_allocator()
assert um._compilation_state == um.CompilationState.FAILURE and "no compiler here" in um._compilation_error
"""
# v0.15 (patch 0002): CUDA builds at import, ROCm at first use.
V015_CALL = """
import megatron.core.inference.unified_memory as um
seen["at_import"] = bool(seen)
assert um.unified_memory_available() is False
"""


def real_file(tag: str, line: str) -> str:
    text = subprocess.run(
        ["git", "--git-dir", MLM, "show", f"{tag}:{REL}"], capture_output=True, text=True, check=True
    ).stdout
    if line != "v0.15":
        return text
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / REL).parent.mkdir(parents=True)
        (Path(tmp) / REL).write_text(text)
        patch = REPO / "patchsets/megatron-lm/v0.15/0002-inference-uvm-allocator-built-at-first-use-on-rocm.patch"
        diff = patch.read_text().split("\n---\n", 1)[1]
        subprocess.run(["git", "apply", "--include", REL, "-"], input=diff, text=True, cwd=tmp, check=True)
        return (Path(tmp) / REL).read_text()


@pytest.mark.torch
@pytest.mark.mirror
@pytest.mark.slow
@pytest.mark.skipif(not MLM, reason="set ROCMPORT_TEST_MLM_MIRROR to a local Megatron-LM mirror")
@pytest.mark.parametrize("line", list(RELEASES))
def test_real_allocator_every_line(tmp_path, line, monkeypatch):
    monkeypatch.setenv("PORT", str(29500 + list(RELEASES).index(line) + os.getpid() % 1000))
    ported_text = real_file(RELEASES[line], line)
    after, sites = rewrite("hip-runtime-link", ported_text, REL)
    assert sites == 1
    call = V015_CALL if line == "v0.15" else V016_CALL
    hip = run_sim(tmp_path / "hip", {REL: after, "megatron/core/utils.py": UTILS}, call, hip=True)
    assert_hip_build(hip)
    cuda = run_sim(tmp_path / "cuda", {REL: after, "megatron/core/utils.py": UTILS}, call, hip=False)
    upstream = run_sim(tmp_path / "up", {REL: ported_text, "megatron/core/utils.py": UTILS}, call, hip=False)
    assert cuda == upstream and cuda["ldflags"] in (
        ["-lcudart"],
        [f"-L{os.environ.get('CUDA_HOME', '')}/lib64", "-lcudart"],
    )
    if line == "v0.15":
        assert hip["at_import"] is False and cuda["at_import"] is True
