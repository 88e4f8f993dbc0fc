"""`rocmport env`'s launch profiles: per-arch values with their sources, the fabric read from a fake
/sys and /proc, the user's values kept, --explain, and GEMM tuning (--tune record|replay DIR)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.errors import BadInput
from rocmport.launch_env import LAUNCH_ENV
from rocmport.machine import launch_profile as lp
from tests.helpers.real import REPO

BASE = [n for n, _, _ in LAUNCH_ENV]
# What each architecture adds to the base, by name and value (and nothing else).
ADDED = {
    "gfx942": {"HSA_KERNARG_POOL_SIZE": "12582912"},
    "gfx950": {"RCCL_WARP_SPEED_AUTO": "0", "NVTE_ROCM_ENABLE_MXFP8": "1"},
    "gfx90a": {},
    "gfx1100": {"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"},
    "gfx1201": {"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"},
    "gfx906": {"HSA_OVERRIDE_GFX_VERSION": "9.0.6"},
}


@pytest.mark.parametrize("arch", lp.ARCH_CHOICES)
def test_each_arch_adds_its_values_with_a_source(arch, tmp_path):
    settings, notes = lp.profile(arch, sys_root=tmp_path, proc_root=tmp_path)
    names = [s.name for s in settings]
    assert names[: len(BASE)] == BASE
    assert {s.name: s.value for s in settings if s.part == arch} == ADDED[arch]
    assert all(s.source and s.reason for s in settings)
    # The notes say what AMD's file for it sets that the profile does not take, and that no fabric was found.
    assert any(n.startswith(f"{arch}: ") for n in notes) and any("no RDMA device" in n for n in notes)


def test_no_arch_is_the_base_and_deterministic_adds_the_launcher_only_values(tmp_path):
    plain, _ = lp.profile(None, sys_root=tmp_path, proc_root=tmp_path)
    assert [s.name for s in plain] == BASE
    det, _ = lp.profile(None, True, sys_root=tmp_path, proc_root=tmp_path)
    assert [s.name for s in det] == BASE + ["NCCL_ALGO", "ROCBLAS_DEFAULT_ATOMICS_MODE", "TORCH_COMPILE_DISABLE"]


def test_auto_is_the_devices_arch():
    assert lp.resolve_arch("auto", device_arch=lambda: "gfx942:sramecc+:xnack-") == "gfx942"
    assert lp.resolve_arch("gfx950:sramecc+") == "gfx950"
    with pytest.raises(BadInput, match=r"--arch auto: no AMD GPU visible here; name it: --arch gfx942\|gfx950"):
        lp.resolve_arch("auto", device_arch=lambda: None)
    with pytest.raises(BadInput, match="this GPU is gfx1030, which has no launch profile"):
        lp.resolve_arch("auto", device_arch=lambda: "gfx1030")


# ---- the fabric, from a fake machine -----------------------------------------------------------------

IPV4_GID = "0000:0000:0000:0000:0000:ffff:0a00:0304"
LINK_LOCAL = "fe80:0000:0000:0000:0000:0000:0000:0001"


def rdma(
    sys_root: Path, dev: str, *, state="4: ACTIVE", layer="Ethernet", gids: dict[int, tuple[str, str]] | None = None
):
    port = sys_root / "class" / "infiniband" / dev / "ports" / "1"
    (port / "gid_attrs" / "types").mkdir(parents=True)
    (port / "gids").mkdir()
    (port / "state").write_text(state + "\n")
    (port / "link_layer").write_text(layer + "\n")
    for idx, (kind, gid) in (gids or {}).items():
        (port / "gid_attrs" / "types" / str(idx)).write_text(kind + "\n")
        (port / "gids" / str(idx)).write_text(gid + "\n")


# Two RoCE NICs with the IPv4 RoCE v2 GID at index 3 (v1 and link-local before it), one at 5, one down.
ROCE_GIDS = {
    0: ("IB/RoCE v1", LINK_LOCAL),
    1: ("RoCE v2", LINK_LOCAL),
    2: ("IB/RoCE v1", IPV4_GID),
    3: ("RoCE v2", IPV4_GID),
}


def test_roce_devices_their_gid_index_and_the_interface_to_the_master(tmp_path):
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    rdma(sys_root, "rdma0", gids=ROCE_GIDS)
    rdma(sys_root, "rdma1", gids=ROCE_GIDS)
    rdma(sys_root, "rdma2", gids={5: ("RoCE v2", IPV4_GID)})
    rdma(sys_root, "rdma3", state="1: DOWN", gids=ROCE_GIDS)
    (proc_root / "net").mkdir(parents=True)
    # A default route via eth0, 10.0.0.0/16 connected on ens51np0 (the kernel's little-endian hex).
    (proc_root / "net" / "route").write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        "ens51np0\t0000000A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
        "down0\t0003000A\t00000000\t0000\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    )
    hosts = {"node0": "10.0.3.4", "far": "8.8.8.8", "localhost": "127.0.0.1"}

    settings, notes = lp.fabric_settings("node0", sys_root, proc_root, resolve=hosts.__getitem__)
    got = {s.name: s for s in settings}
    assert got["NCCL_IB_HCA"].value == "rdma0,rdma1,rdma2"
    assert (
        got["NCCL_IB_GID_INDEX"].value == "3"
        and "2 of the 3 RoCE devices (others: 5 on 1)" in got["NCCL_IB_GID_INDEX"].reason
    )
    assert got["NCCL_SOCKET_IFNAME"].value == got["GLOO_SOCKET_IFNAME"].value == "ens51np0"
    assert got["NCCL_CROSS_NIC"].value == "0" and got["NCCL_PROTO"].value == "Simple"
    assert all(s.part == "fabric" and s.source for s in settings)
    # The default route for an address outside every subnet; none for this host.
    far, _ = lp.fabric_settings("far", sys_root, proc_root, resolve=hosts.__getitem__)
    assert {s.name: s.value for s in far}["NCCL_SOCKET_IFNAME"] == "eth0"
    local, notes = lp.fabric_settings("localhost", sys_root, proc_root, resolve=hosts.__getitem__)
    assert "NCCL_SOCKET_IFNAME" not in {s.name for s in local} and any("loopback" in n for n in notes)


def test_infiniband_keeps_the_default_gid_and_no_devices_set_nothing(tmp_path):
    rdma(tmp_path, "mlx5_0", layer="InfiniBand", gids={0: ("IB/RoCE v1", LINK_LOCAL)})
    settings, notes = lp.fabric_settings(None, tmp_path, tmp_path)
    assert {s.name for s in settings} == {"NCCL_IB_HCA", "NCCL_CROSS_NIC", "NCCL_PROTO"}
    assert any("InfiniBand link layer" in n for n in notes) and any("no master address" in n for n in notes)
    empty, notes = lp.fabric_settings(None, tmp_path / "none", tmp_path)
    assert empty == [] and "no RDMA device with an active port" in notes[0]


# ---- the command -------------------------------------------------------------------------------------


def run_env(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["env", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_users_values_win(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("GPU_MAX_HW_QUEUES", "4")
    monkeypatch.setenv("NVTE_ROCM_ENABLE_MXFP8", "0")
    code, out, _ = run_env(capsys, "--arch", "gfx950", "--sys-root", str(tmp_path))
    assert code == 0
    assert "export GPU_MAX_HW_QUEUES" not in out and "# GPU_MAX_HW_QUEUES=4 is yours and stays (rocmport's: 2," in out
    assert "export NVTE_ROCM_ENABLE_MXFP8" not in out and "export RCCL_WARP_SPEED_AUTO=0" in out
    code, out, _ = run_env(capsys, "--arch", "gfx950", "--json", "--sys-root", str(tmp_path))
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["GPU_MAX_HW_QUEUES"] == {**rows["GPU_MAX_HW_QUEUES"], "value": "4", "yours": True, "ours": "2"}
    assert rows["RCCL_WARP_SPEED_AUTO"]["yours"] is False and rows["RCCL_WARP_SPEED_AUTO"]["part"] == "gfx950"


def test_explain_says_why_and_where_from(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    rdma(tmp_path, "rdma0", gids=ROCE_GIDS)
    code, out, _ = run_env(capsys, "--arch", "gfx942", "--explain", "--sys-root", str(tmp_path))
    assert code == 0
    block = out.split("HSA_KERNARG_POOL_SIZE=12582912  [gfx942]\n")[1].split("\n")
    assert (
        block[0].startswith("    why: a 12 MiB kernel-argument pool")
        and block[1] == "    source: AMD-AGI/Primus runner/helpers/envs/MI300X.sh, MI325X.sh"
    )
    assert "NCCL_IB_GID_INDEX=3  [fabric]" in out and "note: fabric: no master address" in out
    assert out.count("    why: ") == out.count("    source: ") == len(BASE) + 1 + 4


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--arch", "gfx1030"],
            "rocmport: error: --arch 'gfx1030': no launch profile for it; choose one of gfx942, gfx950, gfx90a, gfx1100, gfx1201, gfx906 or auto",
        ),
        (
            ["--tune", "replay", "{tmp}/missing"],
            "rocmport: error: --tune replay {tmp}/missing: no such directory; record first: rocmport env --tune record {tmp}/missing",
        ),
        (
            ["--tune", "replay", "{tmp}"],
            "rocmport: error: --tune replay {tmp}: nothing recorded there (no tunableop_results*.csv, "
            "no te_hipblaslt_algos_*.csv); record first: rocmport env --tune record {tmp}",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, args, message):
    code, out, err = run_env(capsys, *[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and out == "" and err.strip() == message.format(tmp=tmp_path)


# ---- GEMM tuning -------------------------------------------------------------------------------------


def exported(out: str) -> dict[str, str]:
    return dict(line[len("export ") :].split("=", 1) for line in out.splitlines() if line.startswith("export "))


def test_record_then_replay(capsys, tmp_path):
    d = tmp_path / "tuning"
    code, out, _ = run_env(capsys, "--no-fabric", "--tune", "record", str(d))
    env = exported(out)
    assert code == 0 and d.is_dir()
    assert {k: v for k, v in env.items() if k.startswith(("PYTORCH_TUNABLEOP", "TE_HIPBLASLT"))} == {
        "PYTORCH_TUNABLEOP_ENABLED": "1",
        "PYTORCH_TUNABLEOP_TUNING": "1",
        "PYTORCH_TUNABLEOP_RECORD_UNTUNED": "0",
        "PYTORCH_TUNABLEOP_FILENAME": f"{d}/tunableop_results.csv",
        "TE_HIPBLASLT_TUNING_RUN_COUNT": "10",
        "TE_HIPBLASLT_TUNING_ALGO_COUNT": "50",
        "TE_HIPBLASLT_ALGO_SAVE": f"{d}/te_hipblaslt_algos_%i.csv",
    }
    # What a shell gets from it (eval, as the README says), with a value of the user's kept.
    shell = subprocess.run(
        ["bash", "-c", 'eval "$OUT"; echo "$PYTORCH_TUNABLEOP_FILENAME|$TE_HIPBLASLT_ALGO_SAVE|$GPU_MAX_HW_QUEUES"'],
        env={**os.environ, "OUT": out},
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout.strip() == f"{d}/tunableop_results.csv|{d}/te_hipblaslt_algos_%i.csv|2"
    # What a recording run leaves: torch's file per device, TE's per process (a shared header).
    (d / "tunableop_results0.csv").write_text("Validator,PT_VERSION,2.7.1\n")
    (d / "te_hipblaslt_algos_101.csv").write_text("m,n,k,algo\n8,8,8,3\n16,16,16,1\n")
    (d / "te_hipblaslt_algos_102.csv").write_text("m,n,k,algo\n8,8,8,3\n32,32,32,7\n")
    code, out, err = run_env(capsys, "--no-fabric", "--tune", "replay", str(d), "--explain")
    assert code == 0
    assert (
        "PYTORCH_TUNABLEOP_TUNING=0  [tune]" in out
        and f"TE_HIPBLASLT_ALGO_LOAD={d}/te_hipblaslt_algos.csv  [tune]" in out
    )
    assert "TE_HIPBLASLT_TUNING_RUN_COUNT" not in out and "TE_HIPBLASLT_ALGO_SAVE" not in out
    assert (d / "te_hipblaslt_algos.csv").read_text() == "m,n,k,algo\n8,8,8,3\n16,16,16,1\n32,32,32,7\n"
    assert f"note: tune: merged 2 TE algorithm file(s) into {d}/te_hipblaslt_algos.csv (4 lines)" in out


def test_replay_with_torch_results_only(capsys, tmp_path):
    (tmp_path / "tunableop_results0.csv").write_text("Validator,PT_VERSION,2.7.1\n")
    code, out, _ = run_env(capsys, "--no-fabric", "--tune", "replay", str(tmp_path), "--explain")
    assert code == 0 and "TE_HIPBLASLT_ALGO_LOAD" not in out and "only torch's results are replayed" in out


# ---- docs/env.md: every variable env can print, with its source --------------------------------------


def _every_setting(tmp_path: Path) -> tuple[list[tuple[lp.Setting, str]], list[str]]:
    """Each setting `env` can print (the base, --deterministic, every --arch, the fabric of a machine
    with a RoCE device and a route to the master, --tune record and replay), its value and source with
    this run's directories named as docs/env.md names them (/sys, /proc, DIR); and every note."""
    found: list[tuple[lp.Setting, str]] = []
    notes: list[str] = []
    sys_root, proc_root, tune = tmp_path / "sys", tmp_path / "proc", tmp_path / "tune"
    rdma(sys_root, "rdma0", gids=ROCE_GIDS)
    (proc_root / "net").mkdir(parents=True)
    (proc_root / "net" / "route").write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
    )
    runs = [lp.profile(None, True, sys_root=tmp_path / "none", proc_root=tmp_path / "none")]
    runs += [lp.profile(arch, sys_root=tmp_path / "none", proc_root=tmp_path / "none") for arch in lp.ARCH_CHOICES]
    runs.append(lp.fabric_settings("node0", sys_root, proc_root, resolve=lambda host: "10.0.3.4"))
    runs.append(lp.tune_settings("record", tune))
    (tune / "tunableop_results0.csv").write_text("Validator,PT_VERSION,2.7.1\n")
    (tune / "te_hipblaslt_algos_101.csv").write_text("m,n,k,algo\n8,8,8,3\n")
    runs.append(lp.tune_settings("replay", tune))
    for settings, said in runs:
        notes += said
        for s in settings:
            named = [(str(sys_root), "/sys"), (str(proc_root), "/proc"), (str(tune), "DIR")]
            source, value = s.source, s.value
            for path, name in named:
                source, value = source.replace(path, name), value.replace(path, name)
            found.append((replace(s, source=source), value))
    return found, notes


def _doc_rows() -> dict[str, tuple[str, str]]:
    """docs/env.md's table: variable -> (its Value cell, its Source cell)."""
    rows = {}
    for line in (REPO / "docs" / "env.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[0] != "`Variable`":
            rows[cells[0].strip("`")] = (cells[1], cells[4])
    return rows


def test_docs_env_lists_every_variable_env_can_print_with_its_source(tmp_path):
    found, notes = _every_setting(tmp_path)
    doc = _doc_rows()
    assert sorted(doc) == sorted({s.name for s, _ in found})  # none missing, none the code cannot print
    for s, value in found:
        doc_value, doc_source = doc[s.name]
        assert doc_source == s.source, s.name
        if s.part != "fabric":  # the fabric's values are this machine's: the doc says what they are
            assert f"`{value}`" in doc_value, (s.name, value, doc_value)
    # No label a user cannot look up (a planning document's "coverage item E1") in anything env prints.
    for text in [s.reason for s, _ in found] + [s.source for s, _ in found] + notes + list(lp.ARCH_NOTES.values()):
        assert not re.search(r"coverage item|\bitem [A-Z][0-9]+\b", text), text
