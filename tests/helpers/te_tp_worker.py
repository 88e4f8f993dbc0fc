"""One rank of the TE tensor-parallel check (torchrun, 2 ranks, gloo, CPU proxy with TE's own Python
layer): TE's Linear (column and row), LayerNormLinear, LayerNormMLP and DotProductAttention at tp2,
each against the same computation in plain torch on the full weights (forward, input gradient and
weight gradients). Rank 0 writes {module: max |diff|} as JSON; a kernel the proxy lacks is written
as {"unsupported": message}.

With ``fp8[:RECIPE]`` (delayed, the default; current; mxfp8; block) the modules run under
fp8_autocast with that recipe and each result is the worst difference relative to the reference's
largest magnitude (FP8 rounds: E4M3 keeps 3 mantissa bits).

argv: OUT [fp8[:RECIPE]]"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    out_path = sys.argv[1]
    fp8 = len(sys.argv) > 2 and sys.argv[2].startswith("fp8")
    recipe_name = sys.argv[2].partition(":")[2] or "delayed" if fp8 else ""
    import torch
    import torch.nn.functional as F

    from rocmport.verify.runtime import proxy_shim

    proxy_shim.install(megatron=False)
    proxy_shim.install_for_te()
    if os.environ.get("ROCMPORT_CUDA_SIM_ARCH") and torch.version.cuda is None:
        torch.version.cuda = "12.9"  # the simulated H100's toolkit (TE's block-scaling check reads it)
    torch.distributed.init_process_group("gloo")
    import transformer_engine.pytorch as te

    rank, tp = torch.distributed.get_rank(), torch.distributed.get_world_size()
    group = torch.distributed.new_group(list(range(tp)))
    import transformer_engine

    results: dict = {"te_version": transformer_engine.__version__}

    def full(*shape, seed):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))

    def shard(t, dim):
        return t.chunk(tp, dim=dim)[rank].clone()

    def diff(a, b):
        d = float((a.detach().float() - b.detach().float()).abs().max())
        return d / max(float(b.detach().float().abs().max()), 1e-12) if fp8 else d

    from transformer_engine.common import recipe as te_recipe

    recipes = {
        "delayed": lambda: te_recipe.DelayedScaling(fp8_format=te_recipe.Format.HYBRID, amax_history_len=4),
        "current": lambda: te_recipe.Float8CurrentScaling(fp8_format=te_recipe.Format.HYBRID),
        "mxfp8": lambda: te_recipe.MXFP8BlockScaling(),
        "block": lambda: te_recipe.Float8BlockScaling(),
    }
    fp8_recipe = recipes[recipe_name]() if fp8 else None
    results["recipe"] = recipe_name

    hidden, ffn, tokens = (32, 64, 16) if fp8 else (16, 32, 6)  # FP8 GEMMs want multiples of 16 (MXFP8: 32)
    x_full = full(tokens, 2, hidden, seed=1)
    dy_seed = 2

    def run(name, module, params, reference, x_in=x_full, x_sharded=False):
        """module(x) vs reference(x, full params); gradients of x and of each (param, full, dim)."""
        x = x_in.clone().requires_grad_(True)

        def ctx():
            return te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe, fp8_group=group) if fp8 else torch.enable_grad()

        with ctx():
            y = module(x)
        y = y[0] if isinstance(y, tuple) else y
        dy = full(*y.shape, seed=dy_seed)
        y.backward(dy)
        if fp8:  # a second step: delayed scaling's scales now come from the first step's amaxes
            for p, _, _ in params:
                p.grad = None
            x = x_in.clone().requires_grad_(True)
            with ctx():
                y = module(x)
            y = y[0] if isinstance(y, tuple) else y
            y.backward(dy)
        xr = x_in.clone().requires_grad_(True)
        fulls = [f.clone().requires_grad_(True) for _, f, _ in params]
        yr_full = reference(xr, *fulls)
        yr_local = yr_full if y.shape == yr_full.shape else shard(yr_full, -1)
        dyr = dy if y.shape == yr_full.shape else torch.cat([full(*y.shape, seed=dy_seed)] * tp, -1)
        # a column-parallel output: every rank drew the same dy for its shard; the reference's full
        # gradient is those shards side by side
        yr_full.backward(dyr)
        # a row-parallel layer takes this rank's slice of x: its gradient is that slice's
        dx, dxr = (shard(x.grad, -1), shard(xr.grad, -1)) if x_sharded else (x.grad, xr.grad)
        worst = max(diff(y, yr_local), diff(dx, dxr))
        for (param, _, dim), f in zip(params, fulls):
            ref_grad = f.grad if dim is None else shard(f.grad, dim)
            worst = max(worst, diff(param.grad, ref_grad))
        results[name] = worst

    kw = dict(params_dtype=torch.float32, tp_group=group, tp_size=tp, sequence_parallel=False)
    try:
        w, b = full(ffn, hidden, seed=3), full(ffn, seed=4)
        col = te.Linear(hidden, ffn, parallel_mode="column", **kw)
        with torch.no_grad():
            col.weight.copy_(shard(w, 0))
            col.bias.copy_(shard(b, 0))
        run("Linear(column)", col, [(col.weight, w, 0), (col.bias, b, 0)], lambda x, w, b: x @ w.t() + b)

        w2, b2 = full(hidden, ffn, seed=5), full(hidden, seed=6)
        row = te.Linear(ffn, hidden, parallel_mode="row", **kw)
        x_row = full(tokens, 2, ffn, seed=7)
        with torch.no_grad():
            row.weight.copy_(shard(w2, 1))
            row.bias.copy_(b2)
        run(
            "Linear(row)",
            lambda x: row(shard(x, -1)),
            [(row.weight, w2, 1), (row.bias, b2, None)],
            lambda x, w, b: x @ w.t() + b,
            x_in=x_row,
            x_sharded=True,
        )

        g, beta = full(hidden, seed=8) * 0.1 + 1, full(hidden, seed=9) * 0.1
        lnl = te.LayerNormLinear(hidden, ffn, parallel_mode="column", **kw)
        with torch.no_grad():
            lnl.weight.copy_(shard(w, 0))
            lnl.bias.copy_(shard(b, 0))
            lnl.layer_norm_weight.copy_(g)
            lnl.layer_norm_bias.copy_(beta)
        run(
            "LayerNormLinear",
            lnl,
            [(lnl.weight, w, 0), (lnl.layer_norm_weight, g, None)],
            lambda x, w, g: F.layer_norm(x, (hidden,), g, beta, 1e-5) @ w.t() + b,
        )

        mlp = te.LayerNormMLP(hidden, ffn, set_parallel_mode=True, **kw)
        with torch.no_grad():
            mlp.fc1_weight.copy_(shard(w, 0))
            mlp.fc1_bias.copy_(shard(b, 0))
            mlp.fc2_weight.copy_(shard(w2, 1))
            mlp.fc2_bias.copy_(b2)
            mlp.layer_norm_weight.copy_(g)
            mlp.layer_norm_bias.copy_(beta)

        def mlp_ref(x, w1, w2_):
            h = F.gelu(F.layer_norm(x, (hidden,), g, beta, 1e-5) @ w1.t() + b, approximate="tanh")
            return h @ w2_.t() + b2

        run("LayerNormMLP", mlp, [(mlp.fc1_weight, w, 0), (mlp.fc2_weight, w2, 1)], mlp_ref)

        heads, dim, seq = 4, 8, 5
        q, k, v = (full(seq, 2, heads, dim, seed=s) for s in (10, 11, 12))
        dpa = te.DotProductAttention(
            heads, dim, attn_mask_type="causal", tp_size=tp, tp_group=group, attention_dropout=0.0
        )
        qs, ks, vs = (shard(t, 2).requires_grad_(True) for t in (q, k, v))
        o = dpa(qs, ks, vs)
        do = full(*o.shape, seed=13)
        o.backward(do)
        qr, kr, vr = (shard(t, 2).requires_grad_(True) for t in (q, k, v))
        ref = F.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (qr, kr, vr)), is_causal=True)
        ref = ref.permute(2, 0, 1, 3).reshape(seq, 2, -1)
        ref.backward(do)
        results["DotProductAttention"] = max(
            diff(o, ref), diff(qs.grad, qr.grad), diff(ks.grad, kr.grad), diff(vs.grad, vr.grad)
        )
    except Exception as exc:  # the proxy's named refusal is the result; anything else fails the test
        if type(exc).__name__ != "UnsupportedInProxy":
            raise
        results = {"unsupported": str(exc)}
    from rocmport.verify.runtime import te_cpu, te_fp8

    results["kernels"] = dict(te_cpu.CALLS)
    results["casts"] = dict(te_fp8.CASTS)  # the FP8 casts by the encoding they wrote
    gathered: list = [None] * tp
    torch.distributed.all_gather_object(gathered, results)
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump(gathered, fh)
    torch.distributed.destroy_process_group()
    # as verify's GPT worker does: leave without interpreter finalization, which can abort while a
    # gloo run-loop thread drops a finished work's tensors (see gpt_worker._exit_without_finalizing)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
