"""One rank of verify's GPT training stage (run by torchrun; imports megatron from the tree).

A small GPTModel (local layer spec) trained with megatron's own schedule, DDP, finalize_model_grads
and optimizer (Adam, grad clipping). Writes losses and tied-embedding checks as JSON (rank 0).
With --save-init it saves the initial full weights (the tp1/pp1 reference run); with --load-init
it starts from them, split along each parameter's partition_dim and per pipeline stage."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from rocmport.verify.runtime import protocol
from rocmport.verify.runtime.seeding import seed_host_generators

SEQ, MBS, MICROBATCHES, VOCAB, HIDDEN, HEADS, LAYERS = 32, 2, 4, 128, 64, 4, 4
# The output layer shares the embedding's weights (the tied-embedding check), positions are learned.
EMBEDDINGS = {"share_embeddings_and_output_weights": True, "position_embedding_type": "learned_absolute"}


def model_config(tp: int, pp: int, proxy: bool) -> dict[str, Any]:
    """The small GPT's TransformerConfig fields: the one configuration that megatron's own
    TransformerConfig (stage 2) and Bridge's GPTModelProvider (stage 5, a TransformerConfig too) get."""
    import torch

    return dict(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        # Trap G1: the real tp/pp sizes, or the tied-embedding sync is silently skipped.
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=proxy,
        batch_p2p_sync=not proxy,
        params_dtype=torch.float32,
        bf16=False,
        fp16=False,
    )


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", required=True)
    p.add_argument("--save-init")
    p.add_argument("--load-init")
    p.add_argument("--bridge", action="store_true", help="build the model through Megatron-Bridge's GPTModelProvider")
    p.add_argument(
        "--te",
        action="store_true",
        help="upstream's Transformer Engine layer spec (TE's Python layer must be importable)",
    )
    p.add_argument(
        "--moe", type=int, default=0, help="MoE: this many experts (top-2, grouped GEMM: TE's GroupedLinear with --te)"
    )
    p.add_argument(
        "--ep", type=int, default=1, help="expert-parallel size (with --moe; experts are not tensor-parallel)"
    )
    p.add_argument(
        "--megatron-flags",
        help="a reach variant (JSON list of Megatron command-line flags): this small GPT's sizes and these flags "
        "go through the tree's own argument parser and validate_args, the model is built from the config they give",
    )
    p.add_argument(
        "--forward-only",
        action="store_true",
        help="a reach variant of an inference-only model: forward steps (the schedule's forward_only), no backward "
        "or optimizer step",
    )
    return p.parse_args()


def main():
    args = parse()
    try:
        if args.megatron_flags is not None:
            train_variant(args)
        else:
            train(args)
    except Exception as exc:
        # A kernel TE's Python reached that the CPU proxy lacks: reported as unsupported-in-proxy,
        # naming the transformer_engine_torch function (never a silent pass).
        if type(exc).__name__ != "UnsupportedInProxy":
            raise
        _write(args.out, {"unsupported": str(exc)}, force=True)
        raise SystemExit(3) from None
    _exit_without_finalizing()


