"""verify's report: a stable JSON schema, JUnit XML, and a human summary with a text loss plot."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from rocmport.fsutil import atomic_write_text

SCHEMA = """\
{mode: "gpu" | "cpu-proxy", backend, world_size, tp, pp, dp, tree,
 env: {python, torch, hip, cuda, device_count, devices, launcher_env, firewall_profile},
 launcher: {kind, nnodes, node_rank, rdzv_endpoint},
 stages: [{name, status: pass|fail|skipped|unsupported-in-proxy, reason, seconds, ...}],
 training: {losses, reference_losses, max_abs_diff, tied_embeddings_equal, redirects}}"""


def write_json(report: dict, path) -> None:
    atomic_write_text(path, json.dumps(report, indent=2, sort_keys=True) + "\n")


def junit_xml(report: dict) -> str:
    suite = ET.Element("testsuite", name="rocmport.verify", tests=str(len(report["stages"])),
                       failures=str(sum(s["status"] == "fail" for s in report["stages"])),
                       skipped=str(sum(s["status"] in ("skipped", "unsupported-in-proxy") for s in report["stages"])))
    for s in report["stages"]:
        case = ET.SubElement(suite, "testcase", classname=f"rocmport.verify.{report['mode']}", name=s["name"], time=str(s["seconds"]))
        if s["status"] == "fail":
            ET.SubElement(case, "failure", message=s["reason"][:500]).text = s["reason"]
        elif s["status"] != "pass":
            ET.SubElement(case, "skipped", message=f"{s['status']}: {s['reason']}"[:500])
    return ET.tostring(suite, encoding="unicode")


def loss_plot(losses: list[float], width: int = 40, height: int = 6) -> str:
    """A small text plot of the loss curve (one column per iteration, resampled to ``width``)."""
    if not losses:
        return ""
    pts = [losses[int(i * len(losses) / min(width, len(losses)))] for i in range(min(width, len(losses)))]
    lo, hi = min(pts), max(pts)
    span = (hi - lo) or 1.0
    rows = []
    for r in range(height, -1, -1):
        level = lo + span * r / height
        rows.append(f"{level:8.3f} |" + "".join("*" if round((p - lo) / span * height) == r else " " for p in pts))
    rows.append(" " * 9 + "+" + "-" * len(pts) + f"  ({len(losses)} iterations)")
    return "\n".join(rows)
