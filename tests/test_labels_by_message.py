"""Stage 3 compares a failure on the two trees by its message as well as its type (tree paths and
line numbers normalised): the port's `cannot import name 'HAVE_TEE'` in a file the unported tree
cannot import either, for want of TE, is the port's regression, not needs-nvidia-only."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rocmport.nvidia_only import blocked
from rocmport.verify.orchestration import environment, firewall
from rocmport.verify.stages.unit_tests.labels import _on_baseline, label, same_message
from rocmport.verify.stages.unit_tests.results import SuiteRun, UnitTestsRun
from rocmport.verify.stages.unit_tests.stage import stage_unit_tests
from tests.helpers.sync import g

BLOCKED = blocked("cpu-proxy")

# megatron's TE guard and a layer-spec module that builds its TE spec at import (as
# core's models/bert/bert_layer_specs.py does on main): without TE the module does not import.
TE_GUARD = textwrap.dedent("""\
    try:
        import transformer_engine  # noqa: F401

        HAVE_TE = True
    except ImportError:
        HAVE_TE = False
    """)
SPECS = textwrap.dedent("""\
    from megatron.core.extensions.transformer_engine import HAVE_TE


    def get_layer_with_transformer_engine_spec():
        if not HAVE_TE:
            raise ImportError("Transformer Engine is not installed. Please use local Bert layer spec instead.")
        return "te-spec"


    layer_with_transformer_engine_spec = get_layer_with_transformer_engine_spec()
    """)
MATHOPS = textwrap.dedent("""\
    def div(a, b):
        if b == 0:
            raise ValueError("division by zero is upstream's bug")
        return a / b


    def check(size):
        raise ValueError(f"bad size {size}")
    """)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def have_tee_repo(root: Path) -> tuple[Path, str]:
    """Upstream at its first commit; the port (second commit) misspells the Bert spec's HAVE_TE import
    (the bug injected on a hop of main), rewrites mathops.py (its lines move down, as a codemod's
    inserted import moves them) and changes the message one of its functions raises."""
    _write(
        root,
        {
            "megatron/__init__.py": "",
            "megatron/core/__init__.py": "",
            # the RNG hooks the proxy shim backs with the CPU generator
            "megatron/core/tensor_parallel/__init__.py": "",
            "megatron/core/tensor_parallel/random.py": "def _get_cuda_rng_state():\n    pass\n\n\n"
            "def _set_cuda_rng_state(state):\n    pass\n\n\nclass CudaRNGStatesTracker:\n    pass\n",
            "megatron/core/extensions/__init__.py": "",
            "megatron/core/extensions/transformer_engine.py": TE_GUARD,
            "megatron/core/models/__init__.py": "",
            "megatron/core/models/bert/__init__.py": "",
            "megatron/core/models/bert/bert_layer_specs.py": SPECS,
            "megatron/core/models/gpt/__init__.py": "",
            "megatron/core/models/gpt/gpt_layer_specs.py": SPECS,
            "megatron/core/mathops.py": MATHOPS,
            # the file of the hop: on the unported tree it does not import for want of TE; on the port, for HAVE_TEE
            "tests/unit_tests/test_bert_model.py": "from megatron.core.models.bert.bert_layer_specs import "
            "layer_with_transformer_engine_spec\n\n\ndef test_spec():\n    assert layer_with_transformer_engine_spec\n",
            # the same import failure on both trees: still needs-nvidia-only
            "tests/unit_tests/test_gpt_model.py": "from megatron.core.models.gpt.gpt_layer_specs import "
            "layer_with_transformer_engine_spec\n\n\ndef test_spec():\n    assert layer_with_transformer_engine_spec\n",
            # the same ImportError on both, naming each tree's own path to mathops.py: upstream-known
            "tests/unit_tests/test_missing_name.py": "from megatron.core.mathops import MISSING  # noqa: F401\n\n\n"
            "def test_never():\n    pass\n",
            "tests/unit_tests/test_ops.py": "from megatron.core import mathops\n\n\n"
            "def test_upstream_bug():\n    mathops.div(1, 0)\n\n\n"
            "def test_changed_message():\n    mathops.check(3)\n",
        },
    )
    g(root, "init", "-q", "-b", "main")
    g(root, "add", "-A")
    g(root, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "upstream")
    base = g(root, "rev-parse", "HEAD")
    specs = root / "megatron/core/models/bert/bert_layer_specs.py"
    specs.write_text(specs.read_text().replace("import HAVE_TE\n", "import HAVE_TEE as HAVE_TE\n"))
    ported = "import os  # inserted by the port\nimport sys  # inserted by the port\n\n\n" + MATHOPS
    (root / "megatron/core/mathops.py").write_text(
        ported.replace('f"bad size {size}"', 'f"size {size} is not divisible"')
    )
    g(root, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qam", "port")
    return root, base


@pytest.fixture
def child_env(tmp_path):
    """verify's environment for the started processes: the bootstrap and the cpu-proxy firewall (TE absent)."""

    def make(tree: Path) -> dict:
        return environment.child_env(
            tree, firewall.write_bootstrap(tmp_path / "boot"), firewall.firewall_env("cpu-proxy")
        )

    return make


