"""The default codemod recipe per upstream (used by `apply --codemods-only` and new series)."""

DEFAULT_CODEMODS: dict[str, list] = {
    "megatron-lm": ["apex-to-torch", "fused-kernel-fallbacks", "guard-nvidia-only-imports", "attention-backend-env",
                    "te-version-gates", "device-probes", "flash-attention-hooks",
                    "capability-gates", "grouped-gemm"],
    # Bridge imports TE unconditionally (peft/lora*.py; transformer_engine_torch from v0.4): guard it
    # so `import megatron.bridge` works without TE.
    "megatron-bridge": [{
        "name": "guard-nvidia-only-imports",
        "options": {"packages": {"transformer_engine": "transformer-engine", "transformer_engine_torch": "transformer-engine"}},
    }],
}
