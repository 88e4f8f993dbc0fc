"""Each codemod's runtime helpers, as Python the type checker reads: `<codemod module>.py` holds
the parts of the generated helper module (megatron/core/_rocm.py) that the codemod's rewritten sites
import, `core.py` what every helper module has. rocmport/codemods/helper.py assembles a tree's
helper from the pieces its recipe uses; nothing here is imported at run time."""
