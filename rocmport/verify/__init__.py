"""Verify: does a ported tree import and train here, without NVIDIA-only packages?

The run and its options (run), what the launched processes need (environment; the machine itself is
probed in rocmport.machine), the import firewall
(firewall), the stages (stages, unit_tests, functional, bridge_stage), the launchers (launcher,
slurm_task), the workers started by module path (gpt_worker, pytest_plugin, proxy_shim) and the
report formats (report)."""
