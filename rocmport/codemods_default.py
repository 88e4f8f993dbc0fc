"""The default codemod recipe per upstream (used by `apply --codemods-only`). Empty until codemods land."""

DEFAULT_CODEMODS: dict[str, list[str]] = {"megatron-lm": [], "megatron-bridge": []}
