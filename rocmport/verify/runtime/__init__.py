"""What runs inside the processes verify starts (ranks, their children, upstream's scripts): the
HIP simulation, the proxy shim, TE's CPU kernels, the GPT worker, the pytest plugin and the Slurm
task. Nothing here imports the orchestration side (tests/test_architecture.py)."""
