"""te-version-gates: `is_te_min_version` without TE, and version gates on a TE class's keyword argument
(or on the class itself) become API probes on HIP; before/after and both ways at run time."""

from __future__ import annotations

import pytest

from tests.helpers.codemods import (
    UTILS_V016,
    assert_codemod,
    assert_idempotent,
    rewrite,
    rewrite_with_reports,
    run_tree,
)


def test_te_gate_before_after():
    after, sites = rewrite("te-version-gates", UTILS_V016, "megatron/core/utils.py")
    assert sites == 1
    assert (
        '    """Check if minimum version of `transformer-engine` is installed."""\n'
        "    if get_te_version() is None:\n"
        "        return False  # rocmport: no Transformer Engine, so no TE feature of any version\n"
    ) in after
    assert_idempotent("te-version-gates", UTILS_V016, "megatron/core/utils.py")
    v017 = UTILS_V016.replace("return None", 'return PkgVersion("0.0.0")')
    assert rewrite("te-version-gates", v017, "megatron/core/utils.py") == (v017, 0)


@pytest.mark.torch
def test_te_gate_without_and_with_te(tmp_path):
    after, _ = rewrite("te-version-gates", UTILS_V016, "megatron/core/utils.py")
    code = (
        "from megatron.core.utils import is_te_min_version\nprint(is_te_min_version('2.7'), is_te_min_version('1.0'))\n"
    )
    absent = run_tree(tmp_path / "a", {"megatron/core/utils.py": after}, code)
    assert absent.stdout.strip() == "False False", absent.stderr
    upstream = run_tree(tmp_path / "u", {"megatron/core/utils.py": UTILS_V016}, code)
    assert "TypeError" in upstream.stderr  # what upstream does without TE
    fake_te = {"transformer_engine/__init__.py": "__version__ = '2.8.0'\n", "megatron/core/utils.py": after}
    present = run_tree(tmp_path / "p", fake_te, code)
    assert present.stdout.strip() == "True True", present.stderr


# Shaped like megatron/core/extensions/transformer_engine.py at core_v0.16.1.
EXTENSIONS = """\
import transformer_engine as te

from megatron.core.utils import get_te_version, is_te_min_version


class TELinear(te.pytorch.Linear):
    def __init__(self, input_size, output_size, config):
        extra_kwargs = {"params_dtype": config.params_dtype}
        if is_te_min_version("2.3.0"):
            extra_kwargs["delay_wgrad_compute"] = config.delay_wgrad_compute
        else:
            if config.delay_wgrad_compute:
                raise RuntimeError("Only TE with version >=2.3.0 supports delay_wgrad_compute now.")
        self.config = config
        super().__init__(in_features=input_size, out_features=output_size, **extra_kwargs)


class TEDotProductAttention(te.pytorch.DotProductAttention):
    def __init__(self, config):
        extra_kwargs = {}
        if config.softmax_type != "vanilla":
            assert is_te_min_version("2.8.0"), (
                f"Transformer-Engine v{get_te_version()} must be >= 2.8.0 to support"
                "`softmax_type`."
            )
            extra_kwargs["softmax_type"] = config.softmax_type
        super().__init__(**extra_kwargs)


class TEGroupedLinear(te.pytorch.GroupedLinear):
    def _split_extra_state(self, state):
        tmp_state = {}
        # TE 2.0 adds recipe in extra_state: a checkpoint format, not an argument
        if is_te_min_version("2.0.0"):
            tmp_state["recipe"] = state["recipe"]
        return tmp_state


def te_checkpoint(forward_func, *args):
    if is_te_min_version("1.5.0"):
        return "new checkpoint API"
    return "old checkpoint API"
"""


def test_kwarg_gates_become_probes_before_after():
    after, sites = rewrite("te-version-gates", EXTENSIONS, "megatron/core/extensions/transformer_engine.py")
    assert sites == 2
    assert 'if te_gate(is_te_min_version("2.3.0"), "pytorch.Linear", "delay_wgrad_compute"):\n' in after
    assert 'assert te_gate(is_te_min_version("2.8.0"), "pytorch.DotProductAttention", "softmax_type"), (\n' in after
    # Left: a checkpoint-format gate (the dict is never spread into a call) and a module-level gate.
    assert 'if is_te_min_version("2.0.0"):\n            tmp_state["recipe"]' in after
    assert 'if is_te_min_version("1.5.0"):\n        return "new checkpoint API"' in after
    assert after.count("from megatron.core._rocm import te_gate\n") == 1
    assert_idempotent("te-version-gates", EXTENSIONS, "megatron/core/extensions/transformer_engine.py")


