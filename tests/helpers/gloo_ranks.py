"""How a test's gloo rank script ends: as verify's GPT worker does (gpt_worker._exit_without_finalizing).
Why: torch drops a finished gloo work, and the tensors it holds, on the group's run-loop thread; when that
lands while the interpreter is finalizing, the thread cannot take the GIL and the rank aborts
("terminate called without an active exception"). CI saw it once as a SIGABRT of rank 0 after the
torch-FSDP2 mesh script had written its result (its reduce-scatter and all-gather leave such works)."""

# The script's last lines (the process group already destroyed): flush what was printed, leave.
LEAVE_WITHOUT_FINALIZING = "import os as _os\nsys.stdout.flush()\nsys.stderr.flush()\n_os._exit(0)\n"