FILES = [
    "tests/unit_tests/test_bert_model.py",
    "tests/unit_tests/test_gpt_model.py",
    "tests/unit_tests/test_missing_name.py",
    "tests/unit_tests/test_ops.py",
]


@pytest.mark.torch
@pytest.mark.slow
def test_the_port_s_have_tee_import_error_is_a_port_regression_not_the_unported_tree_s(tmp_path, child_env):
    tree, base = have_tee_repo(tmp_path / "up")
    res = stage_unit_tests(tree, child_env(tree), FILES, 2, {}, tmp_path / "cache", base, blocked=BLOCKED)
    d = res.details
    assert isinstance(d, UnitTestsRun)
    assert d.labels == {
        # both do not import, the port for its own misspelt import: the message names the TE module, not TE's absence
        "tests/unit_tests/test_bert_model.py": "port-regression",
        "tests/unit_tests/test_gpt_model.py": "needs-nvidia-only",
        # the trees' paths to mathops.py differ, and the port moved its lines: the same failure
        "tests/unit_tests/test_missing_name.py": "upstream-known",
        "tests/unit_tests/test_ops.py::test_upstream_bug": "upstream-known",
        # the same ValueError, raised with another message by the port's rewritten function
        "tests/unit_tests/test_ops.py::test_changed_message": "port-regression",
    }
    assert res.status == "fail"
    bert = "tests/unit_tests/test_bert_model.py"
    # the report shows both messages: the port's (its failure, and in the reason) and the unported tree's
    assert "cannot import name 'HAVE_TEE'" in d.failures[bert]
    assert "cannot import name 'HAVE_TEE'" in d.label_reasons[bert]
    assert "Transformer Engine is not installed" in d.label_reasons[bert]
    assert d.on_baseline[bert].startswith("error: ") and "Transformer Engine is not installed" in d.on_baseline[bert]
    changed = "tests/unit_tests/test_ops.py::test_changed_message"
    assert "size 3 is not divisible" in d.label_reasons[changed] and "bad size 3" in d.label_reasons[changed]
    assert d.on_baseline["tests/unit_tests/test_ops.py::test_upstream_bug"] == "failed"  # the same: no message repeated
    assert d.on_baseline["tests/unit_tests/test_gpt_model.py"] == "error"