def _fake_te(version: str, linear_kwargs: str) -> dict[str, str]:
    """A transformer_engine package with its own version number and Linear's real signature."""
    return {
        "transformer_engine/__init__.py": f"__version__ = {version!r}\nfrom transformer_engine import pytorch\n",
        "transformer_engine/pytorch/__init__.py": (
            "class Linear:\n"
            f"    def __init__(self, in_features, out_features, params_dtype=None{linear_kwargs}):\n"
            "        self.got = dict(locals())\n"
            "class DotProductAttention:\n"
            "    def __init__(self, **kwargs):\n"
            "        self.got = kwargs\n"
            "class GroupedLinear:\n"
            "    pass\n"
        ),
    }


PROBE = """
from types import SimpleNamespace
from megatron.core.extensions.transformer_engine import TELinear
cfg = SimpleNamespace(params_dtype=None, delay_wgrad_compute=True)
try:
    layer = TELinear(4, 4, cfg)
    print("passed" if "delay_wgrad_compute" in layer.got else "not passed")
except RuntimeError as exc:
    print("refused:", exc)
"""


def _tree(extensions: str, te: dict[str, str]) -> dict[str, str]:
    utils, _ = rewrite("te-version-gates", UTILS_V016, "megatron/core/utils.py")
    return {
        "megatron/core/utils.py": utils,
        "megatron/core/extensions/__init__.py": "",
        "megatron/core/extensions/transformer_engine.py": extensions,
        **te,
    }


@pytest.mark.torch
def test_rocm_te_with_its_own_version_number_gets_the_argument_on_hip(tmp_path):
    """ROCm TE numbered 1.14 whose Linear takes delay_wgrad_compute: HIP asks the API and passes it;
    CUDA keeps upstream's version answer (refuses), exactly as the unported code does."""
    after, _ = rewrite("te-version-gates", EXTENSIONS, "megatron/core/extensions/transformer_engine.py")
    te = _fake_te("1.14.0", ", delay_wgrad_compute=False")
    hip = run_tree(tmp_path / "hip", _tree(after, te), PROBE, hip="6.4.43482")
    assert hip.stdout.strip() == "passed", hip.stderr
    cuda = run_tree(tmp_path / "cuda", _tree(after, te), PROBE, hip=None)
    upstream = run_tree(tmp_path / "up", _tree(EXTENSIONS, te), PROBE, hip=None)
    assert cuda.stdout == upstream.stdout and cuda.stdout.startswith("refused: Only TE with version >=2.3.0"), (
        cuda.stderr
    )


@pytest.mark.torch
def test_api_without_the_argument_is_refused_on_hip_even_with_a_high_version(tmp_path):
    after, _ = rewrite("te-version-gates", EXTENSIONS, "megatron/core/extensions/transformer_engine.py")
    te = _fake_te("2.9.0", "")
    hip = run_tree(tmp_path / "hip", _tree(after, te), PROBE, hip="6.4.43482")
    assert hip.stdout.startswith("refused:"), hip.stderr
    cuda = run_tree(tmp_path / "cuda", _tree(after, te), PROBE, hip=None)
    assert "unexpected keyword argument 'delay_wgrad_compute'" in cuda.stderr  # upstream: the version says yes
    upstream = run_tree(tmp_path / "up", _tree(EXTENSIONS, te), PROBE, hip=None)
    assert (cuda.stdout, cuda.returncode) == (upstream.stdout, upstream.returncode)


