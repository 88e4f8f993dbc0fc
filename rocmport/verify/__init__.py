"""Verify: does a ported tree import and train here, without NVIDIA-only packages?

Rooms: orchestration/ (the run and its options, the stage contract and registry, the report, the
summary, the launchers, the processes' environment and firewall, TE's Python layer), stages/ (one
module or package per stage: imports, gpt_training, unit_tests/, functional, bridge; case_plan for
stage 4's cases), analyses/ (port_sites, impact), and runtime/: what runs inside the started
processes (the Slurm task, the workers started by module path, the proxy shim, the HIP simulation),
which talks to this side only through runtime.protocol. How to add a stage: docs/adding-a-stage.md."""