def test_messages_are_compared_without_the_trees_paths_line_numbers_addresses_or_a_cut_tail():
    port_tree, base_tree = "/tmp/pytest-of-u/pytest-7/test_x0/up", "/tmp/rocmport-base-k2j4_x9q/tree"
    imp = "E   ImportError: cannot import name 'MISSING' from 'megatron.core.mathops' ({}/megatron/core/mathops.py)"
    assert same_message(imp.format(port_tree), imp.format(base_tree))
    assert not same_message(imp.format(port_tree), imp.format(base_tree).replace("MISSING", "OTHER"))
    # a rewritten file's lines move: its site's line number is not part of the failure
    assert same_message("ValueError: bad at megatron/core/x.py:12", "ValueError: bad at megatron/core/x.py:10")
    assert not same_message("ValueError: bad at megatron/core/x.py:12", "ValueError: bad at megatron/core/y.py:12")
    # a site outside the tree, written relative to each run's working directory
    assert same_message(
        "RuntimeError: boom at ../../venv/lib/python3.12/site-packages/torch/nn/x.py:5",
        "RuntimeError: boom at ../../../../work/venv/lib/python3.12/site-packages/torch/nn/x.py:9",
    )
    assert same_message('File "megatron/a.py", line 4, in f', 'File "megatron/a.py", line 40, in f')
    assert same_message(
        "AssertionError: <Foo object at 0x7f3a2b1c> is None", "AssertionError: <Foo object at 0x55d0e1> is None"
    )
    assert same_message(
        "RuntimeError: Connection closed by peer [127.0.0.1]:29512 (pid 4411)",
        "RuntimeError: Connection closed by peer [127.0.0.1]:41007 (pid 981)",
    )
    assert not same_message("AssertionError: assert 3 == 4", "AssertionError: assert 3 == 5")
    # a test's failure is compared without its values (an assertion prints values no run reproduces: the
    # line matrix's v0.15 test_chained_optimizer), its words and site still
    chained = "assert False + where False = tensor([[[[{}, 5.1130e-03],\\n [{}, 3]]]]) at tests/t.py:{}"
    assert not same_message(chained.format("-1.0840e-02", "-5.48e-03", 8), chained.format("-8.04e-04", " 6.7e-03", 8))
    assert same_message(
        chained.format("-1.0840e-02", "-5.48e-03", 8), chained.format("-8.04e-04", " 6.7e-03", 9), numbers=False
    )
    # the pair itself (v0.15, 8 ranks: the port's failure in the report, the unported tree's in its cached baseline)
    here = (
        "assert False + where False = tensor([[[[-1.0840e-02, 5.1130e-03, 2.2792e-03, 1.7511e-03, -2.5360e-03],\\n "
        "[-5.4883e-03, -7.8598e-03, 8.3...-3.8718e-03, -1.7421e-03, 2.0089e-03],\\n [-8.2038e-04, -4.5179e-03, "
        "2.9769e-03, -2.3891e-04, -7.4006e- at tests/unit_tests/test_optimizer.py:98"
    )
    there = (
        "assert False + where False = tensor([[[[-8.0444e-04, -9.0834e-03, 4.4659e-03, -1.0117e-03, -6.7831e-03],\\n "
        "[ 6.7654e-03, -4.6182e-03, 5.1...-1.8377e-03, -4.1119e-03, 1.5651e-02],\\n [-2.0600e-03, -8.2085e-03, "
        "2.0194e-02, -2.5495e-03, -4.1134 at tests/unit_tests/test_optimizer.py:98"
    )
    assert same_message(here, there, numbers=False) and not same_message(here, there)
    here = (  # v0.16's (torch elides the middle of each; a positive value after the ellipsis is padded)
        "assert False + where False = tensor([[[[ 8.1625e-03, 1.0724e-03, -2.9680e-03, -2.8192e-03, 9.1576e-04],\\n "
        "[-8.7740e-03, 9.1020e-04, 2.0...-8.6059e-03, 1.9751e-03, -2.1894e-03],\\n [ 4.0140e-03, 2.0496e-03, "
        "1.4066e-04, -2.9311e-03, 5.7304e-04 at tests/unit_tests/test_optimizer.py:332"
    )
    there = (
        "assert False + where False = tensor([[[[-1.6254e-03, 4.5143e-03, 1.8452e-03, -1.1621e-02, -6.0794e-03],\\n "
        "[ 5.7659e-03, -3.5563e-03, -7.3... 3.3981e-03, 4.7481e-03, -4.9218e-03],\\n [ 2.1256e-03, 1.1170e-02, "
        "-3.3631e-03, 8.1246e-03, -4.6153e at tests/unit_tests/test_optimizer.py:332"
    )
    assert same_message(here, there, numbers=False) and not same_message(here, there)
    assert not same_message("KeyError: 'w1' at tests/t.py:3", "KeyError: 'w2' at tests/t.py:3", numbers=False)
    assert not same_message("ValueError: bad size 3", "ValueError: size 3 is not divisible", numbers=False)
    # the plugin keeps 240 characters of a message: a longer tree path cuts it earlier
    long = "ImportError: cannot import name 'X' from 'megatron.core.m' ({}/megatron/core/" + "m" * 200 + ".py)"
    assert same_message(long.format(port_tree)[:240], long.format(base_tree + "/deeper")[:240])
    assert not same_message(long.format(port_tree)[:240], long.replace("'X'", "'Y'").format(base_tree)[:240])


