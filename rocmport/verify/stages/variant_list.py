"""Reach variants, declared: short runs of stage 2's own small GPT (runtime/gpt_worker.py's sizes)
with a few extra Megatron flags each, for the port sites no upstream GPT case or unit test takes
although the CPU proxy could run them. Each names its flags (what the tree's own argument parser
and validate_args get after the small GPT's sizes), the port sites it aims at (their stable keys,
port_sites.Site.stable_key, as the reach record names them) and why, in one line naming the flag.
Never a copy of an upstream case's arguments: verify's model, plus the flag that takes the site.

A variant may also declare where it is expected to stop after its sites ran, and why that is the
proxy's (``stops``: a text of the exception's own line -> the reason): e.g. the NVFP4 kernels TE's CPU layer
lacks. Such a stop is `unsupported-in-proxy` with that reason; any other is a failure."""

from __future__ import annotations

from dataclasses import dataclass

TE_PY = "megatron/core/extensions/transformer_engine.py"

# A small MoE for the variants that need experts: 4 experts, top-2, TE's grouped GEMM.
MOE = ("--num-experts", "4", "--moe-router-topk", "2", "--moe-grouped-gemm", "--moe-aux-loss-coeff", "0")
# Multi-latent attention at the small GPT's sizes (4 heads of 16).
MLA = (
    *("--multi-latent-attention", "--q-lora-rank", "32", "--kv-lora-rank", "32"),
    *("--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16"),
)
# Megatron's shared experts take no bias: the small GPT's linears lose theirs in these variants.
SHARED_EXPERTS = ("--moe-shared-expert-intermediate-size", "64", "--disable-bias-linear")
# TE's CPU layer has no NVFP4 kernel: an FP4 run stops at its first quantization, after the model
# (and the sites in its constructors) was built.
FP4_STOP = ("NVFP4", "TE's CPU layer has no NVFP4 (FP4) kernel: the model was built, the first FP4 quantization stops")


# TE runs context parallelism in its flash or fused attention only (its unfused attention takes no CP),
# and TE's CPU layer has neither: the model (and TE attention's constructor) was built, the first
# attention forward finds no backend.
CP_STOP = (
    "No dot product attention backend is available",
    "TE's context parallelism runs in its flash or fused attention only, which TE's CPU layer lacks (its unfused "
    "attention takes no CP): the model was built, the first attention forward stops",
)

# The absorbed MLA (AbsorbedMLASelfAttention, v0.19 on): the tree's gpt_builder takes it for
# `--experimental-attention-variant dsa` (DeepSeek sparse attention: MLA with its indexer, in PyTorch
# with the kernel backend `none`). No linear bias (the absorbed MLA asserts it); the indexer's Hadamard
# rotation is the fast_hadamard_transform package's CUDA kernel, off. 16 indexer heads: the indexer's
# weights projection (hidden -> heads) is an FP8 GEMM, whose weight TE wants in rows of a multiple of 8.
ABSORBED_MLA_PY = "megatron/core/transformer/experimental_attention_variant/absorbed_mla.py"
ABSORBED_MLA = (
    *MLA,
    *("--experimental-attention-variant", "dsa", "--disable-bias-linear", "--no-dsa-indexer-rotate-activation"),
    *("--dsa-indexer-n-heads", "16", "--dsa-indexer-head-dim", "16", "--dsa-indexer-topk", "16"),
    *("--dsa-indexer-loss-coeff", "0"),
)

# Megatron's inference-optimized layers (InferenceLayerNormColumnParallelLinear, InferenceRowParallelLinear,
# v0.16's tensor_parallel/inference_layers.py): TransformerConfig requires RMSNorm and no bias with them,
# the layers sequence parallelism at tensor parallel > 1, where their all-gather and reduce-scatter run.
INFERENCE_LAYERS_PY = "megatron/core/tensor_parallel/inference_layers.py"
INFERENCE_OPTIMIZED = (
    *("--transformer-impl", "inference_optimized", "--normalization", "RMSNorm", "--disable-bias-linear"),
    *("--tensor-model-parallel-size", "2", "--sequence-parallel"),
)


@dataclass(frozen=True)
class Variant:
    """One reach variant: its ``name`` (`--variants NAME`, the record's entry), the Megatron ``flags``
    it adds, the port ``sites`` it aims at, ``why`` (one line naming the flag or feature), its
    ``ranks`` (data parallel at tp1/pp1, unless its flags set a model-parallel size), the stops that are the
    proxy's (``stops``: (a text of the exception, the reason)) and ``forward_only``: a model Megatron
    builds for inference only (its layers' forward runs without autograd), whose run is forward steps."""

    name: str
    flags: tuple[str, ...]
    sites: tuple[str, ...]
    why: str
    ranks: int = 1
    stops: tuple[tuple[str, str], ...] = ()
    forward_only: bool = False