def _exit_without_finalizing() -> None:
    """Leave once the results are written and the process group destroyed, without interpreter
    finalization. Why: torch drops a finished gloo work (and the Python tensors it holds) on the
    group's own run-loop thread; when that lands while the interpreter is finalizing, the thread
    cannot take the GIL and the process aborts ("terminate called without an active exception"),
    turning a passed run into a SIGABRT about one run in ten."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# Stage 2's FP8 case (verify --fp8-recipe): "FORMAT:RECIPE" (hybrid:delayed, e4m3:tensorwise, hybrid:mxfp8 ...)
FP8_ENV = protocol.VERIFY_FP8.name


def fp8_setting() -> tuple[str, str] | None:
    value = os.environ.get(FP8_ENV, "")
    if not value:
        return None
    fmt, _, recipe = value.partition(":")
    return fmt, recipe or "delayed"


def check_fp8_args(fmt: str, recipe: str) -> None:
    """The port's argument validation of an FP8 recipe (its fp8-arch-check helper, which upstream's
    pretrain_gpt.py runs first thing in validate_args): a recipe the GPU cannot run is refused here,
    naming the arch and the recipe. The unported tree has no such check: TE decides later, in its own."""
    try:
        from megatron.core._rocm import check_fp8_for_arch
    except ImportError:
        return
    from types import SimpleNamespace

    check_fp8_for_arch(SimpleNamespace(fp8=fmt, fp8_recipe=recipe))


def train(args):
    """One rank's run: the process group, the small GPT, ``args.iters`` iterations of megatron's own
    schedule, and rank 0's JSON of losses and the tied-embedding checks."""
    proxy = bool(protocol.PROXY.read())
    if proxy and not _install_proxy(args):
        return
    fp8 = fp8_setting() if args.te else None
    if fp8:
        check_fp8_args(*fp8)
    backend = _init_process_group()
    from megatron.core import parallel_state as ps

    model, config, last = _build_model(args, proxy, fp8, ps)
    if backend == "nccl":
        model.cuda()
    tied_start = _tied_ok(model, ps)
    if args.save_init:
        import torch

        torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, args.save_init)
    if args.load_init:
        import torch

        _load_split(model, torch.load(args.load_init), ps, LAYERS // args.pp, args.moe // args.ep if args.moe else 0)
    losses = _train_loop(args, model, config, last, "cuda" if backend == "nccl" else "cpu")
    _report(args, proxy, fp8, losses, last, tied_start, _tied_ok(model, ps), ps)


# --- reach variants: the same small GPT, configured by Megatron's own argument parser ---------------


def variant_base_flags(tp: int, pp: int, dp: int, iters: int) -> list[str]:
    """This small GPT's sizes as Megatron's command line spells them (the dense model's, stage 2's),
    before a variant's own flags (which come after, so a variant may override any of them)."""
    return [
        *("--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads", str(HEADS)),
        *("--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ), "--vocab-size", str(VOCAB)),
        *("--micro-batch-size", str(MBS), "--global-batch-size", str(MBS * MICROBATCHES * dp)),
        *("--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp)),
        *("--hidden-dropout", "0", "--attention-dropout", "0", "--train-iters", str(iters)),
        *("--lr", "3e-3", "--clip-grad", "1.0", "--seed", "1234", "--position-embedding-type", "learned_absolute"),
        # TransformerConfig's defaults for these (stage 2's model), where the parser's are the fused GPU kernels
        *("--no-gradient-accumulation-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion"),
        *("--no-masked-softmax-fusion", "--transformer-impl", "transformer_engine"),
    ]


# What a variant's worker writes when the tree's argument parser refuses a flag (its Megatron lacks it).
NOT_APPLICABLE = "not_applicable"


def _variant_args(flags: list[str], world: int, iters: int):
    """Megatron's args for a variant: the tree's parse_args over this GPT's sizes and ``flags``, then
    its validate_args (the port's sites there run), set as megatron's global args. SystemExit 2 from
    the parser (an unrecognized flag, a choice it lacks) is raised as LookupError with its message."""
    import contextlib
    import io

    from megatron.training import arguments
    from megatron.training.global_vars import set_args

    argv, err = sys.argv, io.StringIO()
    sys.argv = [argv[0], *variant_base_flags(1, 1, world, iters), *flags]
    try:
        with contextlib.redirect_stderr(err):
            args = arguments.parse_args()
    except SystemExit as exc:
        said = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        raise LookupError(said[-1] if said else f"the argument parser exited {exc.code}") from None
    finally:
        sys.argv = argv
    arguments.validate_args(args, {})
    set_args(args)
    return args


def variant_layer_spec(margs, gpt_layer_specs, config=None):
    """The layer spec a variant's args ask for, from the tree's ``gpt_layer_specs``: TE's or the local
    one, with the experts, QK layernorm and MLA they set. The legacy grouped GEMM only where a variant
    asks for it: v0.19's spec functions no longer take `moe_use_legacy_grouped_gemm` (GroupedMLP is
    gone), and passing its default made every variant fail there with a TypeError. With
    `--experimental-attention-variant`, the block spec the tree's gpt_builder takes for it (from
    ``config``): e.g. dsa's absorbed MLA."""
    if margs.transformer_impl == "inference_optimized":  # as the tree's gpt_builder: the inference spec
        return gpt_layer_specs.get_gpt_layer_with_inference_spec(
            qk_layernorm=margs.qk_layernorm, multi_latent_attention=margs.multi_latent_attention
        )
    if getattr(margs, "experimental_attention_variant", None) is not None:
        from megatron.core.models.gpt import experimental_attention_variant_module_specs as experimental

        return experimental.get_transformer_block_with_experimental_attention_variant_spec(config=config)
    make_spec = (
        gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec
        if margs.transformer_impl == "transformer_engine"
        else gpt_layer_specs.get_gpt_layer_local_spec
    )
    legacy = {"moe_use_legacy_grouped_gemm": True} if getattr(margs, "moe_use_legacy_grouped_gemm", False) else {}
    return make_spec(
        num_experts=margs.num_experts,
        moe_grouped_gemm=margs.moe_grouped_gemm,
        qk_layernorm=margs.qk_layernorm,
        multi_latent_attention=margs.multi_latent_attention,
        **legacy,
    )


def train_variant(args) -> None:
    """A reach variant's run (``args.megatron_flags``): the small GPT with Megatron's args from the
    tree's parser and validate_args, its TransformerConfig from core_transformer_config_from_args, its
    layer spec as the flags ask (TE or local, experts, MLA, the legacy grouped GEMM), trained
    ``args.iters`` iterations; rank 0 writes the losses, or why the parser refused a flag."""
    proxy = bool(protocol.PROXY.read())
    if proxy and not _install_proxy(args):
        return
    import torch

    flags = json.loads(args.megatron_flags)
    backend = _init_process_group()
    try:
        margs = _variant_args(flags, torch.distributed.get_world_size(), args.iters)
    except LookupError as exc:
        _write(args.out, {NOT_APPLICABLE: str(exc)})
        torch.distributed.destroy_process_group()
        return
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel, gpt_layer_specs
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.training.arguments import core_transformer_config_from_args

    ps.initialize_model_parallel(
        tensor_model_parallel_size=margs.tensor_model_parallel_size,
        pipeline_model_parallel_size=margs.pipeline_model_parallel_size,
        expert_model_parallel_size=margs.expert_model_parallel_size,
        # as Megatron's initialize: the context-parallel group and, for a2a+p2p, its hierarchical parts
        context_parallel_size=margs.context_parallel_size,
        hierarchical_context_parallel_sizes=margs.hierarchical_context_parallel_sizes,
    )
    seed_host_generators(margs.seed)
    model_parallel_cuda_manual_seed(margs.seed)
    set_symmetric = getattr(ps, "_set_global_symmetric_memory_buffer", None)
    if margs.transformer_impl == "inference_optimized" and set_symmetric is not None:
        # as v0.16's inference context (maybe_initialize_symmetric_memory): the layers ask this buffer for
        # symmetric memory (none where the group cannot have it: they take torch.distributed then). v0.19's
        # layers make theirs themselves (SymmetricMemoryManager.get_buffer): the tree has no such setter.
        set_symmetric()
    config = core_transformer_config_from_args(margs)
    spec = variant_layer_spec(margs, gpt_layer_specs, config)
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pre_process=first,
        post_process=last,
        **EMBEDDINGS,
    )
    if backend == "nccl":
        model.cuda()
    if margs.bf16:  # as Megatron's get_model: bf16 parameters, the inputs cast at the first stage, fp32 outputs
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(config, model)
    losses = _train_loop(
        args,
        model,
        config,
        last,
        "cuda" if backend == "nccl" else "cpu",
        bf16=bool(margs.bf16),
        context_parallel=margs.context_parallel_size > 1,
        forward_only=args.forward_only,
        ddp_fields=ddp_settings(margs),
    )
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, {"losses": losses, "last": last})
    reporter = next(g for g in gathered if g["last"])
    _write(args.out, {"losses": reporter["losses"]})
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _install_proxy(args) -> bool:
    """torch.cuda's CPU answers (and TE's, with --te); False when the proxy cannot stand in (reported)."""
    from rocmport.verify.runtime import proxy_shim

    try:
        proxy_shim.install()
        if args.te:  # TE's modules ask torch.cuda about the device they run on (and assert it exists)
            proxy_shim.install_for_te()
    except proxy_shim.Unsupported as exc:
        _write(args.out, {"unsupported": str(exc)}, force=True)
        return False
    return True


def _init_process_group() -> str:
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    backend = protocol.BACKEND.read() or "gloo"
    torch.distributed.init_process_group(backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return backend


def _moe_config(args) -> dict[str, Any]:
    if not args.moe:
        return {}
    # Experts spread over ep ranks, each whole (expert tp 1: ep fits in tp×dp at tp2×pp2×dp1); top-2
    # routing without an auxiliary loss or token dropping, so ep2 computes what ep1 does.
    return dict(
        num_moe_experts=args.moe,
        moe_router_topk=2,
        moe_grouped_gemm=True,
        moe_token_dispatcher_type="alltoall",
        moe_aux_loss_coeff=0.0,
        expert_model_parallel_size=args.ep,
        expert_tensor_parallel_size=1,
        sequence_parallel=args.tp > 1,
    )  # megatron refuses MoE with tp but without sequence parallelism


def _build_model(args, proxy: bool, fp8: tuple[str, str] | None, ps):
    """Model parallel state, the TransformerConfig and the GPTModel (or Bridge's provider's model):
    (model, config, whether this rank is the last pipeline stage)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel(
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        **({"expert_model_parallel_size": args.ep, "expert_tensor_parallel_size": 1} if args.moe else {}),
    )
    seed_host_generators(args.seed)
    model_parallel_cuda_manual_seed(args.seed)
    config = TransformerConfig(
        **model_config(args.tp, args.pp, proxy),
        **_moe_config(args),
        **({"fp8": fp8[0], "fp8_recipe": fp8[1]} if fp8 else {}),
    )
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    if args.bridge:
        config, model = _bridge_model(args, proxy, first, last, args.te)
        return model, config, last
    experts = {"num_experts": args.moe, "moe_grouped_gemm": True} if args.moe else {}
    spec = get_gpt_layer_with_transformer_engine_spec(**experts) if args.te else get_gpt_layer_local_spec(**experts)
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pre_process=first,
        post_process=last,
        **EMBEDDINGS,
    )
    return model, config, last


def ddp_settings(margs) -> dict[str, Any]:
    """The DistributedDataParallelConfig fields a variant's args set that change which gradient DDP
    accumulates: ``delay_wgrad_compute``, as Megatron's training (get_model copies every DDP field its
    args have). Without it DDP hooks TE's delayed-wgrad parameters' gradient accumulators, which the
    backward fills with the uncomputed (torch.empty) weight gradients, and nothing accumulates what
    ``backward_dw`` computes: main_grad held uninitialised memory, the loss NaN from iteration 2."""
    return {"delay_wgrad_compute": True} if getattr(margs, "delay_wgrad_compute", False) else {}


def make_ddp(config, model, ddp: dict[str, Any] | None = None):
    """Megatron's DistributedDataParallel around ``model`` as the small GPT's loop wraps it: no grad
    reduce overlap, no distributed optimizer, and the variant's ``ddp`` fields (ddp_settings)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    return DistributedDataParallel(
        config,
        DistributedDataParallelConfig(overlap_grad_reduce=False, use_distributed_optimizer=False, **(ddp or {})),
        model,
    )