@pytest.mark.torch
def test_kwargs_only_signature_falls_back_to_the_version_gate(tmp_path):
    after, _ = rewrite("te-version-gates", EXTENSIONS, "megatron/core/extensions/transformer_engine.py")
    code = """
from types import SimpleNamespace
from megatron.core.extensions.transformer_engine import TEDotProductAttention
try:
    print(sorted(TEDotProductAttention(SimpleNamespace(softmax_type="learnable")).got))
except AssertionError:
    print("refused")
"""
    low = run_tree(tmp_path / "low", _tree(after, _fake_te("2.7.0", "")), code, hip="6.4.43482")
    high = run_tree(tmp_path / "high", _tree(after, _fake_te("2.8.0", "")), code, hip="6.4.43482")
    assert (low.stdout.strip(), high.stdout.strip()) == ("refused", "['softmax_type']"), low.stderr + high.stderr


CLASS_GATE = '''\
import transformer_engine as te

from megatron.core.utils import is_te_min_version

HAVE_TE = True

if HAVE_TE and is_te_min_version("1.9.0.dev0"):

    class TEGroupedLinear(te.pytorch.GroupedLinear):
        """Wrapper for the Transformer-Engine's `GroupedLinear` layer."""

else:

    TEGroupedLinear = None
'''


@pytest.mark.torch
def test_class_availability_gate_asks_whether_te_has_the_class(tmp_path):
    rel = "megatron/core/extensions/transformer_engine.py"
    after, sites = rewrite("te-version-gates", CLASS_GATE, rel)
    assert sites == 1 and 'if HAVE_TE and te_has(is_te_min_version("1.9.0.dev0"), "pytorch.GroupedLinear"):\n' in after
    assert_idempotent("te-version-gates", CLASS_GATE, rel)
    code = (
        "from megatron.core.extensions.transformer_engine import TEGroupedLinear\nprint(TEGroupedLinear is not None)\n"
    )
    te = _fake_te("1.6.0", "")  # ROCm-style number below the gate, but the class is there
    assert run_tree(tmp_path / "hip", _tree(after, te), code, hip="6.4.43482").stdout.strip() == "True"
    assert run_tree(tmp_path / "cuda", _tree(after, te), code, hip=None).stdout.strip() == "False"
    assert run_tree(tmp_path / "up", _tree(CLASS_GATE, te), code, hip=None).stdout.strip() == "False"


def test_extensions_exact_before_after():
    after = (
        EXTENSIONS.replace(
            "from megatron.core.utils import get_te_version, is_te_min_version\n",
            "from megatron.core.utils import get_te_version, is_te_min_version\nfrom megatron.core._rocm import te_gate\n",
        )
        .replace(
            'if is_te_min_version("2.3.0"):',
            'if te_gate(is_te_min_version("2.3.0"), "pytorch.Linear", "delay_wgrad_compute"):',
        )
        .replace(
            'assert is_te_min_version("2.8.0"), (',
            'assert te_gate(is_te_min_version("2.8.0"), "pytorch.DotProductAttention", "softmax_type"), (',
        )
    )
    assert_codemod("te-version-gates", EXTENSIONS, after, "megatron/core/extensions/transformer_engine.py", sites=2)


def test_aliases_of_the_gate_and_of_te_classes():
    """The gate imported under another name or reached through its module, and TE classes imported
    by name: matched by what they mean. One import line carries both helpers."""
    assert_codemod(
        "te-version-gates",
        """\
        from transformer_engine.pytorch import Linear as TeLinear
        from transformer_engine import pytorch as tep

        from megatron.core import utils
        from megatron.core.utils import is_te_min_version as te_min


        class TELinear(TeLinear):
            def __init__(self, config):
                kw = {}
                if te_min("2.3.0"):
                    kw["delay_wgrad_compute"] = config.delay_wgrad_compute
                super().__init__(**kw)


        if utils.is_te_min_version("1.9.0.dev0"):

            class TEGroupedLinear(tep.GroupedLinear):
                pass
        """,
        """\
        from transformer_engine.pytorch import Linear as TeLinear
        from transformer_engine import pytorch as tep

        from megatron.core import utils
        from megatron.core.utils import is_te_min_version as te_min
        from megatron.core._rocm import te_gate, te_has


        class TELinear(TeLinear):
            def __init__(self, config):
                kw = {}
                if te_gate(te_min("2.3.0"), "pytorch.Linear", "delay_wgrad_compute"):
                    kw["delay_wgrad_compute"] = config.delay_wgrad_compute
                super().__init__(**kw)


        if te_has(utils.is_te_min_version("1.9.0.dev0"), "pytorch.GroupedLinear"):

            class TEGroupedLinear(tep.GroupedLinear):
                pass
        """,
        "megatron/core/extensions/transformer_engine.py",
        sites=2,
    )


