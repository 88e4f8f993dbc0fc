"""verify's stages, one module or package each: imports and GPT training (gpt_training), upstream's
unit tests (unit_tests/), upstream's functional GPT case (functional), Megatron-Bridge (bridge)."""