def test_a_different_message_on_both_trees_naming_the_firewalled_package_stays_needs_nvidia_only():
    """The port's guard lets the import go further, to megatron's own "not installed" error: both
    trees fail for want of TE (the reason says both messages); an empty message on one side is compared by type."""
    mod = "t/test_m.py"
    port = {
        "outcomes": {mod: "error", "t/test_n.py": "error"},
        "kinds": {mod: "ImportError", "t/test_n.py": "ImportError"},
        "details": {mod: "E   ImportError: Transformer Engine is not installed.", "t/test_n.py": "E   ImportError: x"},
    }
    base = {
        "outcomes": {mod: "error", "t/test_n.py": "error"},
        "kinds": {mod: "ImportError", "t/test_n.py": "ImportError"},
        "details": {mod: "E   ModuleNotFoundError: No module named 'transformer_engine'"},
    }
    labels, why = label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), {}, blocked=BLOCKED)
    assert labels == {mod: "needs-nvidia-only", "t/test_n.py": "upstream-known"}
    assert "Transformer Engine is not installed" in why[mod] and "No module named 'transformer_engine'" in why[mod]
    # the unported tree's message beside its outcome where the two differ, also by type; not for a hang's record
    assert _on_baseline(mod, SuiteRun.from_dict(base), SuiteRun.from_dict(port)) == (
        "error: E   ModuleNotFoundError: No module named 'transformer_engine'"
    )
    base["kinds"][mod] = "ModuleNotFoundError"
    assert _on_baseline(mod, SuiteRun.from_dict(base), SuiteRun.from_dict(port)).startswith("error: E   ModuleNotF")
    assert label(SuiteRun.from_dict(port), SuiteRun.from_dict(base), {}, blocked=BLOCKED)[0][mod] == "unverified"
    port["kinds"][mod] = base["kinds"][mod] = "hang"
    assert _on_baseline(mod, SuiteRun.from_dict(base), SuiteRun.from_dict(port)) == "error"


def test_a_cut_message_is_compared_before_its_site():
    """A test's message cut at 240 characters, then its site: the site still counts, the cut tail does not."""
    msg = "AssertionError: " + "w " * 100 + "({}/megatron/core/m.py)"
    here = msg.format("/tmp/pytest-of-u/pytest-7/test_x0/up")[:240] + " at megatron/core/m.py:7"
    there = msg.format("/tmp/rocmport-base-k2j4_x9q/tree/deeper")[:240] + " at megatron/core/m.py:9"
    assert same_message(here, there)
    assert not same_message(here, there.replace("m.py:9", "n.py:9"))
    assert not same_message(here, there.replace("w w w", "w v w", 1))


def test_a_failure_raised_through_rocmport_s_own_shim_compares_without_the_relative_path_to_it():
    """Measured on v0.16 (--unit-tests reach): test_multi_latent_attention.py failed on both trees with the
    same pin_memory error raised in proxy_shim.py, its site written relative to each tree's working
    directory at another depth; labelled port-regression for the path alone."""
    msg = (
        "RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no pinned memory allocator "
        "is available on this system. at {}rocmport/verify/runtime/proxy_shim.py:116"
    )
    assert same_message(msg.format("../../../../main/"), msg.format("../../../../work/main/"))
    assert same_message(msg.format("/site/lib/python3.12/site-packages/"), msg.format("../../"))
    assert not same_message(
        msg.format("../../"), msg.format("../../").replace("proxy_shim.py", "hip_sim.py")
    )  # another file of rocmport's is another site


def failed(test: str, detail: str, kind: str = "RuntimeError") -> SuiteRun:
    """One tree's suite run in which ``test`` failed with ``detail``, an exception of type ``kind``."""
    return SuiteRun(outcomes={test: "failed"}, details={test: detail}, kinds={test: kind})


def test_a_failure_raised_in_the_proxy_shim_on_both_trees_is_a_proxy_artifact_not_upstream_known():
    """Measured on v0.16 (--unit-tests reach): the context-parallel MLA tests fail on both trees with the
    same pin_memory error (the CPU proxy has no pinned-memory allocator): the proxy's, not upstream's,
    whether sited in proxy_shim.py (where the shim acted) or in megatron's own code (the plugin sites a
    failure past the shim's pass-through there: the message names the CPU backend's lack); a failure
    raised in megatron's own code with no such message stays upstream-known."""
    test = "tests/unit_tests/transformer/test_multi_latent_attention.py::test_forward"
    shim = "RuntimeError: pin_memory=True requires a CUDA or other accelerator backend at {}rocmport/verify/runtime/proxy_shim.py:116"
    own = "RuntimeError: pin_memory=True requires a CUDA or other accelerator backend at megatron/core/x.py:{}"
    upstreams = "RuntimeError: a view of a leaf Variable that requires grad is being used in an in-place operation. at megatron/core/x.py:{}"

    def run(detail: str) -> SuiteRun:
        return failed(test, detail)

    labels, why = label(run(shim.format("../../main/")), run(shim.format("../../work/main/")), {})
    assert labels[test] == "proxy-artifact" and "proxy_shim.py" in why[test] and "pin_memory" in why[test]
    labels, why = label(run(own.format(12)), run(own.format(10)), {})
    assert labels[test] == "proxy-artifact" and "through the CPU backend (RuntimeError: pin_memory" in why[test]
    labels, _ = label(run(upstreams.format(12)), run(upstreams.format(10)), {})
    assert labels[test] == "upstream-known"