def test_a_function_named_like_the_gate_from_elsewhere_is_not_a_gate():
    """Only is_te_min_version counts; a class that is not TE's is not probed."""
    src = """\
        import transformer_engine as te
        from mylib import is_flash_min_version
        from megatron.core.utils import is_te_min_version


        class Mine(object):
            def __init__(self, config):
                kw = {}
                if is_te_min_version("2.3.0"):
                    kw["delay_wgrad_compute"] = True
                self.f(**kw)


        class TELinear(te.pytorch.Linear):
            def __init__(self, config):
                kw = {}
                if is_flash_min_version("2.3.0"):
                    kw["delay_wgrad_compute"] = True
                super().__init__(**kw)
        """
    assert_codemod("te-version-gates", src, src, "megatron/core/extensions/transformer_engine.py", sites=0)


def test_every_gate_is_reported_changed_or_left_with_its_reason():
    """The reports are what docs/te-version-gates.md lists (scripts/te_gate_sites.py)."""
    _, sites, reports = rewrite_with_reports(
        "te-version-gates", EXTENSIONS, "megatron/core/extensions/transformer_engine.py"
    )
    rows = [(r.kind, r.line, r.detail["version"], r.message) for r in reports]
    assert sites == 2 and rows == [
        ("site", 9, "2.3.0", "probe on HIP: does `transformer_engine.pytorch.Linear` take `delay_wgrad_compute`?"),
        (
            "site",
            22,
            "2.8.0",
            "probe on HIP: does `transformer_engine.pytorch.DotProductAttention` take `softmax_type`?",
        ),
        ("skip", 34, "2.0.0", "checkpoint extra-state format of a TE version: bookkeeping, must match the checkpoint"),
        ("skip", 40, "1.5.0", "behaviour switch by TE version (not a single keyword argument of a TE class): kept"),
    ]
    assert {r.codemod for r in reports} == {"te-version-gates"}
    # A file with only gates the codemod leaves is still reported (and unchanged).
    args = (
        "from megatron.core.utils import is_te_min_version\n\n\ndef validate_args(args):\n"
        '    if args.fp4 and not is_te_min_version("2.7.0.dev0"):\n'
        '        raise ValueError("fp4 needs TE >= 2.7")\n'
    )
    after, sites, reports = rewrite_with_reports("te-version-gates", args, "megatron/training/arguments.py")
    assert (after, sites) == (args, 0)
    assert [(r.kind, r.line, r.message.split(":")[0]) for r in reports] == [("skip", 5, "FP4/MXFP8 recipes")]


# ---- issue 17 item 6: TE API drift at call sites -------------------------------------------------

GEMM_V016 = '''\
try:
    from transformer_engine.pytorch.cpp_extensions import general_gemm
    from transformer_engine.pytorch.module.base import get_workspace

    def te_general_gemm(A, B, out_dtype=None, layout="TN"):
        """Wrapper for TE's general_gemm function."""
        return general_gemm(
            A,
            B,
            workspace=get_workspace(),
            out_dtype=out_dtype,
            layout=layout,
        )

except ImportError:
    te_general_gemm = None
'''

GEMM_V017 = '''\
try:
    from transformer_engine.pytorch.cpp_extensions import general_gemm

    try:
        from transformer_engine.pytorch.module.base import get_workspace

        _get_workspace = get_workspace
    except ImportError:
        _get_workspace = None

    def te_general_gemm(A, B, out_dtype=None, layout="TN"):
        """Wrapper for TE's general_gemm function."""
        kwargs = dict(out_dtype=out_dtype, layout=layout)
        if _get_workspace is not None:
            kwargs["workspace"] = _get_workspace()
        return general_gemm(A, B, **kwargs)

except ImportError:
    te_general_gemm = None
'''

