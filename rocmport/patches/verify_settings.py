"""A series' `verify:` block (which upstream unit tests stage 3 runs, and the known failures), validated.

It is part of the series file, so it is read here with the rest of the series; what verify does
with it lives in rocmport.verify.stages.unit_tests.suite."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rocmport.errors import BadInput
from rocmport.inputs import has_control

KEYS = (
    "unit_tests",
    "known_failures",
    "rocm_known_failures",
    "hip_known_failures",
    "proxy_known_failures",
    "rocm_arch_known_failures",
)


@dataclass(frozen=True)
class VerifySettings:
    """A series' verify block, validated."""

    unit_tests: dict[str, str] = field(default_factory=dict)
    known_failures: dict[str, str] = field(default_factory=dict)
    rocm_known_failures: dict[str, str] = field(default_factory=dict)
    hip_known_failures: dict[str, str] = field(default_factory=dict)
    proxy_known_failures: dict[str, str] = field(default_factory=dict)
    # AMD's marks that hold on one GPU architecture only ({gfx arch: {test id: reason}}; e.g. its
    # failing_on_rocm_mi250, which its CI deselects where HIP_ARCHITECTURES is gfx90a).
    rocm_arch_known_failures: dict[str, dict[str, str]] = field(default_factory=dict)

    def known_for(
        self, mode: str, hip: bool, hip_sim: bool = False, arch: str | None = None
    ) -> tuple[dict[str, str], dict[str, str]]:
        """(the known failures that apply in this mode, {list name: why it does not apply}).

        ``rocm_known_failures`` are AMD's marks for ROCm (its fork's CI deselects them on every AMD
        GPU): they apply where the tree runs as on ROCm, a ROCm GPU or the HIP simulation, which
        stands in for one. ``rocm_arch_known_failures`` apply there too, each list only on its
        architecture: ``arch``, the real GPU's (gcnArchName) or the simulated one (--hip-arch).
        ``hip_known_failures`` are tests that the port's own HIP branches change on purpose (e.g. the
        async writer spawned, not forked): wherever they run, simulated or real."""
        applied = dict(self.known_failures)
        skipped = {}
        rocm = (mode == "gpu" and hip) or hip_sim
        if hip or hip_sim:
            applied.update(self.hip_known_failures)
        elif self.hip_known_failures:
            skipped["hip_known_failures"] = (
                "applied only where the port's HIP branches run (a ROCm GPU or the HIP simulation)"
            )
        if rocm:
            applied.update(self.rocm_known_failures)
        elif self.rocm_known_failures:
            skipped["rocm_known_failures"] = "applied only on ROCm (a ROCm GPU or the HIP simulation)"
        for gfx, tests in sorted(self.rocm_arch_known_failures.items()):
            if rocm and arch == gfx:
                applied.update(tests)
            elif tests:
                skipped[f"rocm_arch_known_failures.{gfx}"] = (
                    f"applied only on a {gfx} GPU (real or simulated: --hip-arch {gfx}); "
                    f"this run's is {arch or ('none' if not rocm else 'unknown')}"
                )
        if mode == "cpu-proxy":
            applied.update(self.proxy_known_failures)
        elif self.proxy_known_failures:
            skipped["proxy_known_failures"] = "applied only in CPU-proxy mode"
        return applied, skipped


def parse_settings(data, where: str) -> VerifySettings:
    """The series' `verify:` mapping as VerifySettings; BadInput naming ``where`` and the key when malformed."""
    data = {} if data is None else data
    if not isinstance(data, dict) or set(map(str, data)) - set(KEYS):
        raise BadInput(
            f"{where}: key 'verify' must be a mapping with 'unit_tests' ([paths] or {{path: why}}) and "
            "'known_failures', 'rocm_known_failures', 'hip_known_failures', 'proxy_known_failures' ({test id: reason}), "
            "'rocm_arch_known_failures' ({gfx arch: {test id: reason}})"
        )
    tests = {} if data.get("unit_tests") is None else data["unit_tests"]  # `false` or `0` is no list of tests
    if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
        tests = {t: "" for t in tests}
    if not (
        isinstance(tests, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in tests.items())
        and all(k and not k.startswith("-") and not has_control(k) for k in tests)
    ):
        raise BadInput(
            f"{where}: key 'verify.unit_tests' must be a list of test paths (strings) under the tree, "
            "or a mapping of them to why each is in the suite"
        )
    lists = {k: {} if data.get(k) is None else data[k] for k in KEYS[1:-1]}
    for key, value in lists.items():
        if not _reasons(value):
            raise BadInput(
                f"{where}: key 'verify.{key}' must map test ids, files or directories (strings) to reasons (strings)"
            )
    by_arch = {} if data.get("rocm_arch_known_failures") is None else data["rocm_arch_known_failures"]
    if not (
        isinstance(by_arch, dict)
        and all(isinstance(a, str) and _GFX.fullmatch(a) and _reasons(v) for a, v in by_arch.items())
    ):
        raise BadInput(
            f"{where}: key 'verify.rocm_arch_known_failures' must map GPU architectures (gfx942, gfx90a, ...) "
            "to mappings of test ids to reasons (strings)"
        )
    return VerifySettings(
        unit_tests=dict(tests), rocm_arch_known_failures={a: dict(v) for a, v in by_arch.items()}, **lists
    )


_GFX = re.compile(r"gfx[0-9a-f]{2,4}", re.ASCII)


def _reasons(value) -> bool:
    """Is ``value`` a mapping of test ids, files or directories to reasons (all strings)?"""
    return isinstance(value, dict) and all(
        isinstance(k, str) and k and not has_control(k) and isinstance(v, str) for k, v in value.items()
    )