def test_another_type_on_the_unported_tree_and_the_cpu_backend_s_lack_here_is_a_proxy_artifact():
    """Measured on v0.19 (TE 2.17.1, --unit-tests reach): test_te_layers_batch_invariant.py's GEMM parity
    tests fail on the unported tree with `general_gemm() got an unexpected keyword argument 'workspace'`
    (the TE API the port's te_accepts gate adapts to) and on the port further on, with the batch-invariant
    GEMM's "requires CUDA tensors" (the proxy's tensors are on the CPU): the proxy's gap, not unverified.
    Another type there with a failure here that names no CPU-backend lack stays unverified
    (test_upcycling.py's granularity-2 TE tests: an AssertionError here, APEX's missing kernel there)."""
    test = "tests/unit_tests/transformer/test_te_layers_batch_invariant.py::test_bik_te_general_gemm_numerical_parity[dtype0]"
    here = "RuntimeError: Batch-invariant GEMM requires CUDA tensors. at megatron/core/transformer/custom_layers/batch_invariant_kernels.py:957"
    there = "TypeError: general_gemm() got an unexpected keyword argument 'workspace' at megatron/core/extensions/transformer_engine.py:3552"
    labels, why = label(failed(test, here), failed(test, there, "TypeError"), {}, blocked=BLOCKED)
    assert labels[test] == "proxy-artifact"
    assert "TypeError there: TypeError: general_gemm() got an unexpected keyword argument 'workspace'" in why[test]
    assert "through the CPU backend (RuntimeError: Batch-invariant GEMM requires CUDA tensors." in why[test]

    upcycling = "tests/unit_tests/transformer/moe/test_upcycling.py::TestGPTModel::test_upcycling_TE[tp_ep1-2-False-False-False]"
    mismatch = "AssertionError: The output of moe model do not match the output of dense model. at tests/unit_tests/transformer/moe/test_upcycling.py:337"
    apex = (
        "RuntimeError: ColumnParallelLinear was called with gradient_accumulation_fusion set to True but the custom"
        " CUDA extension fused_weight_gradient_mlp_cuda module is not found. at megatron/core/tensor_parallel/layers.py:1071"
    )
    labels, why = label(failed(upcycling, mismatch, "AssertionError"), failed(upcycling, apex), {}, blocked=BLOCKED)
    assert labels[upcycling] == "unverified" and "RuntimeError there, AssertionError here" in why[upcycling]


def test_the_same_type_with_the_cpu_backend_s_lack_here_is_a_proxy_artifact_not_the_port_s():
    """The same type on both trees with another message: the port's, unless its message names what the
    CPU backend lacks (v0.19's test_attention.py when recorded: 46 TE tests labelled port-regression
    for "Found no NVIDIA driver on your system", the unported tree stopping earlier with another
    RuntimeError). Another message that names no lack stays the port's (seen failing: port-regression)."""
    test = "tests/unit_tests/transformer/test_attention.py::TestParallelAttention::test_gpu_forward"
    here = "RuntimeError: Found no NVIDIA driver on your system. at rocmport/verify/runtime/proxy_shim.py:88"
    there = "RuntimeError: general_gemm() got an unexpected keyword argument 'workspace' at megatron/core/extensions/transformer_engine.py:3552"
    base = failed(test, there)
    labels, why = label(failed(test, here), base, {}, blocked=BLOCKED)
    assert labels[test] == "proxy-artifact", why[test]
    assert "fails through the CPU backend (RuntimeError: Found no NVIDIA driver" in why[test]
    assert "general_gemm() got an unexpected keyword argument 'workspace'" in why[test]
    other = "RuntimeError: cannot import name 'HAVE_TEE' at megatron/core/extensions/transformer_engine.py:12"
    labels, _ = label(failed(test, other), base, {}, blocked=BLOCKED)
    assert labels[test] == "port-regression"
