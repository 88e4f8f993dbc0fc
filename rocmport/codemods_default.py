"""The default codemod recipe per upstream (used by `apply --codemods-only` and new series)."""

DEFAULT_CODEMODS: dict[str, list] = {
    "megatron-lm": ["apex-to-torch", "fused-kernel-fallbacks", "guard-nvidia-only-imports", "attention-backend-env",
                    "te-version-gates", "device-probes", "flash-attention-hooks",
                    "capability-gates", "grouped-gemm"],
    # Bridge's peft/lora*.py import TE unconditionally: guard it so `import megatron.bridge` works without TE.
    "megatron-bridge": [{"name": "guard-nvidia-only-imports", "options": {"packages": {"transformer_engine": "transformer-engine"}}}],
}
