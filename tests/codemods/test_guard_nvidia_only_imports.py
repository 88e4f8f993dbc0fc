"""guard-nvidia-only-imports: before/after on upstream-shaped code, and both ways at run time."""

import pytest

from tests.helpers.codemods import assert_codemod, assert_idempotent, rewrite, rewrite_with_reports, run_tree

BEFORE = '''\
"""Post-training checkpointing (shaped like megatron/post_training/checkpointing.py)."""
import os

import modelopt.torch.opt as mto
import torch
from modelopt.torch.opt.plugins import restore_sharded_modelopt_state
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient


def load_modelopt_state(model, path):
    """Restore modelopt state."""
    return restore_sharded_modelopt_state([model], path)
'''

AFTER = '''\
"""Post-training checkpointing (shaped like megatron/post_training/checkpointing.py)."""
import os

try:
    import modelopt.torch.opt as mto
    HAVE_MODELOPT = True
except ImportError:
    from megatron.core._rocm import MissingPackage
    mto = MissingPackage('nvidia-modelopt', 'modelopt.torch.opt', 'megatron/post_training/checkpointing.py')
    HAVE_MODELOPT = False
import torch
try:
    from modelopt.torch.opt.plugins import restore_sharded_modelopt_state
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
    HAVE_MODELOPT = True
    HAVE_NVIDIA_RESILIENCY_EXT = True
except ImportError:
    from megatron.core._rocm import MissingPackage
    restore_sharded_modelopt_state = MissingPackage('nvidia-modelopt', 'modelopt.torch.opt.plugins.restore_sharded_modelopt_state', 'megatron/post_training/checkpointing.py')
    RankMonitorClient = MissingPackage('nvidia-resiliency-ext', 'nvidia_resiliency_ext.fault_tolerance.RankMonitorClient', 'megatron/post_training/checkpointing.py')
    HAVE_MODELOPT = False
    HAVE_NVIDIA_RESILIENCY_EXT = False


def load_modelopt_state(model, path):
    """Restore modelopt state."""
    return restore_sharded_modelopt_state([model], path)
'''

REL = "megatron/post_training/checkpointing.py"


def test_before_after():
    after, sites = rewrite("guard-nvidia-only-imports", BEFORE, REL)
    assert after == AFTER
    assert sites == 3


def test_idempotent_and_guarded_imports_untouched():
    assert_idempotent("guard-nvidia-only-imports", BEFORE, REL)
    guarded = "try:\n    import modelopt\nexcept ImportError:\n    modelopt = None\n"
    assert rewrite("guard-nvidia-only-imports", guarded, REL) == (guarded, 0)
    lazy = "def f():\n    import modelopt\n    return modelopt\n"
    assert rewrite("guard-nvidia-only-imports", lazy, REL) == (lazy, 0)


IMPORTORSKIP = """\
import pytest
import torch

nvidia_resiliency_ext = pytest.importorskip(
    "nvidia_resiliency_ext",
    reason="nvidia_resiliency_ext is required for local checkpointing tests",
)

from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.base_manager import (
    CheckpointingException,
)
from modelopt.torch.opt import plugins
"""


def test_an_import_the_file_importorskips_above_stays_unguarded():
    """Shaped like upstream's tests/unit_tests/dist_checkpointing/test_local.py: the file skips itself
    without nvidia_resiliency_ext, so a guard on the import after the skip could never run (it ran in no
    verify run: stage 1 called the file skips-itself). Left as upstream wrote it, with a skip report
    naming the importorskip; an import of another package after it is still guarded."""
    after, sites, reports = rewrite_with_reports(
        "guard-nvidia-only-imports", IMPORTORSKIP, "tests/unit_tests/dist_checkpointing/test_local.py"
    )
    assert sites == 1
    assert (
        "from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.base_manager import (\n    Checkpointing" in after
    )
    assert "HAVE_NVIDIA_RESILIENCY_EXT" not in after
    assert "    plugins = MissingPackage('nvidia-modelopt', 'modelopt.torch.opt.plugins'," in after
    skips = [r for r in reports if r.kind == "skip"]
    assert [(r.line, r.message.split(":")[0]) for r in skips] == [(9, "left unguarded")]
    assert "nvidia_resiliency_ext (pytest.importorskip at line 4)" in skips[0].message
    # an importorskip below the import does not count: the import runs first, its guard can fire
    first = "import pytest\nfrom nvidia_resiliency_ext import a\npytest.importorskip('nvidia_resiliency_ext')\n"
    assert rewrite("guard-nvidia-only-imports", first, "tests/x.py")[1] == 1