VARIANTS: tuple[Variant, ...] = (
    Variant(
        "delay-wgrad-compute",
        (
            *MOE,
            *("--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall", "--bf16"),
            *("--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"),
            # Megatron's MoE models train without bias; with one, TE up to 2.14's GroupedLinear.backward_dw
            # assigns an empty bias gradient to the bias Megatron's TEGroupedMLP has it return
            # (return_bias: no bias in the wgrad GEMM): "attempting to assign a gradient of size '[0]'
            # to a tensor of size '[64]'", on a GPU as well (TE 2.17.1 checks has_grad_biases)
            "--disable-bias-linear",
        ),
        (
            f"{TE_PY}::TELinear.__init__ te_gate#1 [te-version-gates]",
            f"{TE_PY}::TELayerNormColumnParallelLinear.__init__ te_gate#1 [te-version-gates]",
            f"{TE_PY}::TEGroupedLinear.__init__ te_gate#1 [te-version-gates]",
        ),
        "--delay-wgrad-compute (with the EP overlap it requires): the TE linears' split weight-gradient gate",
        ranks=2,
    ),
    Variant(
        "softmax-off-by-one",
        ("--softmax-type", "off-by-one"),
        (f"{TE_PY}::TEDotProductAttention.__init__ te_gate#7 [te-version-gates]",),
        "--softmax-type off-by-one: TE attention's softmax_type gate",
    ),
    Variant(
        "fp8-tensorwise-shared-experts",
        (*MOE, *SHARED_EXPERTS, "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"),
        (
            "megatron/core/transformer/attention.py::Attention.__init__ te_gate#1 [te-version-gates]",
            "megatron/core/transformer/moe/shared_experts.py::SharedExpertMLP.__init__ te_gate#1 [te-version-gates]",
        ),
        "--fp8-recipe tensorwise with --moe-shared-expert-intermediate-size: FP8 other than delayed in attention "
        "and shared experts",
    ),
    Variant(
        "fp8-tensorwise-mla",
        (*MLA, "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"),
        (
            "megatron/core/transformer/multi_latent_attention.py::MultiLatentAttention.__init__ te_gate#1 [te-version-gates]",
        ),
        "--multi-latent-attention with --fp8-recipe tensorwise: MLA's FP8 (not delayed) gate",
    ),
    Variant(
        "fp4-shared-experts",
        (*MOE, *SHARED_EXPERTS, "--fp4-format", "e2m1"),
        (
            "megatron/training/arguments.py::validate_args te_has#1 [te-version-gates]",
            "megatron/core/transformer/attention.py::Attention.__init__ te_gate#2 [te-version-gates]",
            "megatron/core/transformer/moe/shared_experts.py::SharedExpertMLP.__init__ te_gate#2 [te-version-gates]",
            "megatron/core/fp4_utils.py::get_fp4_recipe te_has#1 [te-version-gates]",
        ),
        "--fp4-format e2m1 with shared experts: validate_args' NVFP4 check, the FP4 gates of attention and shared "
        "experts, the FP4 recipe",
        stops=(FP4_STOP,),
    ),
    Variant(
        "fp4-mla",
        (*MLA, "--fp4-format", "e2m1"),
        (
            "megatron/core/transformer/multi_latent_attention.py::MultiLatentAttention.__init__ te_gate#2 [te-version-gates]",
        ),
        "--multi-latent-attention with --fp4-format e2m1: MLA's FP4 gate",
        stops=(FP4_STOP,),
    ),
    Variant(
        "context-parallel-a2a-p2p",
        (
            "--context-parallel-size",
            "4",
            "--cp-comm-type",
            "a2a+p2p",
            "--hierarchical-context-parallel-sizes",
            "2",
            "2",
        ),
        (f"{TE_PY}::TEDotProductAttention.__init__ te_gate#4 [te-version-gates]",),
        "--cp-comm-type a2a+p2p (context parallel 4 as 2 x 2, upstream's cases run it with flash-attn only): TE "
        "attention's hierarchical context-parallel gate",
        ranks=4,
        stops=(CP_STOP,),
    ),
    Variant(
        "fp8-tensorwise-absorbed-mla",
        (*ABSORBED_MLA, "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"),
        (f"{ABSORBED_MLA_PY}::AbsorbedMLASelfAttention.__init__ te_gate#1 [te-version-gates]",),
        "--experimental-attention-variant dsa (absorbed MLA) with --fp8-recipe tensorwise: the absorbed MLA's FP8 "
        "(not delayed) gate",
    ),
    Variant(
        "fp4-absorbed-mla",
        (*ABSORBED_MLA, "--fp4-format", "e2m1"),
        (f"{ABSORBED_MLA_PY}::AbsorbedMLASelfAttention.__init__ te_gate#2 [te-version-gates]",),
        "--experimental-attention-variant dsa (absorbed MLA) with --fp4-format e2m1: the absorbed MLA's FP4 gate",
        stops=(FP4_STOP,),
    ),
    Variant(
        "fp8-delayed",
        ("--fp8-format", "hybrid", "--fp8-recipe", "delayed"),
        (f"{TE_PY}::TEDelayedScaling.__init__ te_gate#1 [te-version-gates]",),
        "--fp8-recipe delayed (no v0.19 GPT case has it): TE's DelayedScaling recipe, its fp8_dpa gate",
    ),
    Variant(
        "sliding-window-attention",
        ("--window-size", "8,0"),
        (f"{TE_PY}::TEDotProductAttention.__init__ te_gate#5 [te-version-gates]",),
        "--window-size 8,0 (a causal sliding window of 8 of the small GPT's 32 tokens): TE attention's "
        "sliding-window gate",
    ),
    Variant(
        "inference-optimized-tp2",
        INFERENCE_OPTIMIZED,
        (
            f"{INFERENCE_LAYERS_PY}::InferenceLayerNormColumnParallelLinear._all_gather nvidia_hopper_or_newer#1 [capability-gates]",
            f"{INFERENCE_LAYERS_PY}::InferenceRowParallelLinear._matmul_reduce_scatter nvidia_hopper_or_newer#1 [capability-gates]",
        ),
        "--transformer-impl inference_optimized at tensor parallel 2: the inference layers' NVLS all-gather and "
        "reduce-scatter gates (their forward is torch.no_grad, inference only: forward steps)",
        ranks=2,
        forward_only=True,
    ),
)

BY_NAME = {v.name: v for v in VARIANTS}
