"""capability-gates: CUDA compute-capability gates go through HIP-aware helpers.

`torch.cuda.get_device_capability()[0]`, `get_device_properties(dev).major` in a comparison and
megatron/training's `get_device_arch_version()` decide NVIDIA-architecture behaviour (e.g.
Blackwell no longer needs CUDA_DEVICE_MAX_CONNECTIONS=1). On HIP torch reports AMD gfx numbers
there, which an RDNA4 GPU (12) would read as Blackwell: `nvidia_arch_major()` answers Hopper-class
(9) on HIP, and exactly what torch reports on CUDA. A `major >= 9` test switches on Hopper-only
hardware (NVLS multimem kernels in inference_layers.py / torch_symm_triton, FA3): it becomes
`nvidia_hopper_or_newer()`, False on HIP (MI300 reports 9 too), as AMD's fork guards it. A capability
tuple read whole (`dc = torch.cuda.get_device_capability()`, then `dc[0] >= 8` in arguments.py)
comes from `nvidia_capability()`."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rocmport.codemods.base import NAMES, Codemod, Context, means_as_spelled, spelled_plainly
from rocmport.codemods.edits import add_imports, helper_imports, prepend_to_function
from rocmport.codemods.guard import helper_import

CAPABILITY = "torch.cuda.get_device_capability"
PROPERTIES = "torch.cuda.get_device_properties"
_AT_MOST_ONE_ARG = m.Call(
    args=m.MatchIfTrue(lambda args: not args or (len(args) == 1 and args[0].keyword is None and not args[0].star))
)


class _CapabilityGates(cst.CSTTransformer):
    """The three shapes, however torch.cuda or the functions were imported."""

    METADATA_DEPENDENCIES = NAMES
    MAJOR_INDEX = m.Subscript(value=_AT_MOST_ONE_ARG, slice=[m.SubscriptElement(m.Index(m.Integer("0")))])
    MAJOR_ATTR = m.Attribute(value=_AT_MOST_ONE_ARG, attr=m.Name("major"))
    HOPPER = m.OneOf(
        m.ComparisonTarget(m.GreaterThanEqual(), m.Integer("9")), m.ComparisonTarget(m.GreaterThan(), m.Integer("8"))
    )

    def __init__(self, plain: bool = False):
        self.plain = plain  # spelled_plainly: no scope analysis, a name means what it spells
        self.sites = 0
        self.found: list[tuple[cst.CSTNode, str]] = []
        self.uses: set[str] = set()
        self.compared: set[int] = set()  # major expressions a comparison rewrites as a whole

    def _major_call(self, node: cst.CSTNode) -> cst.Call | None:
        """The capability/properties call whose major number ``node`` reads, else None."""
        if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Call) and m.matches(node, self.MAJOR_INDEX):
            return node.value if means_as_spelled(self, self.plain, node.value.func, CAPABILITY) else None
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Call) and m.matches(node, self.MAJOR_ATTR):
            return node.value if means_as_spelled(self, self.plain, node.value.func, PROPERTIES) else None
        return None

    def _helper(self, original: cst.CSTNode, name: str, call: cst.Call, what: str) -> cst.Call:
        self.sites += 1
        self.uses.add(name)
        self.found.append((original, f"{what} -> {name}()"))
        return cst.Call(cst.Name(name), args=[a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in call.args])

    def visit_Comparison(self, node: cst.Comparison):
        if len(node.comparisons) == 1 and self._major_call(node.left) is not None:
            self.compared.add(id(node.left))

    def leave_Comparison(self, original: cst.Comparison, updated: cst.Comparison):
        if id(original.left) not in self.compared:
            return updated
        call = self._major_call(original.left)
        assert call is not None  # visit_Comparison recorded it
        if m.matches(original.comparisons[0], self.HOPPER):
            return self._helper(original, "nvidia_hopper_or_newer", call, "major >= 9 (Hopper-only hardware)")
        what = f"{CAPABILITY}()[0]" if isinstance(original.left, cst.Subscript) else f"{PROPERTIES}().major"
        major = self._helper(original.left, "nvidia_arch_major", call, what)
        return updated.with_changes(left=major)

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript):
        call = None if id(original) in self.compared else self._major_call(original)
        if call is not None and isinstance(original.value, cst.Call):
            return self._helper(original, "nvidia_arch_major", call, f"{CAPABILITY}()[0]")
        return updated

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        value = original.value
        if (
            isinstance(value, cst.Call)
            and m.matches(value, _AT_MOST_ONE_ARG)
            and means_as_spelled(self, self.plain, value.func, CAPABILITY)
        ):
            return updated.with_changes(value=self._helper(original, "nvidia_capability", value, f"{CAPABILITY}()"))
        return updated


class CapabilityGates(Codemod):
    NAME = "capability-gates"
    DESCRIPTION = "CUDA compute-capability gates go through HIP-aware helpers (Hopper-only features off on HIP)"
    TRIGGERS = ("get_device_capability", "get_device_properties", "def get_device_arch_version(")

    def transform(self, module: cst.Module, ctx: Context):
        gates = _CapabilityGates(ctx.prefilter and spelled_plainly(ctx.code(module), (CAPABILITY, PROPERTIES)))
        # A call that means one of the two spells its name (in the call or in its import).
        if not ctx.absent(module, CAPABILITY.rsplit(".", 1)[1], PROPERTIES.rsplit(".", 1)[1]):
            before = module
            rewritten = module.visit(gates) if gates.plain else ctx.wrap(module).visit(gates)
            ctx.sites_at(before, gates.found)
            module = rewritten if gates.sites else before  # an equal copy otherwise: keep its metadata
        if gates.uses:
            module = add_imports(module, helper_imports(ctx, *sorted(gates.uses)))
        module, arch = prepend_to_function(
            module,
            ("get_device_arch_version",),
            (
                f"{helper_import(ctx, 'is_hip', 'HIP_ARCH_EQUIVALENT')}\n"
                "if is_hip():\n"
                "    return HIP_ARCH_EQUIVALENT  # rocmport: AMD gfx numbers are not NVIDIA architectures\n"
            ),
            "HIP_ARCH_EQUIVALENT",
            ctx,
            "get_device_arch_version() answers HIP_ARCH_EQUIVALENT on HIP",
        )
        return module, gates.sites + arch
