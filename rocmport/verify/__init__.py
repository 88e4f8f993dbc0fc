"""Verify: does a ported tree import and train here, without NVIDIA-only packages?

The run and its options (run), what the launched processes need (environment; the machine itself is
probed in rocmport.machine), the import firewall
(firewall), the stages (stages, unit_tests, functional, bridge_stage), the launchers (launcher), the
report formats (report); what runs inside the started processes is in runtime/ (the Slurm task, the
workers started by module path, the proxy shim, the HIP simulation), which talks to this side only
through runtime.protocol."""