def _train_loop(
    args,
    model,
    config,
    last: bool,
    device: str,
    bf16: bool = False,
    context_parallel: bool = False,
    forward_only: bool = False,
    ddp_fields: dict[str, Any] | None = None,
) -> list[float]:
    """DDP, megatron's optimizer and schedule over the same micro-batches each iteration; the last
    stage's mean lm loss per iteration. ``context_parallel``: each rank takes its chunks of the
    sequence, as pretrain_gpt's get_batch (get_batch_on_this_cp_rank); its loss is its chunks' mean.
    ``forward_only``: the schedule's forward steps only (an inference-only model), no optimizer step.
    ``ddp_fields``: the variant's DDP fields (ddp_settings)."""
    import torch
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    ddp = make_ddp(config, model, ddp_fields)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = ddp.no_sync
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=3e-3,
            clip_grad=1.0,
            params_dtype=config.params_dtype if bf16 else torch.float32,
            bf16=bf16,
            use_distributed_optimizer=False,
        ),
        [ddp],
    )
    forward_backward = get_forward_backward_func()

    def batches():
        # The same micro-batches every iteration: a tiny model can learn them, so the loss must fall.
        g = torch.Generator().manual_seed(args.seed)
        for _ in range(MICROBATCHES):
            tokens = torch.randint(0, VOCAB, (MBS, SEQ + 1), generator=g)
            yield tokens[:, :-1].to(device), tokens[:, 1:].to(device)

    def forward_step(data_iterator, model, return_schedule_plan: bool = False):
        tokens, labels = next(data_iterator)
        positions = torch.arange(SEQ, device=device).unsqueeze(0).expand(MBS, -1)
        if context_parallel:
            import inspect

            from megatron.core.utils import get_batch_on_this_cp_rank

            batch = {"tokens": tokens, "labels": labels, "position_ids": positions}
            # v0.19's takes is_hybrid_cp (no default; pretrain_gpt passes False for a plain CP group)
            hybrid = (
                {"is_hybrid_cp": False}
                if "is_hybrid_cp" in inspect.signature(get_batch_on_this_cp_rank).parameters
                else {}
            )
            mine = get_batch_on_this_cp_rank(batch, **hybrid)
            tokens, labels, positions = mine["tokens"], mine["labels"], mine["position_ids"]

        def loss_func(output):
            loss = output.float().mean()
            # Trap G2: the schedule divides the returned loss in place; report a clone.
            return loss, {"lm loss": loss.detach().clone()}

        if return_schedule_plan:  # the EP-overlap schedule (--overlap-moe-expert-parallel-comm) runs the model's plan
            gpt = model
            while hasattr(gpt, "module"):  # DDP, then Float16Module around the GPTModel
                gpt = gpt.module
            return gpt.build_schedule_plan(tokens, positions, None, labels=labels), loss_func
        return model(tokens, positions, attention_mask=None, labels=labels), loss_func

    losses = []
    for _ in range(args.iters):
        ddp.zero_grad_buffer()
        optimizer.zero_grad()
        reduced = forward_backward(
            forward_step_func=forward_step,
            data_iterator=batches(),
            model=[ddp],
            num_microbatches=MICROBATCHES,
            seq_length=SEQ,
            micro_batch_size=MBS,
            forward_only=forward_only,
        )
        if not forward_only:
            optimizer.step()
        if last:
            losses.append(float(torch.stack([r["lm loss"] for r in reduced]).mean()))
    return losses


