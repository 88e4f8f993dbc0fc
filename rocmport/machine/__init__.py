"""What this machine is and has: the interpreter, torch and devices (`probe`), Pythons that meet a
tree's declared ranges (`python`), per-GPU launch settings (`launch_profile`), the processor time
other jobs take (`cpu_meter`) and the installed ROCm components against the line's matrix (`doctor`).
Verify, refresh, package and the commands read the machine here; nothing here runs a stage."""
