"""guard-nvidia-only-imports leaves modules upstream imports only behind feature probes: found over
the whole tree (codemods/feature_probes.py), and run for real, where the probe must say False."""

from __future__ import annotations

import pytest

from rocmport.codemods import compute_layers
from rocmport.codemods.feature_probes import module_name, probe_only_files
from tests.codemods.test_framework import make_tree
from tests.helpers.codemods import run_tree

# Shaped like upstream main (0.20.0): megatron/post_training imports modelopt at its top; training
# decides has_nvidia_modelopt by whether it imports (checkpointing.py l.85, `except Exception`), and
# calls into it under that flag; a tool imports another module of the package (no modelopt) at its top.
UTILS = "import modelopt\nimport modelopt.torch.quantization as mtq\n\n\ndef print_distributed_quant_summary(model):\n    return mtq.summary(model)\n"
CKPT = (
    "import modelopt.torch.opt as mto\n\n"
    "from megatron.post_training.utils import print_distributed_quant_summary\n\n\n"
    "def save_modelopt_state(model):\n    return mto.save(model)\n"
)
TRAINING_CKPT = """\
try:
    from megatron.post_training.utils import print_distributed_quant_summary

    has_nvidia_modelopt = True
except Exception:
    has_nvidia_modelopt = False


def save_checkpoint(model):
    if has_nvidia_modelopt:
        from megatron.post_training.checkpointing import save_modelopt_state

        return save_modelopt_state(model)
    return "saved without modelopt state"
"""
TREE = {
    "megatron/__init__.py": "",
    "megatron/post_training/__init__.py": "",
    "megatron/training/__init__.py": "",
    "megatron/post_training/utils.py": UTILS,
    "megatron/post_training/checkpointing.py": CKPT,
    "megatron/post_training/arguments.py": "def add_modelopt_args(parser):\n    return parser\n",
    "megatron/training/checkpointing.py": TRAINING_CKPT,
    "tools/__init__.py": "",
    "tools/run_server.py": "from megatron.post_training.arguments import add_modelopt_args\n",
    "tests/unit_tests/test_quant.py": "from megatron.post_training.utils import print_distributed_quant_summary\n",
    "examples/quantize.py": "import modelopt\nfrom megatron.post_training.checkpointing import save_modelopt_state\n",
}
CANDIDATES = ["megatron/post_training/utils.py", "megatron/post_training/checkpointing.py", "examples/quantize.py"]


def test_module_names():
    assert module_name("megatron/post_training/utils.py") == "megatron.post_training.utils"
    assert module_name("src/megatron/bridge/__init__.py") == "megatron.bridge"
    assert module_name("tests/functional-tests/x.py") is None


def test_probed_modules_are_found():
    # post_training/checkpointing.py is imported only inside a function, under the flag: no probe
    # decides by it, so it keeps its guard (harmless: nothing reaches it without modelopt).
    assert probe_only_files(TREE, CANDIDATES) == {
        "megatron/post_training/utils.py": ["megatron/training/checkpointing.py"]
    }


def test_a_probe_decides_by_what_it_imports_at_the_top():
    """model_builder.py imports checkpointing.py at its top: if checkpointing fails, the probe of
    model_builder (model_provider.py, a top-level script) says False, as upstream's does."""
    tree = {
        **TREE,
        "megatron/post_training/model_builder.py": "from megatron.post_training.checkpointing import save_modelopt_state\n",
        "model_provider.py": "try:\n    from megatron.post_training.model_builder import save_modelopt_state\nexcept ImportError:\n    pass\n",
    }
    assert probe_only_files(tree, CANDIDATES) == {
        "megatron/post_training/utils.py": ["megatron/training/checkpointing.py", "model_provider.py"],
        "megatron/post_training/checkpointing.py": ["model_provider.py"],
    }


@pytest.mark.parametrize(
    "importer, code",
    [
        (
            "pretrain_gpt.py",
            "from megatron.post_training.utils import print_distributed_quant_summary\n",
        ),  # a script's top
        (
            "megatron/training/training.py",
            "if True:\n    import megatron.post_training.checkpointing\n",
        ),  # top, in an if
        ("megatron/core/quant.py", "from megatron.post_training import utils\n"),  # by name from the package
        (
            "megatron/training/quant.py",
            "from ..post_training.utils import print_distributed_quant_summary\n",
        ),  # relative
    ],
)
def test_a_library_import_at_the_top_keeps_the_guard(importer, code):
    found = probe_only_files({**TREE, importer: code}, CANDIDATES)
    assert "megatron/post_training/utils.py" not in found


