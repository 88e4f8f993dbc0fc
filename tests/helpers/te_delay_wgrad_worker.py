"""One process (torchrun, 1 rank, gloo, CPU proxy with TE's own Python layer): TE's GroupedLinear with
``delay_wgrad_compute`` (two GEMMs, no bias) inside Megatron's DistributedDataParallel as verify's
small GPT wraps it (gpt_worker.make_ddp with a variant's ddp_settings), forward, backward, then
``backward_dw``: each weight's main_grad against the weight gradient plain torch computes.

argv: OUT DELAY_WGRAD_IN_ARGS (1: the variant's args say --delay-wgrad-compute, as the reach variant's;
0: args without it, the DDP the worker made for that variant before)"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace


def main() -> None:
    out_path, in_args = sys.argv[1], sys.argv[2] == "1"
    import torch

    from rocmport.verify.runtime import proxy_shim

    proxy_shim.install()
    proxy_shim.install_for_te()
    torch.distributed.init_process_group("gloo")
    from megatron.core import parallel_state as ps
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel()
    import transformer_engine.pytorch as te

    from rocmport.verify.runtime.gpt_worker import ddp_settings, make_ddp

    torch.manual_seed(0)
    hidden, splits = 8, [3, 5]
    config = TransformerConfig(num_layers=1, hidden_size=hidden, num_attention_heads=1, use_cpu_initialization=True)
    layer = te.GroupedLinear(
        len(splits), hidden, hidden, bias=False, delay_wgrad_compute=True, params_dtype=torch.float32, device="cpu"
    )
    ddp = make_ddp(config, layer, ddp_settings(SimpleNamespace(delay_wgrad_compute=in_args)))
    ddp.zero_grad_buffer()
    x = torch.randn(sum(splits), hidden)
    dy = torch.randn(sum(splits), hidden)
    y = ddp(x, splits)
    y.backward(dy)
    layer.backward_dw()
    worst = 0.0
    for i, (xi, dyi) in enumerate(zip(torch.split(x, splits), torch.split(dy, splits))):
        want = dyi.t() @ xi  # dL/dW_i for y_i = x_i W_i^T
        got = getattr(layer, f"weight{i}").main_grad
        diff = (got.float() - want).abs().max()
        worst = max(worst, float(diff) if torch.isfinite(diff) else float("inf"))
    with open(out_path, "w") as f:
        json.dump({"worst": worst, "delay_wgrad_compute": ddp.ddp_config.delay_wgrad_compute}, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
