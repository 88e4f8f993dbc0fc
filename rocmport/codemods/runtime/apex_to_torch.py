"""The `apex-to-torch` codemod's runtime helpers: apex's fused layers, optimizers, multi_tensor_applier and
amp on torch, and apex_fallback, which resolves any `apex....<name>`.

Only the text between the `# >>> helper part N` / `# <<< helper part N` markers goes into the
generated helper module (rocmport/codemods/helper.py assembles it, parts in N order); what is
above the first marker is for the type checker and readers (the generated module defines
these names itself)."""

# mypy: disable-error-code="union-attr"
# (AmpFallback.scaler is None until initialize() sets it, before any step it wraps runs.)

import torch

from rocmport.codemods.runtime.core import MissingPackage

# >>> helper part 40
# ---- apex fallbacks -----------------------------------------------------------------------------


class FusedLayerNormFallback(torch.nn.LayerNorm):
    """torch.nn.LayerNorm accepting apex FusedLayerNorm/MixedFusedLayerNorm arguments."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, *args, **kwargs):
        for unused in ("no_persist_layer_norm", "sequence_parallel", "apply_layernorm_1p", "memory_efficient"):
            kwargs.pop(unused, None)
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)


def FusedAdamFallback(params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                      adam_w_mode=True, weight_decay=0.0, amsgrad=False, **unused):
    """apex.optimizers.FusedAdam semantics on torch: AdamW (adam_w_mode) or Adam."""
    cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    return cls(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)


def FusedSGDFallback(params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, **unused):
    return torch.optim.SGD(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)


def multi_tensor_applier(op, noop_flag_buffer, tensor_lists, *args):
    """apex's multi_tensor_applier signature; `op` must be a torch fallback kernel (see below)."""
    return op(2048 * 32, noop_flag_buffer, tensor_lists, *args)


# <<< helper part 40

# >>> helper part 70
class AmpFallback:
    """apex.amp on torch.amp: `initialize` runs the models' forward under torch.amp.autocast (O1/O2,
    fp16) and makes each optimizer's step go through a torch.amp.GradScaler; `scale_loss` yields the
    scaled loss. O0 (and O3's pure half precision, which needs no scaler) change nothing."""

    scaler = None

    @classmethod
    def initialize(cls, models, optimizers=None, opt_level="O1", loss_scale="dynamic", **unused):
        single = not isinstance(models, (list, tuple))
        model_list = [models] if single else list(models)
        opts = [] if optimizers is None else ([optimizers] if not isinstance(optimizers, (list, tuple)) else list(optimizers))
        if opt_level in ("O1", "O2"):
            device = "cuda" if torch.cuda.is_available() else "cpu"
            dtype = torch.float16 if device == "cuda" else torch.bfloat16
            for m in model_list:
                m.forward = torch.amp.autocast(device, dtype=dtype)(m.forward)
            init_scale = 2.0 ** 16 if loss_scale == "dynamic" else float(loss_scale)
            cls.scaler = torch.amp.GradScaler(device, init_scale=init_scale, enabled=device == "cuda")
            for opt in opts:
                raw_step = opt.step

                def step(*args, _raw=raw_step, _opt=opt, **kwargs):
                    cls.scaler.step(_opt) if cls.scaler.is_enabled() else _raw(*args, **kwargs)
                    cls.scaler.update()

                opt.step = step
        out_models = model_list[0] if single else model_list
        if optimizers is None:
            return out_models
        return out_models, (opts[0] if not isinstance(optimizers, (list, tuple)) else opts)

    class scale_loss:  # noqa: N801 - apex's name
        def __init__(self, loss, optimizers=None, **unused):
            self.loss = loss

        def __enter__(self):
            scaler = AmpFallback.scaler
            return scaler.scale(self.loss) if scaler is not None and scaler.is_enabled() else self.loss

        def __exit__(self, *exc):
            return False


APEX_FALLBACKS = {
    "FusedLayerNorm": FusedLayerNormFallback,
    "MixedFusedLayerNorm": FusedLayerNormFallback,
    "FusedAdam": FusedAdamFallback,
    "FusedSGD": FusedSGDFallback,
    "SyncBatchNorm": torch.nn.SyncBatchNorm,
    "multi_tensor_applier": multi_tensor_applier,
    "amp": AmpFallback,
}


class _ApexNamespace:
    """Stands in for `apex` (or a submodule) when apex is absent: known names resolve to torch
    fallbacks, anything else is a MissingPackage that fails clearly when used."""

    def __init__(self, dotted: str):
        self._dotted = dotted

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return apex_fallback(f"{self._dotted}.{name}")

    def __bool__(self):
        return False

    def __call__(self, *args, **kwargs):
        MissingPackage("apex", self._dotted, "an apex import", "Install ROCm's apex build (ROCm/apex).")._fail("()")


def apex_fallback(dotted: str):
    """The torch fallback for `apex....<name>`, a namespace for a package path, else a MissingPackage."""
    name = dotted.rsplit(".", 1)[-1]
    if name in APEX_FALLBACKS:
        return APEX_FALLBACKS[name]
    if name.islower():  # a module path (or a function in one): resolve further on use
        return _ApexNamespace(dotted)
    return MissingPackage("apex", dotted, "an apex import", "Install ROCm's apex build (ROCm/apex) or disable the feature.")


# <<< helper part 70