def _report(
    args,
    proxy: bool,
    fp8: tuple[str, str] | None,
    losses: list[float],
    last: bool,
    tied_start: bool,
    tied_end: bool,
    ps,
) -> None:
    """Rank 0 writes the last stage's losses (its tp rank 0's), the tied-embedding checks, the
    proxy's redirects and, with ``fp8``, every rank's FP8 casts by encoding; then every rank leaves
    the process group."""
    import torch

    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    casts: dict[str, int] = {}
    if fp8:  # the casts TE's layer made through the CPU kernels, by the encoding they wrote
        from rocmport.verify.runtime import te_fp8

        casts = dict(te_fp8.CASTS)
    torch.distributed.all_gather_object(
        gathered, {"losses": losses, "last": last, "tp_rank": ps.get_tensor_model_parallel_rank(), "casts": casts}
    )
    if torch.distributed.get_rank() == 0:
        reporter = next(g for g in gathered if g["last"] and g["tp_rank"] == 0)
        fp8_casts: dict[str, int] = {}  # every rank's FP8 casts by encoding: the FP8 that ran
        for g in gathered:
            for name, n in g["casts"].items():
                fp8_casts[name] = fp8_casts.get(name, 0) + n
        redirects = {}
        if proxy:
            from rocmport.verify.runtime.proxy_shim import REDIRECTS

            redirects = dict(REDIRECTS.most_common())
        _write(
            args.out,
            {
                "losses": reporter["losses"],
                "tied_embeddings_equal": tied_start and tied_end,
                "tied_start": tied_start,
                "tied_end": tied_end,
                "redirects": redirects,
                **({"fp8_casts": fp8_casts} if fp8 else {}),
            },
        )
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _bridge_model(args, proxy, first, last, te=False):
    """The same small GPT, configured and built by Megatron-Bridge's GPTModelProvider (a
    TransformerConfig that provides the model); local layer spec, or with ``te`` Bridge's TE spec."""
    from megatron.bridge.models import gpt_provider
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    layer_spec = gpt_provider.transformer_engine_layer_spec if te else gpt_provider.local_layer_spec

    provider = GPTModelProvider(
        **model_config(args.tp, args.pp, proxy),
        vocab_size=VOCAB,
        seq_length=SEQ,
        transformer_layer_spec=layer_spec,
        **EMBEDDINGS,
        make_vocab_size_divisible_by=VOCAB,
    )
    if hasattr(provider, "finalize"):  # Bridge defers TransformerConfig's __post_init__ to finalize()
        provider.finalize()
    return provider, provider.provide(pre_process=first, post_process=last)


