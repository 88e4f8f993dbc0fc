"""Reach variants (stage 6): the declared list's flags on a line's own argument parser, each
variant's outcome from its run, its sites recorded in its own directory and into the reach record as
a third kind of entry, and `--variants reach`'s selection from that record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocmport.config import Settings
from rocmport.errors import BadInput
from rocmport.verify.analyses import port_sites, reach
from rocmport.verify.analyses.reach import Entry
from rocmport.verify.orchestration import firewall
from rocmport.verify.orchestration.contract import NotRequested, RunSetup
from rocmport.verify.orchestration.stage_result import skipped
from rocmport.verify.orchestration.te_layer import TELayer
from rocmport.verify.runtime import protocol
from rocmport.verify.stages import variants
from rocmport.verify.stages.functional.case_run import case_sites_env, note_case_seconds
from rocmport.verify.stages.variant_list import BY_NAME, VARIANTS
from tests.test_reach import keys_of, ported_tree, run_in
from tests.helpers.lines import LINE_PYTHON

MIRROR = os.environ.get("ROCMPORT_TEST_MLM_MIRROR")


def record_with(series_dir: Path, upstream: str, cases: dict, tests: dict, variant_entries: dict) -> None:
    reach.write_record(
        series_dir,
        reach.ReachRecord(
            line=series_dir.name,
            upstream=upstream,
            recipe=reach.recipe_digest(series_dir),
            cases=cases,
            unit_tests=tests,
            variants=variant_entries,
            partial=True,
            holds="a hand-made record",
        ),
    )


# --- the declared list -------------------------------------------------------------------------


def test_every_variant_names_flags_sites_and_why_and_its_sites_are_stable_keys():
    assert len({v.name for v in VARIANTS}) == len(VARIANTS)
    for v in VARIANTS:
        assert v.flags and v.sites and v.why, v.name
        # a stable key: file::function helper#n [codemod]
        assert all("::" in s and "#" in s and s.endswith("]") for s in v.sites), v.name
        assert any(f in v.why for f in v.flags if f.startswith("--")), f"{v.name}: why names no flag of its own"


# Variants whose flags a line's parser refuses (the worker's not-applicable), by the tag of the line:
# v0.16 has no absorbed MLA nor the DSA indexer's rotation switch the absorbed-MLA variants turn off.
REFUSED_ON = {
    "core_v0.16.1": {"fp8-tensorwise-absorbed-mla", "fp4-absorbed-mla"},
    "core_v0.19.0": set(),
}


@pytest.mark.mirror
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.skipif(not MIRROR, reason="set ROCMPORT_TEST_MLM_MIRROR to a local Megatron-LM mirror")
@pytest.mark.parametrize("tag", sorted(REFUSED_ON))
def test_the_declared_flags_parse_on_the_line_s_own_argument_parser(tmp_path, tag):
    """Each variant's flags, after the small GPT's sizes, through the tag's parse_args (exported
    from the mirror): none refused but the ones the line lacks (REFUSED_ON, e.g. the absorbed-MLA
    variants on v0.16), and a flag no line has is refused by the same parser (the worker's
    not-applicable)."""
    tree = tmp_path / "mlm"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "--git-dir", str(MIRROR), "archive", tag, "megatron"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    flags = {v.name: list(v.flags) for v in VARIANTS} | {"absent": ["--no-such-flag-in-any-line"]}
    code = (
        "import json, sys\n"
        "from rocmport.verify.runtime.gpt_worker import variant_base_flags\n"
        "from megatron.training.arguments import parse_args\n"
        "out = {}\n"
        f"for name, flags in json.loads({json.dumps(json.dumps(flags))}).items():\n"
        "    sys.argv = ['x', *variant_base_flags(1, 1, 1, 3), *flags]\n"
        "    try:\n"
        "        a = parse_args()\n"
        "        out[name] = 'parsed'\n"
        "    except SystemExit as e:\n"
        "        out[name] = f'refused {e.code}'\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(Path(__file__).resolve().parents[1])])}
    # v0.17+ need Python 3.12 (typing.override): the line's interpreter (tests/helpers/lines.py)
    python = sys.executable if tag < "core_v0.17" else LINE_PYTHON
    if not python:
        pytest.skip(f"{tag} needs Python 3.12: set ROCMPORT_TEST_PYTHON312 to a Python 3.12 that has torch")
    proc = subprocess.run([python, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.pop("absent") == "refused 2"
    assert out == {v.name: "refused 2" if v.name in REFUSED_ON[tag] else "parsed" for v in VARIANTS}


def test_variants_option_takes_reach_all_none_and_names_and_refuses_unknown_ones():
    assert variants.parse_variants("reach") == ("reach", ())
    assert variants.parse_variants("all") == ("all", ())
    assert variants.parse_variants("fp4-mla, softmax-off-by-one") == ("names", ("fp4-mla", "softmax-off-by-one"))
    with pytest.raises(BadInput, match=r"--variants: no variant nope; give reach, all, none or names among"):
        variants.parse_variants("fp4-mla,nope")


def test_a_tree_without_megatron_training_makes_the_stage_not_applicable_with_or_without_te(tmp_path):
    """A package-index tree ships megatron/core only: a variant's flags go through megatron.training's
    parse_args, so stage 6 is skipped as not applicable (a tree_lacks reason, the verdict counts it
    apart), not "pass --te" nor a failure; a git tree with --te runs it."""
    tree = tmp_path / "tree"
    (tree / "megatron" / "core").mkdir(parents=True)
    layer = TELayer("2.12.0", tmp_path / "te", "python", "cached")

    def setup(te):
        return RunSetup(
            Settings(tmp_path),
            tree,
            tree_given=True,
            tp=1,
            pp=1,
            dp=1,
            iters=3,
            series=None,
            series_dir=None,
            base=None,
            te=lambda: te,
        )

    for te in (layer, None):
        checked = variants.STAGE.check({"variants": "all"}, setup(te))
        assert isinstance(checked, NotRequested), checked
        assert checked.why == "the tree has no megatron/training (a package-index source ships megatron/core only)"
        assert skipped(variants.NAME, checked.why).applicable is False
    assert variants.STAGE.check({"variants": "none"}, setup(layer)) == NotRequested("--variants none")
    (tree / "megatron" / "training").mkdir()
    assert variants.STAGE.check({"variants": "all"}, setup(layer)) == variants.VariantsOptions(
        "all", (), None, "cpu-proxy-te2.12.0"
    )
    assert "pass --te" in variants.STAGE.check({"variants": "all"}, setup(None)).why


# --- a variant's outcome -----------------------------------------------------------------------


def test_a_variant_ends_pass_unsupported_not_applicable_or_fail_never_silently():
    fp4, softmax = BY_NAME["fp4-mla"], BY_NAME["softmax-off-by-one"]
    ok = variants.outcome(softmax, 0, {"losses": [4.9, 4.8, 4.7]}, "", 3)
    assert ok[0] == "pass" and ok[2] == [4.9, 4.8, 4.7]
    refused = variants.outcome(softmax, 0, {"not_applicable": "error: unrecognized arguments: --softmax-type"}, "", 3)
    assert refused[0] == "not-applicable" and "--softmax-type" in refused[1]
    kernel = variants.outcome(fp4, 3, {"unsupported": "unsupported-in-proxy: transformer_engine_torch.x"}, "", 3)
    assert kernel == ("unsupported-in-proxy", "unsupported-in-proxy: transformer_engine_torch.x", [])
    # the declared stop: after the sites ran, the NVFP4 quantization TE's CPU layer lacks
    stderr = "[rank0]: Traceback ...\n[rank0]: RuntimeError: NVFP4 quantization needs a GPU\n"
    stop = variants.outcome(fp4, 1, None, stderr, 3)
    assert stop[0] == "unsupported-in-proxy" and stop[1].startswith("TE's CPU layer has no NVFP4")
    assert "RuntimeError: NVFP4 quantization needs a GPU" in stop[1]
    # the declared text elsewhere than in the exception's own line (a flag, a log line) is no stop
    logged = "[rank0]: building NVFP4 recipe\n[rank0]: RuntimeError: Output 0 of _Linear is a view\n"
    assert variants.outcome(fp4, 1, None, logged, 3) == ("fail", "RuntimeError: Output 0 of _Linear is a view", [])
    # the same stop in a variant that does not declare it is a failure, naming the exception
    assert variants.outcome(softmax, 1, None, stderr, 3) == ("fail", "RuntimeError: NVFP4 quantization needs a GPU", [])
    # a run that exits 0 with a NaN loss or too few iterations did not pass
    assert variants.outcome(softmax, 0, {"losses": [4.9, float("nan"), 4.7]}, "", 3)[0] == "fail"
    assert variants.outcome(softmax, 0, {"losses": [4.9]}, "", 3)[0] == "fail"


# --- recording ---------------------------------------------------------------------------------


def test_a_variant_records_its_sites_in_its_own_directory_and_the_record_keeps_them_apart(tmp_path):
    tree, series_dir, base = ported_tree(tmp_path)
    boot = firewall.write_bootstrap(tmp_path / "boot")
    records = tmp_path / "sites"
    (records / "variants").mkdir(parents=True)
    stage_env = protocol.PORT_SITES.entry(str(records / "variants"))
    env = case_sites_env(stage_env, "softmax-off-by-one", kind="variant")
    assert protocol.PORT_SITES.read(env) == str(records / "variants" / "variant=softmax-off-by-one")
    run_in(tree, boot, env, "from megatron.core import a; a.probe()")  # a real process records the site
    note_case_seconds(env, 12.5, "pass")
    units = port_sites.read_units(records, tree)
    assert units["variant", "softmax-off-by-one"].seconds == 12.5
    assert units["variant", "softmax-off-by-one"].outcome == "pass"

    path, record = reach.record_run(series_dir, tree, records, {}, None, (1, 2))
    key = keys_of(tree, base)["megatron/core/a.py:11 is_hip"]
    data = json.loads(path.read_text())
    assert data["variants"] == {"softmax-off-by-one": {"sites": [key], "seconds": 12.5, "outcome": "pass"}}
    assert data["cases"] == {} and data["unit_tests"] == {}  # a variant is neither
    assert ", 1 reach variants, 1 of the" in data["holds"]
    again = reach.read_record(series_dir)
    assert again == record and again.ran_by()[key] == ["variant: softmax-off-by-one"]
    # an unreached site that only a variant ran is explained by it
    why = reach.site_class(
        "capability-gates", "megatron/core/a.py", "nvidia_arch_major", key, "", again.ran_by(), {}, again
    )
    assert why == "reachable, not selected (ran by variant: softmax-off-by-one when recorded)"


def test_a_broken_variant_entry_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "series").write_text("x\n")
    record_with(tmp_path, "c0ffee", {}, {}, {"v": Entry(frozenset({"s"}), 3.0, outcome="pass")})
    data = json.loads((tmp_path / "reach.json").read_text())
    data["variants"]["v"]["seconds"] = "soon"
    (tmp_path / "reach.json").write_text(json.dumps(data))
    with pytest.raises(BadInput, match=r"reach\.json: not a reach record \(variants\['v'\]\.seconds is not a number"):
        reach.read_record(tmp_path)


# --- --variants reach --------------------------------------------------------------------------


def test_variants_reach_runs_the_unrecorded_and_those_adding_sites_the_selection_does_not_run(tmp_path):
    (tmp_path / "series").write_text("x\n")
    declared = ["a", "b", "c", "d", "never", "refused", "broke"]
    record_with(
        tmp_path,
        "c0ffee",
        {"case": Entry(frozenset({"s1", "s2"}), 100.0, outcome="pass")},
        {},
        {
            "a": Entry(frozenset({"s1"}), 20.0, outcome="pass"),  # covered by the selected case: not needed
            "b": Entry(frozenset({"s3", "s4"}), 30.0, outcome="pass"),
            "c": Entry(frozenset({"s5"}), 25.0, outcome="unsupported-in-proxy"),  # ran its site, then the kernel
            "d": Entry(frozenset({"s6"}), 500.0, outcome="pass"),  # over the budget
            "refused": Entry(frozenset(), 5.0, outcome="not-applicable"),
            "broke": Entry(frozenset({"s7"}), 5.0, outcome="fail"),
        },
    )
    names, why = reach.reach_variants(tmp_path, declared, covered={"s1", "s2"})
    assert names == ["b", "c", "never"]
    assert why.startswith(
        "reach: 3 of 7 variants; 2 recorded run 3 port sites the selected cases and test files do not, in 55 s"
    )
    assert "1 never recorded (their sites unknown): run (never)" in why
    assert (
        "2 ended neither pass nor unsupported-in-proxy when recorded (refused: not-applicable, broke: fail): not selected"
        in why
    )
    # no record at all: every declared variant runs (none recorded)
    (tmp_path / "reach.json").unlink()
    assert reach.reach_variants(tmp_path, declared, set())[0] == declared


def test_the_stage_s_reach_selection_counts_the_record_s_selected_cases_and_test_files(tmp_path):
    """stage 6 with `--variants reach`: the covered sites are the record's shared ones and those of the
    cases and test files reach selects for this tree (here the one recorded test file)."""
    tree, series_dir, _ = ported_tree(tmp_path)
    record_with(
        series_dir,
        "c0ffee",
        {},
        {"tests/unit_tests/test_arch.py": Entry(frozenset({"s1"}), 3.0)},
        {
            "softmax-off-by-one": Entry(frozenset({"s1"}), 20.0, outcome="pass"),
            "fp4-mla": Entry(frozenset({"s9"}), 20.0, outcome="unsupported-in-proxy"),
        },
    )
    names, why = variants._selected(variants.VariantsOptions("reach", (), series_dir), tree)
    assert "softmax-off-by-one" not in names and "fp4-mla" in names
    assert set(names) == {"fp4-mla"} | {v.name for v in VARIANTS} - {"softmax-off-by-one", "fp4-mla"}
    assert variants._selected(variants.VariantsOptions("all", (), series_dir), tree)[0] == [v.name for v in VARIANTS]


def test_the_stage_s_reach_selection_counts_the_cases_stage_4_picks_with_their_golden_first(tmp_path):
    """Stage 4's reach puts the cases with a golden for the run's device kind first (here the TE
    layer's, `cpu-proxy-te2.12.0`); stage 6 counts the sites of those same cases as covered. Two
    recorded cases that do not both fit the budget: the golden one runs, so the variant aiming at the
    other case's site is the one needed."""
    tree, series_dir, _ = ported_tree(tmp_path)
    for name in ("big", "gold"):
        config = tree / "tests/functional_tests/test_cases/gpt" / name / "model_config.yaml"
        config.parent.mkdir(parents=True)
        config.write_text("MODEL_ARGS:\n  --num-layers: 2\n")
    (series_dir / "goldens").mkdir()
    (series_dir / "goldens" / "gold.cpu-proxy-te2.12.0.json").write_text("{}\n")
    record_with(
        series_dir,
        "c0ffee",
        {
            "big": Entry(frozenset({"s1", "s2"}), 700.0, outcome="pass"),
            "gold": Entry(frozenset({"s3"}), 700.0, outcome="pass"),
        },
        {},
        {
            "softmax-off-by-one": Entry(frozenset({"s1"}), 20.0, outcome="pass"),
            "fp4-mla": Entry(frozenset({"s3"}), 20.0, outcome="unsupported-in-proxy"),
        },
    )
    (tree / "megatron" / "training").mkdir()
    recorded = {"softmax-off-by-one", "fp4-mla"}

    def picked(te_version: str) -> set[str]:
        layer = TELayer(te_version, tmp_path / "te", "python", "cached")
        setup = RunSetup(
            Settings(tmp_path),
            tree,
            tree_given=False,
            tp=1,
            pp=1,
            dp=1,
            iters=3,
            series=None,
            series_dir=series_dir,
            base=None,
            te=lambda: layer,
        )
        options = variants.STAGE.check({"variants": "reach"}, setup)
        assert isinstance(options, variants.VariantsOptions), options
        return recorded & set(variants._selected(options, tree)[0])

    assert picked("2.12.0") == {"softmax-off-by-one"}  # gold ran: s1 is the variant's to run
    # another TE release has no golden: the cover takes the case with more sites, big (s1, s2)
    assert picked("2.17.1") == {"fp4-mla"}


# --- one real variant on the proxy ----------------------------------------------------------------


@pytest.mark.mirror
@pytest.mark.network
@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.skipif(not MIRROR, reason="set ROCMPORT_TEST_MLM_MIRROR to a local Megatron-LM mirror")
def test_a_variant_run_on_the_proxy_records_its_site_as_run(tmp_path, real_index):
    """v0.16's port of the mirror, TE's Python layer: `--stages variants --variants softmax-off-by-one
    --record-reach` runs the small GPT with --softmax-type off-by-one, and the record's variant entry
    holds TEDotProductAttention's softmax_type gate, the site no upstream case or unit test takes."""
    from rocmport.cli import main
    from tests.helpers.real import project_with

    root = project_with(tmp_path / "project", {"megatron-lm": "v0.16"})
    remote = ["--remote", f"megatron-lm={MIRROR}", "--no-bridge"]
    assert main(["-C", str(root), "sync", "--ref", "v0.16", *remote]) == 0
    assert main(["-C", str(root), "apply"]) == 0
    report = tmp_path / "report.json"
    rc = main(
        ["-C", str(root), "verify", "--te", "auto", "--stages", "variants", "--variants", "softmax-off-by-one"]
        + ["--record-reach", "--report", str(report)]
    )
    data = json.loads(report.read_text())
    run = data["variants"]["runs"]["softmax-off-by-one"]
    site = BY_NAME["softmax-off-by-one"].sites[0]
    assert run["aimed_ran"] == [site], run
    record = json.loads((root / "patchsets/megatron-lm/v0.16/reach.json").read_text())
    assert site in record["variants"]["softmax-off-by-one"]["sites"]
    assert rc in (0, 1) and run["status"] in ("pass", "fail", "unsupported-in-proxy"), run


def variant_margs(**given):
    """A variant's parsed Megatron args as variant_layer_spec reads them: TE's layers, no experts, no
    QK layernorm, MLA or experimental attention, but what ``given`` sets."""
    from types import SimpleNamespace

    defaults = dict(
        transformer_impl="transformer_engine",
        num_experts=None,
        moe_grouped_gemm=False,
        qk_layernorm=False,
        multi_latent_attention=False,
        experimental_attention_variant=None,
    )
    return SimpleNamespace(**{**defaults, **given})


def test_a_variant_s_layer_spec_takes_only_what_the_line_s_spec_functions_accept():
    """v0.19's spec functions have no `moe_use_legacy_grouped_gemm` (GroupedMLP is gone): passing its
    default made every reach variant fail there (TypeError). The worker passes it only to a variant
    that asks for the legacy grouped GEMM; TE's spec or the local one as --transformer-impl says."""
    from types import SimpleNamespace

    from rocmport.verify.runtime.gpt_worker import variant_layer_spec

    def v019_te_spec(num_experts=None, moe_grouped_gemm=False, qk_layernorm=False, multi_latent_attention=False):
        return ("te", num_experts, moe_grouped_gemm, qk_layernorm, multi_latent_attention)

    def v016_local_spec(
        num_experts=None,
        moe_grouped_gemm=False,
        qk_layernorm=False,
        multi_latent_attention=False,
        moe_use_legacy_grouped_gemm=False,
    ):
        return ("local", num_experts, moe_use_legacy_grouped_gemm)

    specs = SimpleNamespace(
        get_gpt_layer_with_transformer_engine_spec=v019_te_spec, get_gpt_layer_local_spec=v016_local_spec
    )
    margs = variant_margs(
        num_experts=4, moe_grouped_gemm=True, multi_latent_attention=True, moe_use_legacy_grouped_gemm=False
    )
    assert variant_layer_spec(margs, specs) == ("te", 4, True, False, True)
    legacy = SimpleNamespace(**{**vars(margs), "transformer_impl": "local", "moe_use_legacy_grouped_gemm": True})
    assert variant_layer_spec(legacy, specs) == ("local", 4, True)


def test_an_experimental_attention_variant_takes_the_block_spec_gpt_builder_takes_for_it(monkeypatch):
    """`--experimental-attention-variant dsa` (the absorbed MLA): the tree's gpt_builder takes
    get_transformer_block_with_experimental_attention_variant_spec(config=...) for it, not the layer
    spec functions (whose spec has plain MLA); the worker does the same, with the run's config."""
    from types import ModuleType, SimpleNamespace

    from rocmport.verify.runtime.gpt_worker import variant_layer_spec

    asked = []
    experimental = ModuleType("megatron.core.models.gpt.experimental_attention_variant_module_specs")
    experimental.get_transformer_block_with_experimental_attention_variant_spec = lambda config: (  # type: ignore[attr-defined]
        asked.append(config) or "absorbed block"
    )
    gpt = ModuleType("megatron.core.models.gpt")
    gpt.experimental_attention_variant_module_specs = experimental  # type: ignore[attr-defined]
    for name, module in {"megatron.core.models.gpt": gpt, experimental.__name__: experimental}.items():
        monkeypatch.setitem(sys.modules, name, module)

    def layer_spec(**kwargs):
        return ("layer", kwargs["multi_latent_attention"])

    specs = SimpleNamespace(get_gpt_layer_with_transformer_engine_spec=layer_spec)
    margs = variant_margs(multi_latent_attention=True, experimental_attention_variant="dsa")
    config = object()
    assert variant_layer_spec(margs, specs, config) == "absorbed block" and asked == [config]
    plain = SimpleNamespace(**{**vars(margs), "experimental_attention_variant": None})
    assert variant_layer_spec(plain, specs, config) == ("layer", True) and asked == [config]


def test_the_inference_optimized_variant_takes_the_inference_spec_and_runs_forward_steps_only():
    """`--transformer-impl inference_optimized`: the tree's gpt_builder takes
    get_gpt_layer_with_inference_spec (whose layers' forward is torch.no_grad: inference only); the
    worker takes the same, and the variant's run is the schedule's forward steps (`--forward-only`),
    its pass naming them, with the same loss each iteration."""
    from types import SimpleNamespace

    from rocmport.verify.runtime.gpt_worker import variant_layer_spec

    def inference_spec(qk_layernorm=False, multi_latent_attention=False, qk_l2_norm=False):
        return ("inference", qk_layernorm, multi_latent_attention)

    def te_spec(**kwargs):
        raise AssertionError("the inference-optimized layers are not TE's spec")

    specs = SimpleNamespace(
        get_gpt_layer_with_inference_spec=inference_spec, get_gpt_layer_with_transformer_engine_spec=te_spec
    )
    variant = BY_NAME["inference-optimized-tp2"]
    flags = dict(zip(variant.flags, [*variant.flags[1:], ""]))
    assert flags["--transformer-impl"] == "inference_optimized" and flags["--tensor-model-parallel-size"] == "2"
    assert "--sequence-parallel" in variant.flags and variant.ranks == 2 and variant.forward_only
    assert variant_layer_spec(variant_margs(transformer_impl="inference_optimized"), specs) == (
        "inference",
        False,
        False,
    )

    launcher = SimpleNamespace(command=lambda ranks, args, name: [str(ranks), *args])
    opts = SimpleNamespace(launcher=launcher)
    command = variants.variant_command(opts, variant, Path("out.json"))  # type: ignore[arg-type]
    assert command[0] == "2" and command[-1] == "--forward-only"
    assert "--forward-only" not in variants.variant_command(opts, BY_NAME["fp8-delayed"], Path("o.json"))  # type: ignore[arg-type]
    same = [4.8583, 4.8583, 4.8583]
    assert variants.outcome(variant, 0, {"losses": same}, "", 3) == (
        "pass",
        "3 forward-only iterations, loss 4.8583",
        same,
    )


# --- delay-wgrad-compute: the worker's DDP as Megatron's training makes it ---------------------------


@pytest.mark.mirror
@pytest.mark.network
@pytest.mark.torch
@pytest.mark.skipif(not MIRROR, reason="set ROCMPORT_TEST_MLM_MIRROR to a local Megatron-LM mirror")
@pytest.mark.parametrize("in_args", [True, False])
def test_a_delayed_wgrad_reaches_main_grad_through_the_worker_s_ddp(tmp_path, real_index, in_args):
    """The delay-wgrad-compute variant's NaN (loss 4.87, nan, nan on both lines): the worker built
    Megatron's DDP without the args' delay_wgrad_compute, which Megatron's training copies into it.
    DDP then hooked TE's delayed-wgrad weights' gradient accumulators, which the backward fills with
    the uncomputed (torch.empty) weight gradients, and nothing accumulated what backward_dw computes.
    TE 2.12.0's GroupedLinear (delay_wgrad_compute, CPU kernels) in v0.16's DDP from the worker's
    make_ddp: with the variant's args (in_args) each main_grad is plain torch's weight gradient; DDP
    made without them (the worker before) holds the uninitialised buffer instead."""
    from tests.helpers import te_probe
    from tests.helpers.real import REPO

    layer = te_probe.real_layer("2.12.0")
    tree = tmp_path / "mlm"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", MIRROR, "archive", "core_v0.16.1", "megatron/core"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    env = te_probe.proxy_env(layer, tmp_path / "boot")
    env["PYTHONPATH"] += os.pathsep + str(tree)
    out = tmp_path / "out.json"
    worker = str(REPO / "tests" / "helpers" / "te_delay_wgrad_worker.py")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", worker, str(out), str(int(in_args))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-3000:]
    result = json.loads(out.read_text())
    if in_args:
        assert result["worst"] <= 1e-5, result
    else:
        assert result["worst"] > 1e-3, result  # not the weight gradient: what torch.empty held
    assert result["delay_wgrad_compute"] is in_args
