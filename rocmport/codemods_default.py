"""The default codemod recipe per upstream (used by `apply --codemods-only` and new series)."""

DEFAULT_CODEMODS: dict[str, list[str]] = {
    "megatron-lm": ["apex-to-torch", "fused-kernel-fallbacks", "guard-nvidia-only-imports", "attention-backend-env",
                    "te-version-gates"],
    "megatron-bridge": ["guard-nvidia-only-imports"],
}