EXT = "megatron/core/extensions/transformer_engine.py"


def test_general_gemm_workspace_before_after_both_shapes():
    assert_codemod(
        "te-version-gates",
        GEMM_V016,
        "from megatron.core._rocm import te_accepts\n\n"
        + GEMM_V016.replace(
            "            workspace=get_workspace(),\n",
            '            **({"workspace": get_workspace()} if te_accepts(general_gemm, "workspace") else {}),\n',
        ),
        EXT,
        sites=1,
    )
    assert_codemod(
        "te-version-gates",
        GEMM_V017,
        "from megatron.core._rocm import te_accepts\n\n"
        + GEMM_V017.replace(
            "        if _get_workspace is not None:\n",
            '        if _get_workspace is not None and te_accepts(general_gemm, "workspace"):\n',
        ),
        EXT,
        sites=1,
    )
    _, _, reports = rewrite_with_reports("te-version-gates", GEMM_V016, EXT)
    assert [(r.kind, r.line, r.detail["version"], r.message) for r in reports] == [
        (
            "site",
            10,
            "call site",
            "probe on HIP: does `transformer_engine.pytorch.cpp_extensions.general_gemm` take `workspace`? "
            "(passed only where it does)",
        )
    ]


OFFLOAD_V017 = '''\
try:
    from transformer_engine.pytorch.cpu_offload import (
        get_cpu_offload_context as _get_cpu_offload_context,
    )

    def get_cpu_offload_context(enabled, num_layers, model_layers, activation_offloading, weight_offloading, double_buffering, retain_pinned_cpu_buffers):
        """Get CPU offload context and sync function."""
        if is_te_min_version("2.5.0"):
            context, sync_func = _get_cpu_offload_context(
                enabled,
                num_layers,
                model_layers,
                activation_offloading,
                weight_offloading,
                double_buffering,
                retain_pinned_cpu_buffers=retain_pinned_cpu_buffers,
            )
        else:
            context, sync_func = _get_cpu_offload_context(enabled, num_layers, activation_offloading, weight_offloading)
        return context, sync_func

except ImportError:
    get_cpu_offload_context = None
'''


def test_cpu_offload_retain_pinned_buffers_only_where_te_takes_it():
    """v0.17 passes `retain_pinned_cpu_buffers` from TE 2.5 on; TE takes it from 2.10 (TE 2.9.0, in
    v0.17's range, raised TypeError at model build): through the alias, the keyword becomes a probe."""
    assert_codemod(
        "te-version-gates",
        OFFLOAD_V017,
        "from megatron.core._rocm import te_accepts\n\n"
        + OFFLOAD_V017.replace(
            "                retain_pinned_cpu_buffers=retain_pinned_cpu_buffers,\n",
            '                **({"retain_pinned_cpu_buffers": retain_pinned_cpu_buffers} '
            'if te_accepts(_get_cpu_offload_context, "retain_pinned_cpu_buffers") else {}),\n',
        ),
        EXT,
        sites=1,
    )


def _gemm_te(takes_workspace: bool) -> dict[str, str]:
    params = "A, B, workspace, out_dtype=None, layout='TN'" if takes_workspace else "A, B, out_dtype=None, layout='TN'"
    return {
        "transformer_engine/__init__.py": "",
        "transformer_engine/pytorch/__init__.py": "",
        "transformer_engine/pytorch/cpp_extensions.py": f"def general_gemm({params}):\n    return sorted(locals())\n",
        "transformer_engine/pytorch/module/__init__.py": "",
        "transformer_engine/pytorch/module/base.py": "def get_workspace():\n    return 'ws'\n",
    }


GEMM_PROBE = """
from megatron.core.extensions.transformer_engine import te_general_gemm
try:
    print(te_general_gemm(1, 2))
except TypeError as exc:
    print("TypeError", exc)
"""