def test_no_probe_no_exception():
    tree = {**TREE, "megatron/training/checkpointing.py": "def f():\n    from megatron.post_training.utils import x\n"}
    assert probe_only_files(tree, CANDIDATES) == {}
    typing_only = {
        **tree,
        "megatron/training/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import megatron.post_training.utils\n",
    }
    assert probe_only_files(typing_only, CANDIDATES) == {}


def test_a_try_that_does_not_catch_import_errors_is_no_probe():
    tree = {
        **TREE,
        "megatron/training/checkpointing.py": TRAINING_CKPT.replace("except Exception:", "except KeyError:"),
    }
    assert probe_only_files(tree, CANDIDATES) == {}


def test_the_guard_reports_what_it_left_and_why(tmp_path):
    tree = make_tree(tmp_path / "t", TREE)
    guard = compute_layers(tree, ["guard-nvidia-only-imports"], jobs=1, cache_dir=tmp_path / "c").layers[0]
    assert sorted(guard.files) == ["examples/quantize.py", "megatron/post_training/checkpointing.py"]
    skips = {r.path: r for r in guard.all_reports() if r.kind == "skip"}
    assert set(skips) == {"megatron/post_training/utils.py"}
    message = skips["megatron/post_training/utils.py"].message
    assert "only behind feature probes (megatron/training/checkpointing.py)" in message and "nvidia-modelopt" in message


def test_a_change_elsewhere_is_not_served_from_the_cache(tmp_path):
    """The facts are part of each file's cache key: the probe's file changes, utils.py does not."""
    tree = make_tree(tmp_path / "t", TREE)
    first = compute_layers(tree, ["guard-nvidia-only-imports"], jobs=1, cache_dir=tmp_path / "c").layers[0]
    assert "megatron/post_training/utils.py" not in first.files
    (tree / "pretrain_gpt.py").write_text("from megatron.post_training.utils import print_distributed_quant_summary\n")
    second = compute_layers(tree, ["guard-nvidia-only-imports"], jobs=1, cache_dir=tmp_path / "c").layers[0]
    assert "HAVE_MODELOPT = False" in second.files["megatron/post_training/utils.py"]


def _ported(tmp_path) -> dict[str, str]:
    tree = make_tree(tmp_path / "t", TREE)
    layer = compute_layers(tree, ["guard-nvidia-only-imports"], jobs=1, cache_dir=tmp_path / "c").layers[0]
    return {rel: layer.files.get(rel, text) for rel, text in TREE.items() if rel.startswith("megatron/")}


PROBE = """
from megatron.training import checkpointing as c
print(c.has_nvidia_modelopt, c.save_checkpoint(object()))
"""
FAKE_MODELOPT = {
    "modelopt/__init__.py": "",
    "modelopt/torch/__init__.py": "",
    "modelopt/torch/quantization.py": "def summary(m):\n    return 'summary'\n",
    "modelopt/torch/opt.py": "def save(m):\n    return 'saved with modelopt state'\n",
}


@pytest.mark.torch
def test_the_probe_says_false_without_modelopt_and_training_goes_on(tmp_path):
    proc = run_tree(tmp_path / "run", _ported(tmp_path), PROBE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False saved without modelopt state"


@pytest.mark.torch
def test_the_probe_says_true_with_modelopt(tmp_path):
    proc = run_tree(tmp_path / "run", {**_ported(tmp_path), **FAKE_MODELOPT}, PROBE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True saved with modelopt state"


@pytest.mark.torch
def test_guarded_everywhere_the_probe_lies(tmp_path):
    """What the port did before (and does when a top-level import keeps the guard): the probe says True
    without modelopt and the save calls into it — the failure upstream main's checkpoint save met."""
    from tests.helpers.codemods import rewrite

    files = _ported(tmp_path)
    files["megatron/post_training/utils.py"] = rewrite(
        "guard-nvidia-only-imports", UTILS, "megatron/post_training/utils.py"
    )[0]
    proc = run_tree(tmp_path / "run", files, PROBE)
    assert proc.returncode != 0
    assert "needs the NVIDIA-only package 'nvidia-modelopt'" in proc.stderr
