"""Launch profiles: what `rocmport env` sets for one GPU kind and this machine's fabric.

A profile is rocmport's launcher environment (rocmport/launch_env.py: the part every AMD GPU gets,
which the port's helper also applies in-process) plus, each with its reason and its source:
- the values of one architecture (`--arch gfx942|gfx950|gfx90a|gfx1100|gfx1201|gfx906`, or `auto`: the
  first GPU's `gcnArchName`), from AMD's per-GPU launcher files and the components' own documents;
- the fabric, read from this machine when the launcher runs: the RDMA devices under
  /sys/class/infiniband with an active port (NCCL_IB_HCA), their RoCE v2 GID index (NCCL_IB_GID_INDEX),
  the interface the route to the master address leaves by (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME);
- `--deterministic`'s launcher-only values, and `--tune record|replay DIR` (GEMM tuning).
A variable already set in the launcher's environment is never overwritten: the user's value wins.
The sysfs and procfs roots are parameters, so a fake tree stands in for a machine in the tests."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from rocmport.errors import BadInput
from rocmport.inputs import read_text
from rocmport.fsutil import probe_writable_dir, write_file
from rocmport.launch_env import DETERMINISTIC_ENV, LAUNCH_ENV
from rocmport.components import ARCHS, base_arch

PRIMUS = "AMD-AGI/Primus runner/helpers/envs"
FORK_SCRIPT = "ROCm/Megatron-LM examples/llama/train_llama3.sh (its 0.15 port, NVIDIA/Megatron-LM refs/pull/3318/head)"
ROCM_TE_README = "ROCm/TransformerEngine README.rst"


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    reason: str
    source: str
    part: str  # base | deterministic | <arch> | fabric | tune


@dataclass(frozen=True)
class Resolved:
    """A setting against the launcher's environment: ``yours`` when the environment already has it
    (then ``value`` is the environment's and ``ours`` rocmport's)."""

    setting: Setting
    value: str
    yours: bool

    def to_dict(self) -> dict:
        s = self.setting
        return {
            "name": s.name,
            "value": self.value,
            "reason": s.reason,
            "source": s.source,
            "part": s.part,
            "yours": self.yours,
            "ours": s.value,
        }


# Where each value of rocmport's base launcher environment comes from.
BASE_SOURCES = {
    "CUDA_DEVICE_MAX_CONNECTIONS": f"{PRIMUS}/base_env.sh; {FORK_SCRIPT}",
    "GPU_MAX_HW_QUEUES": f"{PRIMUS}/base_env.sh; {FORK_SCRIPT}",
    "HSA_NO_SCRATCH_RECLAIM": f"{FORK_SCRIPT}; {PRIMUS}/MI250X.sh",
    "HSA_ENABLE_SCRATCH_ASYNC_RECLAIM": "AMD-AGI/Primus .github/workflows/docker-release/Dockerfile.primus-v26.5.1",
    "TORCH_NCCL_HIGH_PRIORITY": f"{PRIMUS}/base_env.sh; {FORK_SCRIPT}",
    "NCCL_CHECKS_DISABLE": f"{PRIMUS}/base_env.sh; {FORK_SCRIPT}",
    "RCCL_MSCCL_ENABLE": f"{PRIMUS}/base_env.sh; {FORK_SCRIPT}",
    "NCCL_ALGO": f"{PRIMUS}/base_env.sh (PRIMUS_DETERMINISTIC=1)",
    "ROCBLAS_DEFAULT_ATOMICS_MODE": f"{PRIMUS}/base_env.sh (PRIMUS_DETERMINISTIC=1)",
}

# --deterministic's values only a launcher can set (read before validate_args runs).
LAUNCHER_DETERMINISTIC = [
    Setting(
        "TORCH_COMPILE_DISABLE",
        "1",
        "no torch.compile in a reproducible run (Primus: a race in some Triton versions); torch._dynamo reads it "
        "when megatron.core.jit first imports it, before validate_args, so only the launcher can set it",
        f"{PRIMUS}/base_env.sh (PRIMUS_DETERMINISTIC=1)",
        "deterministic",
    ),
]

FA_TRITON = Setting(
    "FLASH_ATTENTION_TRITON_AMD_ENABLE",
    "TRUE",
    "ROCm flash-attention's CK backend does not build for RDNA; its Triton backend is chosen at run time by this variable",
    "ROCm/flash-attention README at v2.8.0-cktile ('Triton Backend'); the series' rocm: matrix (flash_attn variants.triton)",
    "",
)

# Per architecture: what AMD's launchers add for that GPU kind. Values that only restate a default, or
# only tune a component that does not build there, are left out (--explain says which).
ARCH_SETTINGS: dict[str, list[Setting]] = {
    "gfx942": [
        Setting(
            "HSA_KERNARG_POOL_SIZE",
            "12582912",
            "a 12 MiB kernel-argument pool for models that launch many kernels",
            f"{PRIMUS}/MI300X.sh, MI325X.sh",
            "gfx942",
        ),
    ],
    "gfx950": [
        Setting(
            "RCCL_WARP_SPEED_AUTO",
            "0",
            "RCCL's WarpSpeed is on by default in gfx950 builds and can produce NaN losses",
            f"{PRIMUS}/MI350X.sh, MI355X.sh",
            "gfx950",
        ),
        Setting(
            "NVTE_ROCM_ENABLE_MXFP8",
            "1",
            "ROCm TE runs MXFP8 recipes only with this set (gfx95x only; read when TE is imported, before validate_args)",
            f"{ROCM_TE_README} ('MXFP8 support on ROCm (gfx95x only)'); {PRIMUS}/base_env.sh",
            "gfx950",
        ),
    ],
    "gfx90a": [],
    "gfx1100": [replace(FA_TRITON, part="gfx1100")],
    "gfx1201": [replace(FA_TRITON, part="gfx1201")],
    "gfx906": [
        Setting(n, v, why, "rocmport's arch table (rocmport/components/__init__.py ARCHS)", "gfx906")
        for n, v, why in ARCHS["gfx906"].env
    ],
}
# Why an architecture adds nothing, or less than AMD's file for it (printed by --explain).
ARCH_NOTES = {
    "gfx942": "Primus MI300X.sh also sets HSA_XNACK=0 and GPU_MAX_HEAP_SIZE=100, the runtime's defaults: not repeated",
    "gfx950": "Primus MI355X.sh also sets HSA_XNACK=1 and HSA_ENABLE_INTERRUPT=1 calling MI355X an APU; it is a discrete GPU "
    "(MI300A is the APU), so they are not taken",
    "gfx90a": "Primus MI250X.sh sets only the base values and Transformer Engine's cast-transpose switches; ROCm TE does not "
    "build for gfx90a (ROCm/TransformerEngine#439): nothing to add",
    "gfx1100": "a workstation GPU: RCCL's values matter only with several cards; no RDMA fabric is expected",
    "gfx1201": "a workstation GPU: RCCL's values matter only with several cards; FLASH_ATTENTION_TRITON_AMD_ENABLE is UNVERIFIED "
    "on RDNA4 (the v2.8.0-cktile README names RDNA3)",
    "gfx906": "HSA_OVERRIDE_GFX_VERSION is UNVERIFIED (community MI50 setups)",
}
ARCH_CHOICES = tuple(ARCH_SETTINGS)


def base_settings(deterministic: bool) -> list[Setting]:
    rows = [Setting(n, v, why, BASE_SOURCES[n], "base") for n, v, why in LAUNCH_ENV]
    if deterministic:
        rows += [Setting(n, v, why, BASE_SOURCES[n], "deterministic") for n, v, why in DETERMINISTIC_ENV]
        rows += LAUNCHER_DETERMINISTIC
    return rows


def resolve_arch(arch: str, device_arch=None) -> str:
    """``arch`` as a known architecture; `auto` asks the device (``device_arch``: a callable, the GPU's by default)."""
    if arch == "auto":
        if device_arch is None:
            from rocmport.machine.probe import gpu_arch as device_arch
        found = base_arch(device_arch())
        if not found:
            raise BadInput(f"--arch auto: no AMD GPU visible here; name it: --arch {'|'.join(ARCH_CHOICES)}")
        if found not in ARCH_SETTINGS:
            raise BadInput(
                f"--arch auto: this GPU is {found}, which has no launch profile; known: {', '.join(ARCH_CHOICES)}"
            )
        return found
    name = base_arch(arch) or ""
    if name not in ARCH_SETTINGS:
        raise BadInput(f"--arch {arch!r}: no launch profile for it; choose one of {', '.join(ARCH_CHOICES)} or auto")
    return name


_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


def check_host(value: str, where: str) -> str:
    """``value`` when it is an IP address or a DNS host name (labels of at most 63 letters, digits,
    '-' or '_', 253 characters in all), else BadInput naming ``where`` (--master-addr, MASTER_ADDR):
    the resolver's own refusal of a 64-character label is a UnicodeError, not an answer."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    name = value[:-1] if value.endswith(".") else value
    if not name or len(name) > 253:
        raise BadInput(f"{where} {value[:80]!r}: not a host name (empty, or over 253 characters); give a host or an IP")
    bad = next((label for label in name.split(".") if not _LABEL.match(label)), None)
    if bad is not None:
        why = "over 63 characters" if len(bad) > 63 else "empty, or not letters, digits, '-' and '_'"
        raise BadInput(f"{where} {value[:80]!r}: not a host name (a label {why}); give a host or an IP")
    return value


# ---- the fabric ------------------------------------------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _roce_v2_ipv4_gid(port: Path) -> int | None:
    """The lowest GID index of a port that is RoCE v2 over an IPv4-mapped address (what NCCL wants on RoCE)."""
    types = port / "gid_attrs" / "types"
    if not types.is_dir():
        return None
    for idx in sorted((int(p.name) for p in types.iterdir() if p.name.isdigit())):
        if _read(types / str(idx)).lower() == "roce v2" and _read(port / "gids" / str(idx)).lower().startswith(
            "0000:0000:0000:0000:0000:ffff:"
        ):
            return idx
    return None


def rdma_devices(sys_root: Path) -> list[dict]:
    """Each RDMA device with an ACTIVE port: {name, port, link_layer, gid_index}."""
    root = sys_root / "class" / "infiniband"
    found: list[dict] = []
    if not root.is_dir():
        return found
    for dev in sorted(root.iterdir(), key=lambda p: p.name):
        ports = dev / "ports"
        if not ports.is_dir():
            continue
        for port in sorted(ports.iterdir(), key=lambda p: p.name):
            if "ACTIVE" not in _read(port / "state"):
                continue
            layer = _read(port / "link_layer") or "InfiniBand"
            found.append(
                {
                    "name": dev.name,
                    "port": port.name,
                    "link_layer": layer,
                    "gid_index": _roce_v2_ipv4_gid(port) if layer == "Ethernet" else None,
                }
            )
            break
    return found


def route_interface(address: str, proc_root: Path) -> str | None:
    """The interface the IPv4 route to ``address`` leaves by (longest prefix in /proc/net/route)."""
    try:
        target = int(ipaddress.IPv4Address(address))
    except ValueError:
        return None
    best: tuple[int, str] | None = None
    for line in _read(proc_root / "net" / "route").splitlines()[1:]:
        cols = line.split()
        if len(cols) < 8:
            continue
        iface, dest, flags, mask = cols[0], cols[1], cols[3], cols[7]
        if not int(flags, 16) & 1:  # RTF_UP
            continue
        # The kernel prints each address as the 32-bit word in host (little-endian) order.
        d, mk = (int.from_bytes(bytes.fromhex(x)[::-1], "big") for x in (dest, mask))
        if target & mk == d & mk:
            length = bin(mk).count("1")
            if best is None or length > best[0]:
                best = (length, iface)
    return best[1] if best else None


def fabric_settings(
    master_addr: str | None,
    sys_root: Path = Path("/sys"),
    proc_root: Path = Path("/proc"),
    resolve=socket.gethostbyname,
) -> tuple[list[Setting], list[str]]:
    """The fabric part, read from this machine, and what was found (or not) for --explain."""
    out: list[Setting] = []
    notes: list[str] = []
    sysfs = sys_root / "class" / "infiniband"
    devices = rdma_devices(sys_root)
    if not devices:
        notes.append(
            f"fabric: no RDMA device with an active port under {sysfs}: RCCL uses sockets (NCCL_IB_* left unset)"
        )
    else:
        names = ",".join(d["name"] for d in devices)
        out.append(
            Setting(
                "NCCL_IB_HCA",
                names,
                f"the RDMA devices with an active port under {sysfs}",
                f"{PRIMUS}/base_env.sh (get_nccl_ib_hca.sh); {FORK_SCRIPT} (rdma link)",
                "fabric",
            )
        )
        out.append(
            Setting(
                "NCCL_CROSS_NIC",
                "0",
                "each rank keeps to its own NIC across nodes (rail-aligned fabrics)",
                f"{PRIMUS}/base_env.sh; {FORK_SCRIPT}",
                "fabric",
            )
        )
        roce = [d for d in devices if d["link_layer"] == "Ethernet"]
        gids = Counter(d["gid_index"] for d in roce if d["gid_index"] is not None)
        if gids:
            index, count = gids.most_common(1)[0]
            why = f"the RoCE v2 GID over IPv4 of {count} of the {len(roce)} RoCE devices"
            if len(gids) > 1:
                why += f" (others: {', '.join(f'{i} on {n}' for i, n in gids.items() if i != index)})"
            out.append(
                Setting(
                    "NCCL_IB_GID_INDEX",
                    str(index),
                    why,
                    f"read from {sysfs}/<dev>/ports/<n>/gid_attrs/types; AMD's launchers hard-code 3 "
                    f"({PRIMUS}/base_env.sh; {FORK_SCRIPT})",
                    "fabric",
                )
            )
        elif roce:
            notes.append("fabric: RoCE devices without a RoCE v2 IPv4 GID: NCCL_IB_GID_INDEX left to RCCL")
        else:
            notes.append(
                "fabric: InfiniBand link layer: GID index 0 (RCCL's default) is right, NCCL_IB_GID_INDEX left unset"
            )
        out.append(
            Setting(
                "NCCL_PROTO",
                "Simple",
                "AMD's MI300 training scripts run RCCL's Simple protocol over RDMA",
                FORK_SCRIPT,
                "fabric",
            )
        )
    if not master_addr:
        notes.append(
            "fabric: no master address (--master-addr or MASTER_ADDR): the socket interface is left to RCCL and gloo"
        )
        return out, notes
    try:
        address = resolve(master_addr)
    except OSError as e:
        notes.append(f"fabric: master address {master_addr!r} does not resolve here ({e}): socket interface left unset")
        return out, notes
    if ipaddress.ip_address(address).is_loopback:
        notes.append(f"fabric: master {master_addr} is this host (loopback): single node, socket interface left unset")
        return out, notes
    iface = route_interface(address, proc_root)
    if iface is None:
        notes.append(
            f"fabric: no route to the master {master_addr} ({address}) in {proc_root / 'net' / 'route'}: socket interface left unset"
        )
        return out, notes
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        out.append(
            Setting(
                name,
                iface,
                f"the interface the route to the master {master_addr} ({address}) leaves by",
                f"{PRIMUS}/base_env.sh (get_ip_interface.sh); {FORK_SCRIPT} (multi-node)",
                "fabric",
            )
        )
    return out, notes


# ---- the whole profile -------------------------------------------------------------------------------


def profile(
    arch: str | None = None,
    deterministic: bool = False,
    *,
    master_addr: str | None = None,
    sys_root: Path = Path("/sys"),
    proc_root: Path = Path("/proc"),
    fabric: bool = True,
    tune: list[Setting] | tuple = (),
    resolve=socket.gethostbyname,
) -> tuple[list[Setting], list[str]]:
    """Every setting in order (a later part replaces an earlier one's value of the same variable) and the notes."""
    rows = base_settings(deterministic)
    notes: list[str] = []
    if arch:
        rows += ARCH_SETTINGS[arch]
        if arch in ARCH_NOTES:
            notes.append(f"{arch}: {ARCH_NOTES[arch]}")
    if fabric:
        more, found = fabric_settings(master_addr, sys_root, proc_root, resolve)
        rows += more
        notes += found
    rows += list(tune)
    merged: dict[str, Setting] = {}
    for row in rows:
        merged[row.name] = row  # dicts keep the first insertion's position
    return list(merged.values()), notes


def verify_env(arch: str | None, environ=None) -> dict[str, str]:
    """What verify's started processes get on ROCm (a real GPU, or the HIP simulation's): the launch
    profile of ``arch`` (the device's: `probe.gpu_arch()`, or the simulated MI300X's gfx942), without
    the fabric part (verify's ranks share one node's loopback, or the launcher's rendezvous), and
    without what the environment already sets (the user's value wins). None: not ROCm, nothing."""
    if arch is None:
        return {}
    name = base_arch(arch)
    settings, _ = profile(name if name in ARCH_SETTINGS else None, fabric=False)
    return {r.setting.name: r.value for r in resolve_env(settings, environ) if not r.yours}


def resolve_env(settings: list[Setting], environ=None) -> list[Resolved]:
    """Each setting against ``environ`` (default os.environ): a variable already set keeps its value."""
    environ = os.environ if environ is None else environ
    return [Resolved(s, environ[s.name], True) if s.name in environ else Resolved(s, s.value, False) for s in settings]


# ---- GEMM tuning (--tune record|replay DIR) -----------------------------------------------------------

TORCH_TUNABLEOP = "torch.cuda.tunable (PyTorch TunableOp: 'Environment Variable Interface', 'File Input and Output')"
TUNABLEOP_FILE = "tunableop_results.csv"  # torch inserts the device ordinal: tunableop_results0.csv, ...
TE_SAVE_FILE = "te_hipblaslt_algos_%i.csv"  # ROCm TE replaces %i with the process id: one file per rank
TE_LOAD_FILE = "te_hipblaslt_algos.csv"  # replay: the ranks' files merged into one
# AMD's fork runs its GEMM tuning with these counts (GEMM_TUNING=1 in its training scripts).
TE_RUN_COUNT, TE_ALGO_COUNT = "10", "50"


def tune_files(directory: Path) -> dict[str, list[Path]]:
    """What a recording left in ``directory``: torch's per-device results and TE's per-process algorithms."""
    return {
        "torch": sorted(directory.glob("tunableop_results*.csv")),
        "te": sorted(p for p in directory.glob("te_hipblaslt_algos_*.csv")),
    }


def merge_te_algos(files: list[Path], into: Path) -> int:
    """One TE algorithm file from the ranks' (TE_HIPBLASLT_ALGO_LOAD reads a single file): a header line
    the files share is kept once, every other line once, in order. Returns the lines written."""
    # Through the checked reader: a file that is not UTF-8 or a link out of the directory is one line, exit 2
    texts = [
        read_text(f, "TE algorithm file", root=into.parent, fix="delete it and record again").splitlines()
        for f in files
    ]
    firsts = {t[0] for t in texts if t}
    header = (
        next(iter(firsts))
        if len(firsts) == 1 and len(files) > 1 and any(c.isalpha() for c in next(iter(firsts)))
        else None
    )
    seen: dict[str, None] = {}
    for lines in texts:
        for line in lines[1:] if header is not None else lines:
            if line.strip():
                seen.setdefault(line, None)
    body = ([header] if header is not None else []) + list(seen)
    write_file(into, "\n".join(body) + "\n")  # refuses a link (to a file outside DIR) or a device
    return len(body)


def tune_settings(mode: str, directory: Path) -> tuple[list[Setting], list[str]]:
    """record: tune every new GEMM shape (torch's TunableOp, ROCm TE's hipBLASLt selection) and write
    the results into ``directory``; replay: read them back and tune nothing. BadInput when replay
    finds nothing recorded."""
    d = directory.resolve()
    notes: list[str] = []
    torch_file = str(d / TUNABLEOP_FILE)
    common = [
        Setting(
            "PYTORCH_TUNABLEOP_ENABLED",
            "1",
            "torch's GEMMs (all of --transformer-impl local's) go through TunableOp",
            TORCH_TUNABLEOP,
            "tune",
        ),
        Setting(
            "PYTORCH_TUNABLEOP_RECORD_UNTUNED",
            "0",
            "recording untuned GEMMs turns the results lookup off: not wanted here",
            TORCH_TUNABLEOP + "; torch's TuningContext::IsRecordUntunedEnabled",
            "tune",
        ),
        Setting(
            "PYTORCH_TUNABLEOP_FILENAME",
            torch_file,
            f"{'written' if mode == 'record' else 'read'} as {d}/tunableop_results<device>.csv (torch inserts each "
            "process's device ordinal before the extension)",
            TORCH_TUNABLEOP,
            "tune",
        ),
    ]
    if mode == "record":
        try:
            # torch and TE write there when each process exits, hours later: a directory they cannot
            # write is told now
            probe_writable_dir(d)
        except OSError as e:
            raise BadInput(
                f"--tune record {directory}: cannot write in the directory ({e.strerror}); name a writable one"
            ) from None
        rows = common + [
            Setting(
                "PYTORCH_TUNABLEOP_TUNING",
                "1",
                "benchmark each GEMM shape the first time it runs and keep the fastest",
                TORCH_TUNABLEOP,
                "tune",
            ),
            Setting(
                "TE_HIPBLASLT_TUNING_RUN_COUNT",
                TE_RUN_COUNT,
                "ROCm TE times each candidate hipBLASLt algorithm this many times",
                f"{ROCM_TE_README} (hipBLASLt algorithm selection); the count from ROCm/Megatron-LM's GEMM_TUNING=1",
                "tune",
            ),
            Setting(
                "TE_HIPBLASLT_TUNING_ALGO_COUNT",
                TE_ALGO_COUNT,
                "... among at most this many candidates per GEMM shape",
                f"{ROCM_TE_README}; the count from ROCm/Megatron-LM's GEMM_TUNING=1",
                "tune",
            ),
            Setting(
                "TE_HIPBLASLT_ALGO_SAVE",
                str(d / TE_SAVE_FILE),
                f"TE writes its choices to {d}/te_hipblaslt_algos_<pid>.csv (one file per process: %i is the process id)",
                ROCM_TE_README,
                "tune",
            ),
        ]
        notes.append(
            f"tune: record into {d}: torch writes tunableop_results<device>.csv when each process exits, "
            "TE te_hipblaslt_algos_<pid>.csv; a short run with the real shapes (same parallelism, batch and "
            "sequence length) is enough; then launch with --tune replay " + str(d)
        )
        return rows, notes
    if not d.is_dir():
        raise BadInput(
            f"--tune replay {directory}: no such directory; record first: rocmport env --tune record {directory}"
        )
    found = tune_files(d)
    if not found["torch"] and not found["te"] and not (d / TE_LOAD_FILE).is_file():
        raise BadInput(
            f"--tune replay {directory}: nothing recorded there (no tunableop_results*.csv, no te_hipblaslt_algos_*.csv); "
            f"record first: rocmport env --tune record {directory}"
        )
    rows = common + [
        Setting(
            "PYTORCH_TUNABLEOP_TUNING", "0", "use the recorded results and tune no new shape", TORCH_TUNABLEOP, "tune"
        )
    ]
    if found["te"]:
        lines = merge_te_algos(found["te"], d / TE_LOAD_FILE)
        notes.append(f"tune: merged {len(found['te'])} TE algorithm file(s) into {d / TE_LOAD_FILE} ({lines} lines)")
    if (d / TE_LOAD_FILE).is_file():
        rows.append(
            Setting(
                "TE_HIPBLASLT_ALGO_LOAD",
                str(d / TE_LOAD_FILE),
                "ROCm TE reads its recorded hipBLASLt choices from here",
                ROCM_TE_README,
                "tune",
            )
        )
    else:
        notes.append(
            f"tune: no TE algorithms in {d} (the recording ran no Transformer Engine GEMM): only torch's results are replayed"
        )
    if not found["torch"]:
        notes.append(f"tune: no tunableop_results*.csv in {d}: torch's GEMMs run untuned")
    return rows, notes