@pytest.mark.torch
def test_general_gemm_without_workspace_on_rocm_te(tmp_path):
    """A ROCm TE whose general_gemm allocates its own workspace (no `workspace` parameter): HIP
    leaves the argument out; CUDA passes it as upstream does (and fails like upstream)."""
    for shape in (GEMM_V016, GEMM_V017):
        after, _ = rewrite("te-version-gates", shape, EXT)
        files = {"megatron/core/extensions/__init__.py": "", EXT: after, **_gemm_te(False)}
        hip = run_tree(tmp_path / "h", files, GEMM_PROBE, hip="6.4.43482")
        assert hip.stdout.strip() == "['A', 'B', 'layout', 'out_dtype']", hip.stderr
        cuda = run_tree(tmp_path / "c", files, GEMM_PROBE)
        upstream = run_tree(tmp_path / "u", {**files, EXT: shape}, GEMM_PROBE)
        assert cuda.stdout == upstream.stdout and cuda.stdout.startswith("TypeError"), cuda.stderr
        files = {**files, **_gemm_te(True)}  # a TE that takes it: both pass it
        assert (
            run_tree(tmp_path / "w", files, GEMM_PROBE, hip="6.4.43482").stdout.strip()
            == "['A', 'B', 'layout', 'out_dtype', 'workspace']"
        )


SHARED_EXPERTS_V015 = """\
from megatron.core.utils import is_te_min_version


class SharedExpertMLP:
    def __init__(self, config, linear_fc1):
        self.config = config
        self.linear_fc1 = linear_fc1
        if self.config.fp8 and is_te_min_version("2.6.0dev0"):
            from megatron.core.extensions.transformer_engine import set_save_original_input

            set_save_original_input(self.linear_fc1)
"""


def test_save_original_input_gate_before_after():
    after = (
        "from megatron.core.utils import is_te_min_version\nfrom megatron.core._rocm import save_original_input_ok, te_gate\n"
        + SHARED_EXPERTS_V015.split("\n", 1)[1].replace(
            '        if self.config.fp8 and is_te_min_version("2.6.0dev0"):\n',
            '        if self.config.fp8 and te_gate(is_te_min_version("2.6.0dev0"), "pytorch.Linear", "save_original_input") '
            "and save_original_input_ok(self.config):\n",
        )
    )
    assert_codemod(
        "te-version-gates", SHARED_EXPERTS_V015, after, "megatron/core/transformer/moe/shared_experts.py", sites=1
    )
    # v0.16+ already excludes the delayed recipe: only the probe
    v016 = SHARED_EXPERTS_V015.replace(
        'if self.config.fp8 and is_te_min_version("2.6.0dev0"):',
        'if (self.config.fp8 and self.config.fp8_recipe != "delayed" and is_te_min_version("2.6.0dev0")):',
    )
    after, sites = rewrite("te-version-gates", v016, "megatron/core/transformer/moe/shared_experts.py")
    assert (
        sites == 1
        and "save_original_input_ok" not in after
        and 'te_gate(is_te_min_version("2.6.0dev0"), "pytorch.Linear", "save_original_input")' in after
    )


SAVE_PROBE = """
import types
from megatron.core.transformer.moe.shared_experts import SharedExpertMLP
from transformer_engine.pytorch import Linear
for recipe in ("delayed", "tensorwise"):
    try:
        m = SharedExpertMLP(types.SimpleNamespace(fp8=True, fp8_recipe=recipe), Linear())
        print(recipe, m.linear_fc1.save_original_input)
    except RuntimeError as exc:
        print(recipe, "RuntimeError", exc)
"""