def test_bridge_files_use_the_bridge_helper():
    after, _ = rewrite(
        "guard-nvidia-only-imports",
        "from modelopt.torch.distill import DistillationModel\n",
        "src/megatron/bridge/models/gpt_provider.py",
    )
    assert "from megatron.bridge._rocm import MissingPackage" in after


@pytest.mark.torch
def test_absent_package_fails_at_use_not_import(tmp_path):
    proc = run_tree(
        tmp_path,
        {REL: AFTER, "megatron/post_training/__init__.py": ""},
        """
        import megatron.post_training.checkpointing as c
        assert c.HAVE_MODELOPT is False and not c.mto
        try:
            c.load_modelopt_state(object(), "/ckpt")
        except ModuleNotFoundError as e:
            print("ERR", e)
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert "needs the NVIDIA-only package 'nvidia-modelopt'" in proc.stdout
    assert "megatron/post_training/checkpointing.py" in proc.stdout
    assert "ModelOpt post-training options" in proc.stdout  # what asked for it


@pytest.mark.torch
def test_present_package_behaves_as_upstream(tmp_path):
    fake = {
        "modelopt/__init__.py": "",
        "modelopt/torch/__init__.py": "",
        "modelopt/torch/opt/__init__.py": "NAME = 'real mto'\n",
        "modelopt/torch/opt/plugins.py": "def restore_sharded_modelopt_state(models, path):\n    return ('restored', path)\n",
        "nvidia_resiliency_ext/__init__.py": "",
        "nvidia_resiliency_ext/fault_tolerance.py": "class RankMonitorClient: pass\n",
        REL: AFTER,
        "megatron/post_training/__init__.py": "",
    }
    proc = run_tree(
        tmp_path,
        fake,
        """
        import megatron.post_training.checkpointing as c
        print(c.HAVE_MODELOPT, c.HAVE_NVIDIA_RESILIENCY_EXT, c.mto.NAME, c.load_modelopt_state(None, "/p"))
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True True real mto ('restored', '/p')"


@pytest.mark.torch
def test_series_options_add_packages_and_their_triggers(tmp_path):
    """Bridge series guard transformer_engine too: peft/lora_layers.py imports it unconditionally."""
    from rocmport.codemods import compute_layers

    src = (
        "import torch\nimport transformer_engine.pytorch as te\n\n\n"
        "class TELinearAdapter(te.Linear):\n    pass\n\n\ndef is_te(m):\n"
        "    return isinstance(m, te.Linear)\n"
    )
    rel = "src/megatron/bridge/peft/lora_layers.py"
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text(src)
    spec = {"name": "guard-nvidia-only-imports", "options": {"packages": {"transformer_engine": "transformer-engine"}}}
    assert compute_layers(tmp_path, ["guard-nvidia-only-imports"], cache_dir=tmp_path / "c").layers[0].files == {}
    layer = compute_layers(tmp_path, [spec], cache_dir=tmp_path / "c").layers[0]
    after = layer.files[rel]
    assert "    te = MissingPackage('transformer-engine', 'transformer_engine.pytorch', " in after
    files = {
        "megatron/bridge/__init__.py": "",
        "megatron/bridge/peft/__init__.py": "",
        "megatron/bridge/peft/lora_layers.py": after,
        "megatron/bridge/_rocm.py": layer.files["src/megatron/bridge/_rocm.py"],
    }
    proc = run_tree(
        tmp_path / "run",
        files,
        """
        from megatron.bridge.peft import lora_layers as m
        print(m.HAVE_TRANSFORMER_ENGINE, m.is_te(object()))
        try:
            m.TELinearAdapter()
        except ModuleNotFoundError as e:
            print("ERR", "transformer-engine" in str(e))
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["False False", "ERR True"]


@pytest.mark.torch
def test_placeholders_survive_annotations_evaluated_at_import(tmp_path):
    src = "from modelopt.torch.distill import DistillationModel\n\n\ndef f(m: DistillationModel | None = None) -> list[DistillationModel]:\n    return m\n"
    after, _ = rewrite("guard-nvidia-only-imports", src, "megatron/core/x.py")
    proc = run_tree(
        tmp_path, {"megatron/core/x.py": after}, "from megatron.core import x\nprint(x.f(), x.HAVE_MODELOPT)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None False"


def test_aliases_exact_before_after():
    assert_codemod(
        "guard-nvidia-only-imports",
        """\
        import torch
        from nvidia_resiliency_ext import fault_tolerance as ft
        import modelopt.torch.quantization as mtq
        """,
        """\
        import torch
        try:
            from nvidia_resiliency_ext import fault_tolerance as ft
            import modelopt.torch.quantization as mtq
            HAVE_MODELOPT = True
            HAVE_NVIDIA_RESILIENCY_EXT = True
        except ImportError:
            from megatron.core._rocm import MissingPackage
            ft = MissingPackage('nvidia-resiliency-ext', 'nvidia_resiliency_ext.fault_tolerance', 'megatron/training/ft_integration.py')
            mtq = MissingPackage('nvidia-modelopt', 'modelopt.torch.quantization', 'megatron/training/ft_integration.py')
            HAVE_MODELOPT = False
            HAVE_NVIDIA_RESILIENCY_EXT = False
        """,
        "megatron/training/ft_integration.py",
        sites=2,
    )


# Version 5: shaped like v0.19's tests/unit_tests/generalized_tensor_parallel/ and the two modules
# behind their flag (megatron/core/tensor_parallel/gtp_api.py, generalized_tensor_parallelism.py).
GTP_TEST = """\
import pytest
import torch

from megatron.core.tensor_parallel.gtp_api import HAVE_GTP

if not HAVE_GTP:
    pytest.skip("GTP requires TransformerEngine >= 2.19", allow_module_level=True)

import transformer_engine.pytorch as te
from transformer_engine.pytorch import fp8_autocast
"""
GTP_IMPL = """\
import torch

try:
    import transformer_engine as te  # noqa: F401

    if te.__version__ < "2.19":
        raise ImportError("too old")
    from transformer_engine.pytorch.utils import nvtx_range_pop

    HAVE_TE = True
except (ImportError, ModuleNotFoundError):
    te = None
    HAVE_TE = False
"""
GTP_API = """\
try:
    from megatron.core.tensor_parallel.generalized_tensor_parallelism import (
        HAVE_TE,
        wrap_module_params_gtp,
    )

    HAVE_GTP = HAVE_TE
except ImportError:
    HAVE_GTP = False
"""
GTP_TEST_REL = "tests/unit_tests/generalized_tensor_parallel/test_gtp_basics.py"
TE_SPEC = {"name": "guard-nvidia-only-imports", "options": {"packages": {"transformer_engine": "transformer-engine"}}}


GTP_IMPL_REL = "megatron/core/tensor_parallel/generalized_tensor_parallelism.py"


def _port(tmp_path, changed: dict[str, str] | None = None):
    """The GTP tree (with ``changed`` files: relpath -> text) through the codemod: (test file after, reports)."""
    from rocmport.codemods import compute_layers
    from tests.codemods.test_framework import make_tree

    files = {
        "megatron/__init__.py": "",
        "megatron/core/__init__.py": "",
        "megatron/core/tensor_parallel/__init__.py": "",
        GTP_IMPL_REL: GTP_IMPL,
        "megatron/core/tensor_parallel/gtp_api.py": GTP_API,
        GTP_TEST_REL: GTP_TEST,
        **(changed or {}),
    }
    tree = make_tree(tmp_path / "t", files)
    layer = compute_layers(tree, [TE_SPEC], jobs=1, cache_dir=tmp_path / "c").layers[0]
    return layer.files.get(GTP_TEST_REL, files[GTP_TEST_REL]), [
        r for r in layer.all_reports() if r.path == GTP_TEST_REL
    ]


def test_an_import_after_a_skip_on_a_flag_implying_its_package_stays_unguarded(tmp_path):
    """HAVE_GTP is true only where transformer_engine imports: without it the file skips itself
    before the import, so a guard there could never run (v0.19: 13 sites that ran on no proxy)."""
    after, reports = _port(tmp_path)
    assert after == GTP_TEST
    skips = [r for r in reports if r.kind == "skip"]
    assert [(r.line, r.message.split(":")[0]) for r in skips] == [(9, "left unguarded"), (10, "left unguarded")]
    assert (
        "transformer_engine (`if not HAVE_GTP: pytest.skip(..., allow_module_level=True)` at line 6, and HAVE_GTP is "
        "true only where transformer_engine imports: HAVE_GTP (megatron/core/tensor_parallel/gtp_api.py) ⇐ HAVE_TE "
        "(megatron/core/tensor_parallel/generalized_tensor_parallelism.py: after `import transformer_engine as te` "
        "in its try)), so a guard here could never run" in skips[0].message
    )


def _guarded(after: str) -> bool:
    return "    te = MissingPackage('transformer-engine', 'transformer_engine.pytorch', " in after


def test_a_flag_that_does_not_imply_the_package_leaves_the_import_guarded(tmp_path):
    # HAVE_TE true unconditionally
    after, reports = _port(tmp_path / "a", {GTP_IMPL_REL: "HAVE_TE = True\n"})
    assert _guarded(after) and not [r for r in reports if r.kind == "skip"]
    # HAVE_TE set after an import of another package in its try
    other = GTP_IMPL.replace("import transformer_engine as te", "import torchao as te").replace(
        "from transformer_engine.pytorch.utils", "from torchao.utils"
    )
    after, _ = _port(tmp_path / "b", {GTP_IMPL_REL: other})
    assert _guarded(after)
    # HAVE_TE also set True outside the try (one binding not proven is enough)
    outside = GTP_IMPL + "\nif torch.cuda.is_available():\n    HAVE_TE = True\n"
    after, _ = _port(tmp_path / "c", {GTP_IMPL_REL: outside})
    assert _guarded(after)
    # HAVE_TE rebound in a function through `global`
    rebound = GTP_IMPL + "\n\ndef enable():\n    global HAVE_TE\n    HAVE_TE = 1\n"
    after, _ = _port(tmp_path / "d", {GTP_IMPL_REL: rebound})
    assert _guarded(after)
    # a skip that is not the module-level `pytest.skip(..., allow_module_level=True)`
    warned = GTP_TEST.replace(
        'pytest.skip("GTP requires TransformerEngine >= 2.19", allow_module_level=True)', "print('no GTP')"
    )
    after, _ = _port(tmp_path / "e", {GTP_TEST_REL: warned})
    assert _guarded(after)


def test_an_alias_chain_in_the_same_file_is_followed(tmp_path):
    """The flag assigned in the test file itself, from a name of the tree by another name."""
    local = """\
import pytest

from megatron.core.tensor_parallel.generalized_tensor_parallelism import HAVE_TE as _te_ok

TE_OK = _te_ok
GTP_OK = TE_OK

if not GTP_OK:
    print("skipping")
    pytest.skip("needs TE", allow_module_level=True)

import transformer_engine.pytorch as te
"""
    after, reports = _port(tmp_path / "a", {GTP_TEST_REL: local})
    assert after == local
    (skip,) = [r for r in reports if r.kind == "skip"]
    assert (
        "GTP_OK (tests/unit_tests/generalized_tensor_parallel/test_gtp_basics.py) ⇐ TE_OK "
        "(tests/unit_tests/generalized_tensor_parallel/test_gtp_basics.py) ⇐ _te_ok "
        "(tests/unit_tests/generalized_tensor_parallel/test_gtp_basics.py) ⇐ HAVE_TE "
        "(megatron/core/tensor_parallel/generalized_tensor_parallelism.py: after `import transformer_engine as te` "
        "in its try)" in skip.message
    )
    # a cycle proves nothing
    cycle = local.replace("TE_OK = _te_ok", "TE_OK = GTP_OK")
    after, _ = _port(tmp_path / "b", {GTP_TEST_REL: cycle})
    assert _guarded(after)


def test_a_parameter_named_like_the_flag_blocks_the_proof(tmp_path):
    """Every binding of the flag anywhere in its module counts (any scope: conservative), a function's
    parameter too, with or without an assignment expression in the module (until the review mend a
    module without `:=` was read from its statements alone and its parameters were missed)."""
    param = GTP_IMPL + "\n\ndef check(HAVE_TE=None):\n    return HAVE_TE\n"
    assert ":=" not in param
    after, reports = _port(tmp_path / "a", {GTP_IMPL_REL: param})
    assert _guarded(after) and not [r for r in reports if r.kind == "skip"]
    walrus = param + "\nif (n := torch.cuda.device_count()) > 8:\n    print(n)\n"
    after, _ = _port(tmp_path / "b", {GTP_IMPL_REL: walrus})
    assert _guarded(after)


def test_an_assignment_expression_binding_the_flag_blocks_the_proof(tmp_path):
    """With `:=` in a module its expressions are read too: `:=` may rebind the flag inside any
    expression; a `:=` binding another name proves as before."""
    other = GTP_IMPL + "\nif (n := torch.cuda.device_count()) > 8:\n    print(n)\n"
    after, _ = _port(tmp_path / "a", {GTP_IMPL_REL: other})
    assert after == GTP_TEST
    rebound = GTP_IMPL + "\nprint(HAVE_TE := torch.cuda.is_available())\n"
    after, reports = _port(tmp_path / "b", {GTP_IMPL_REL: rebound})
    assert _guarded(after) and not [r for r in reports if r.kind == "skip"]
    nested = GTP_IMPL + "\n\ndef probe(xs):\n    return [x for x in xs if (HAVE_TE := x)]\n"
    after, _ = _port(tmp_path / "c", {GTP_IMPL_REL: nested})
    assert _guarded(after)


def test_an_except_star_name_like_the_flag_blocks_the_proof(tmp_path):
    """`except* E as FLAG` binds FLAG (to an exception group), with or without `:=` in the module."""
    star = GTP_IMPL + "\ntry:\n    torch.cuda.init()\nexcept* RuntimeError as HAVE_TE:\n    pass\n"
    after, reports = _port(tmp_path / "a", {GTP_IMPL_REL: star})
    assert _guarded(after) and not [r for r in reports if r.kind == "skip"]
    walrus = star + "\nif (n := torch.cuda.device_count()) > 8:\n    print(n)\n"
    after, _ = _port(tmp_path / "b", {GTP_IMPL_REL: walrus})
    assert _guarded(after)


def test_a_comprehension_target_named_like_the_flag_does_not_block_without_walrus(tmp_path):
    """Without `:=` in a module its expressions are not read: a comprehension's target or a
    lambda's parameter binds only its own scope, in a `match` statement as elsewhere (until the
    review mend a whole `match` statement was read with its expressions, and these blocked there)."""
    outside = GTP_IMPL + "\nnames = [HAVE_TE for HAVE_TE in ()]\nf = lambda HAVE_TE: HAVE_TE\n"
    after, _ = _port(tmp_path / "a", {GTP_IMPL_REL: outside})
    assert after == GTP_TEST
    inside = GTP_IMPL + (
        "\nmatch torch.__version__:\n    case str():\n"
        "        names = [HAVE_TE for HAVE_TE in ()]\n        f = lambda HAVE_TE: HAVE_TE\n"
    )
    after, _ = _port(tmp_path / "b", {GTP_IMPL_REL: inside})
    assert after == GTP_TEST