def _tied_ok(model, ps) -> bool:
    """Are the embedding on the first stage and the output layer on the last stage identical?"""
    import torch

    mine = None
    if ps.is_pipeline_first_stage():
        mine = model.embedding.word_embeddings.weight
    elif ps.is_pipeline_last_stage():
        mine = model.output_layer.weight
    digest = None if mine is None else [float(mine.double().sum()), float((mine.double() ** 2).sum())]
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, (ps.get_tensor_model_parallel_rank(), digest))
    by_tp: dict[int, list] = {}
    for tp_rank, d in gathered:
        if d is not None:
            by_tp.setdefault(tp_rank, []).append(d)
    return all(all(d == ds[0] for d in ds) for ds in by_tp.values())


def _load_split(model, full: dict, ps, layers_per_stage: int, local_experts: int = 0) -> None:
    """Copy the tp1/pp1 weights into this rank's shard: pipeline layer offset, then TP slice; with
    MoE (``local_experts`` per rank), this rank's experts, whole."""
    import torch

    offset = ps.get_pipeline_model_parallel_rank() * layers_per_stage
    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    ep_rank = ps.get_expert_model_parallel_rank() if local_experts else 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            ref_name = re.sub(
                r"decoder\.layers\.(\d+)\.", lambda m: f"decoder.layers.{int(m.group(1)) + offset}.", name
            )
            if ref_name == "output_layer.weight" and ref_name not in full:
                ref_name = "embedding.word_embeddings.weight"  # tied: the last stage holds a copy
            expert = ".experts." in name
            if (
                expert
            ):  # this rank's local expert i is global expert ep_rank * local_experts + i (GroupedLinear's weight<i>)
                ref_name = re.sub(
                    r"(weight|bias)(\d+)$",
                    lambda m: f"{m.group(1)}{ep_rank * local_experts + int(m.group(2))}",
                    ref_name,
                )
            ref = full[ref_name]
            if getattr(param, "tensor_model_parallel", False) and tp > 1 and not expert:
                ref = torch.chunk(ref, tp, dim=param.partition_dim)[rank]
            if ref.shape != param.shape:
                raise RuntimeError(f"{name}: reference shape {tuple(ref.shape)} does not split to {tuple(param.shape)}")
            param.copy_(ref)


def _write(path, data, force=False):
    import torch

    if force or not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        from rocmport.fsutil import write_file

        write_file(path, json.dumps(data), durable=False)


if __name__ == "__main__":
    main()