@pytest.mark.torch
def test_save_original_input_on_rocm_te_and_the_delayed_recipe(tmp_path):
    """ROCm TE numbered 2.4 whose Linear takes save_original_input: HIP sets it, except under the
    delayed recipe TE cannot serve; CUDA keeps upstream's version answer (2.4 < 2.6: not set)."""
    after, _ = rewrite("te-version-gates", SHARED_EXPERTS_V015, "megatron/core/transformer/moe/shared_experts.py")
    te = {
        "transformer_engine/__init__.py": "__version__ = '2.4.0'\nfrom transformer_engine import pytorch\n",
        "transformer_engine/pytorch/__init__.py": (
            "class Linear:\n    def __init__(self, save_original_input=False):\n        self.save_original_input = save_original_input\n"
        ),
    }
    # TE refuses to save the original input under the delayed-scaling recipe
    ext = (
        "RECIPE = ['delayed']\n\n\ndef set_save_original_input(module):\n    if RECIPE[0] == 'delayed':\n"
        "        raise RuntimeError('save_original_input is not supported with delayed scaling')\n"
        "    module.save_original_input = True\n"
    )
    utils, _ = rewrite("te-version-gates", UTILS_V016, "megatron/core/utils.py")
    files = {
        **te,
        "megatron/core/utils.py": utils,
        "megatron/core/extensions/__init__.py": "",
        "megatron/core/extensions/transformer_engine.py": ext,
        "megatron/core/transformer/__init__.py": "",
        "megatron/core/transformer/moe/__init__.py": "",
        "megatron/core/transformer/moe/shared_experts.py": after,
    }
    probe = SAVE_PROBE.replace(
        "for recipe in", "from megatron.core.extensions import transformer_engine as ext\nfor recipe in"
    ).replace("    try:\n", "    ext.RECIPE[0] = recipe\n    try:\n")
    hip = run_tree(tmp_path / "h", files, probe, hip="6.4.43482")
    assert hip.stdout.splitlines() == ["delayed False", "tensorwise True"], hip.stderr
    cuda = run_tree(tmp_path / "c", files, probe)
    upstream = run_tree(
        tmp_path / "u", {**files, "megatron/core/transformer/moe/shared_experts.py": SHARED_EXPERTS_V015}, probe
    )
    assert cuda.stdout == upstream.stdout and cuda.stdout.splitlines() == ["delayed False", "tensorwise False"], (
        cuda.stderr
    )


FP4_GATE = """\
from megatron.core.utils import is_te_min_version


def validate_args(args, defaults={}):
    # FP4 requires TE >= 2.7.0.dev0
    if args.fp4 and not is_te_min_version("2.7.0.dev0"):
        raise ValueError("--fp4-format requires Transformer Engine >= 2.7.0.dev0 for NVFP4BlockScaling support.")
    return args
"""


@pytest.mark.torch
def test_fp4_gate_asks_for_nvfp4_on_hip(tmp_path):
    after, sites, reports = rewrite_with_reports("te-version-gates", FP4_GATE, "megatron/training/arguments.py")
    assert (
        sites == 1
        and 'if args.fp4 and not te_has(is_te_min_version("2.7.0.dev0"), "common.recipe.NVFP4BlockScaling"):' in after
    )
    assert [(r.kind, r.line, r.message) for r in reports] == [
        ("site", 6, "probe on HIP: does `transformer_engine.common.recipe.NVFP4BlockScaling` exist?")
    ]
    assert_idempotent("te-version-gates", FP4_GATE, "megatron/training/arguments.py")
    utils, _ = rewrite("te-version-gates", UTILS_V016, "megatron/core/utils.py")
    probe = (
        "import types\nfrom megatron.training.arguments import validate_args\ntry:\n"
        "    validate_args(types.SimpleNamespace(fp4=True)); print('fp4 accepted')\nexcept ValueError as e:\n    print('refused')\n"
    )
    for version, has_nvfp4, hip, cuda in (
        ("2.4.0", True, "fp4 accepted", "refused"),
        ("2.4.0", False, "refused", "refused"),
        ("2.8.0", True, "fp4 accepted", "fp4 accepted"),
    ):
        recipe = "class NVFP4BlockScaling:\n    pass\n" if has_nvfp4 else "class DelayedScaling:\n    pass\n"
        files = {
            "transformer_engine/__init__.py": f"__version__ = {version!r}\n",
            "transformer_engine/common/__init__.py": "",
            "transformer_engine/common/recipe.py": recipe,
            "megatron/core/utils.py": utils,
            "megatron/training/__init__.py": "",
            "megatron/training/arguments.py": after,
        }
        tag = f"{version}-{has_nvfp4}"
        assert run_tree(tmp_path / f"h{tag}", files, probe, hip="6.4.43482").stdout.strip() == hip
        assert run_tree(tmp_path / f"c{tag}", files, probe).stdout.strip() == cuda
        assert (
            run_tree(tmp_path / f"u{tag}", {**files, "megatron/training/arguments.py": FP4_GATE}, probe).stdout.strip()
            == cuda
        )
