"""The HTML page of a verify report (#42), from real reports (tests/data/reports/, each made by a real
run: see its README) and from real runs here; its content checked by parsing the page (rows, the
verdict element, SVG plots, highlighted source lines), never by searching its text for a word."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rocmport.cli import main
from rocmport.report import reader
from rocmport.report.render import render, render_comparison
from rocmport.report.compare import compare
from tests.helpers.html_dom import Element, parse

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "reports"
PASS, FAIL, CUT, OLD = (DATA / n for n in ("v0.16-pass.json", "v0.16-fail.json", "v0.16-cut.json", "old-a0fa024.json"))


def away(path: Path, tmp_path: Path) -> Path:
    """The report with its tree somewhere that does not exist: the page as seen on another machine
    (a CI artifact), whatever this machine still has."""
    data = json.loads(path.read_text())
    data["tree"] = str(tmp_path / "not-here" / "megatron-lm")
    out = tmp_path / path.name
    out.write_text(json.dumps(data))
    return out


def page_of(path: Path) -> Element:
    return parse(render(reader.load(path)))


def stage_rows(doc: Element) -> list[Element]:
    return doc.find(id="stage-table").find_all("tr", cls="stage")


def test_a_passing_v016_run_renders_verdict_stages_curves_coverage_and_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the committed golden the report names is found under patchsets/ here
    data = json.loads(PASS.read_text())
    doc = page_of(away(PASS, tmp_path))
    verdict = doc.find(id="verdict")
    assert verdict.text() == data["verdict"] and "pass" in verdict.classes
    rows = stage_rows(doc)
    assert [r.attrs["data-stage"] for r in rows] == [s["name"] for s in data["stages"]]
    for row, stage in zip(rows, data["stages"]):
        status, reason = row.find("td", cls="status"), row.find("td", cls="reason")
        assert (status.text(), reason.text()) == (stage["status"], stage["reason"])  # each reason in full
    # a plot per training run: stage 2 (port and tp1/pp1) and stage 4 (port, resume, committed golden)
    runs = {a.attrs["data-run"]: a for a in doc.find(id="losses").find_all("article", cls="training-run")}
    assert set(runs) == {"training", "functional"}
    for run in runs.values():
        assert len(run.find_all("svg")) == 1
    legend = {t.text().strip() for t in runs["functional"].find("svg").find_all("text")}
    assert {"port tp2×pp2", "resumed from iteration 5", "committed golden"} <= legend
    curves = {r.find_all("td")[0].text(): r.find_all("td")[2].text() for r in runs["functional"].find_all("tr")[1:]}
    assert curves["port tp2×pp2"].split(", ")[0] == str(round(data["functional"]["losses"][0], 4))
    # coverage: a row per codemod with the report's figures; every unreached site listed, not run
    cov = doc.find("table", cls="coverage-summary", data_group="port_sites")
    rows = cov.find_all("tr", cls="codemod")
    assert [(r.attrs["data-codemod"], int(r.attrs["data-exercised"]), int(r.attrs["data-total"])) for r in rows] == [
        (name, c["exercised"], c["total"]) for name, c in data["port_sites"].items()
    ]
    unreached = sum(len(c["unreached"]) for c in data["port_sites"].values())
    section = doc.find(id="coverage")
    assert len(section.find_all("li", cls="site-not-ran")) == unreached and not section.find_all(cls="site-ran")
    # the tree is not here: said, with how many ran
    notes = [n.text() for n in section.find_all("p", cls="coverage-note")]
    assert any(
        "cannot be shown" in n and n.startswith(f"{sum(c['exercised'] for c in data['port_sites'].values())} ")
        for n in notes
    )
    env = dict(
        zip(
            (d.text() for d in doc.find(id="env").find_all("dt")), (d.text() for d in doc.find(id="env").find_all("dd"))
        )
    )
    assert env["torch"] == data["env"]["torch"] and env["HIP"].startswith("simulated: ROCm 7.1")
    assert env["GPU architecture"] == data["hip_sim"]["arch"]
    assert env["Transformer Engine"] == "not used: Megatron's local layer spec"
    assert env["port inputs hash"].startswith("not known: the report does not carry it")
    assert doc.find_all(id="missing") == []  # a current report lacks nothing


def test_a_failing_run_shows_its_failed_stages_and_the_port_regression_beside_the_unported_tree(tmp_path):
    data = json.loads(FAIL.read_text())
    doc = page_of(away(FAIL, tmp_path))
    assert "fail" in doc.find(id="verdict").classes
    status = {r.attrs["data-stage"]: r.attrs["data-status"] for r in stage_rows(doc)}
    assert status["gpt-training"] == "fail" and status["unit-tests"] == "fail"
    stage3 = next(s for s in data["stages"] if s["name"] == "unit-tests")
    groups = {g.attrs["data-label"]: g for g in doc.find(id="unit-tests").find_all("details", cls="label-group")}
    regressions = sorted(k for k, v in stage3["labels"].items() if v == "port-regression")
    assert regressions and "open" in groups["port-regression"].attrs  # blocking: shown open
    rows = groups["port-regression"].find_all("tr", cls="unit-test")
    assert sorted(r.attrs["data-nodeid"] for r in rows) == regressions
    for row in rows:
        nodeid = row.attrs["data-nodeid"]
        port, base = row.find("td", cls="port").text(), row.find("td", cls="baseline").text()
        assert port == stage3["failures"][nodeid] and base == stage3["on_baseline"][nodeid]  # side by side
    # stage 2's curves diverge from the reference: both drawn
    svg = doc.find("article", data_run="training").find("svg")
    assert {"tp1/pp1 reference", "port tp2×pp2"} <= {t.text().strip() for t in svg.find_all("text")}


def test_a_cut_run_renders_what_it_has_and_says_what_is_missing(tmp_path):
    data = json.loads(CUT.read_text())
    doc = page_of(away(CUT, tmp_path))
    assert [r.attrs["data-stage"] for r in stage_rows(doc)] == [s["name"] for s in data["stages"]]
    missing = [li.text() for li in doc.find(id="missing").find_all("li")]
    assert any(m.startswith("stage 2's loss curves: the report has no losses although the stage ran") for m in missing)
    assert doc.find(id="losses").find_all("svg") == []


def test_a_report_from_an_older_rocmport_renders_with_a_derived_verdict_and_names_what_it_lacks(tmp_path):
    data = json.loads(OLD.read_text())
    assert "verdict" not in data and "port_sites" not in data  # a0fa024's report: neither existed yet
    doc = page_of(away(OLD, tmp_path))
    verdict = doc.find(id="verdict")
    passed = sum(s["status"] == "pass" for s in data["stages"])
    assert verdict.text().endswith(f"{passed} of {len(data['stages'])} stages pass")
    missing = " | ".join(li.text() for li in doc.find(id="missing").find_all("li"))
    for lacking in ("the verdict line", "port-site coverage", "when it ran", "the tree's commit", "Transformer Engine"):
        assert lacking in missing
    assert len(doc.find(id="losses").find_all("svg")) == 1  # its stage 2 curves are there all the same


def test_two_runs_compared_show_the_stages_labels_sites_and_losses_that_moved(tmp_path):
    a, b = reader.load(away(PASS, tmp_path)), reader.load(away(FAIL, tmp_path))
    doc = parse(render_comparison(compare(a, b)))
    changed = {r.attrs["data-stage"] for r in doc.find(id="stage-changes").find_all("tr", data_changed="yes")}
    assert changed == {s.name for s in b.stages if a.stage(s.name) is None or a.stage(s.name).status != s.status}
    assert "gpt-training" in changed
    moves = {
        r.attrs["data-nodeid"]: [td.text() for td in r.find_all("td")[1:]]
        for r in doc.find(id="label-moves").find_all("tr", cls="label-move")
    }
    for t in b.unit.tests:
        if t.label == "port-regression":
            assert moves[t.nodeid] == ["passed", "port-regression"]
    delta = doc.find("article", cls="loss-delta", data_run="training")
    assert len(delta.find_all("svg")) == 1
    before_last, after_last = a.training[0].curves[0].losses[-1], b.training[0].curves[0].losses[-1]
    assert f"{after_last - before_last:.4g}" in delta.find("p").text()


def test_untrusted_text_stays_text(tmp_path):
    """A test id or a reason holding markup renders as text: autoescaping is on."""
    data = json.loads(FAIL.read_text())
    stage3 = next(s for s in data["stages"] if s["name"] == "unit-tests")
    evil = "tests/unit_tests/test_x.py::test_<script>alert(1)</script>"
    stage3["labels"][evil] = "port-regression"
    stage3["failures"][evil] = "<img src=x onerror=alert(2)>"
    data["stages"][0]["reason"] = "<b>bold</b>"
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(data))
    doc = page_of(path)
    assert doc.find_all("script") == [] and doc.find_all("img") == [] and doc.find_all("b") == []
    row = doc.find("tr", cls="unit-test", data_nodeid=evil)
    assert row.find("td", cls="port").text() == "<img src=x onerror=alert(2)>"


def test_report_command_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["-C", str(tmp_path), "report"]) == 2  # no build/verify/last.json yet
    assert "no such report" in capsys.readouterr().err
    cut = tmp_path / "cut.json"
    cut.write_text(PASS.read_text()[:5000])  # a report cut while it was copied
    assert main(["report", str(cut), "--html", str(tmp_path / "p.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not JSON" in err and not (tmp_path / "p.html").exists()
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)  # a RecursionError in the parser: was exit 70
    assert main(["report", str(deep), "--html", str(tmp_path / "d.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a verify report" in err and not (tmp_path / "d.html").exists()
    assert main(["report", str(PASS), str(PASS), str(PASS)]) == 2
    assert main(["report", str(tmp_path / "x.json")]) == 2


def test_report_command_writes_the_page_and_the_comparison(tmp_path, capsys):
    out = tmp_path / "out" / "page.html"
    assert main(["report", str(PASS), "--html", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out.resolve())
    assert parse(out.read_text()).find(id="verdict").text() == json.loads(PASS.read_text())["verdict"]
    assert main(["report", str(PASS), str(FAIL), "--html", str(tmp_path / "cmp.html")]) == 0
    assert len(parse((tmp_path / "cmp.html").read_text()).find(id="stage-changes").find_all("tr", cls="stage")) == 5


@pytest.mark.torch
def test_verify_writes_the_page_beside_its_report_with_the_ported_source_highlighted(tmp_path, capsys):
    """A real verify (stage 1) of a ported tree: the page lands beside the JSON report, status names it,
    and each rewritten site is marked in the ported source: ran (green) or not, with why."""
    from tests.test_port_sites import ported_tree

    tree, _ = ported_tree(tmp_path / "t")
    report = tmp_path / "r" / "v.json"
    assert main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "1", "--report", str(report)]) == 0
    page = report.with_suffix(".html")
    assert page.is_file()
    capsys.readouterr()
    assert main(["-C", str(tmp_path), "status"]) == 0
    assert f"page: {page}" in capsys.readouterr().err
    doc = parse(page.read_text())
    a = doc.find("article", cls="source-file", data_path="megatron/core/a.py")
    ran = {int(tr.attrs["data-line"]) for tr in a.find_all("tr", cls="site-ran")}
    not_ran = {int(tr.attrs["data-line"]) for tr in a.find_all("tr", cls="site-not-ran")}
    data = json.loads(report.read_text())
    unreached = {
        int(k.split(":")[1].split()[0])
        for k in data["port_sites"]["capability-gates"]["unreached"]
        if k.startswith("megatron/core/a.py:")
    }
    assert not_ran == unreached and len(ran) == data["port_sites"]["device-probes"]["exercised"] == 1
    (line,) = ran
    assert "_rocmport_is_hip()" in a.find("tr", cls="site-ran", data_line=str(line)).find_all("td")[1].text()
    assert a.find("tr", cls="site-ran", data_line=str(line)).attrs["data-stages"] == "imports"
    annots = [tr.text() for tr in a.find_all("tr", cls="annot")]
    assert any(t.endswith("is_hip() — ran in imports") for t in annots)
    env = doc.find(id="env").find_all("dd")
    assert any(re.fullmatch(r"[0-9a-f]{64}", d.text()) for d in env)  # the report's own hash
    # --no-html writes none, and --html with --no-html is a usage error
    assert (
        main(
            [
                "-C",
                str(tmp_path),
                "verify",
                "--tree",
                str(tree),
                "--stages",
                "1",
                "--report",
                str(tmp_path / "n.json"),
                "--no-html",
            ]
        )
        == 0
    )
    assert not (tmp_path / "n.html").exists()
    assert main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--html", "x.html", "--no-html"]) == 2


@pytest.mark.torch
def test_each_site_that_ran_is_shown_with_the_stages_that_ran_it_even_without_the_tree(tmp_path):
    """A real verify of a ported tree (stages 1 and 2's imports: stage 1 only here) records who ran each
    site: the page lists them from the report alone when the tree is gone, and a report from before
    the 'ran' key still says it does not record who ran them."""
    from tests.test_port_sites import ported_tree

    tree, _ = ported_tree(tmp_path / "t")
    report = tmp_path / "v.json"
    assert main(["-C", str(tmp_path), "verify", "--tree", str(tree), "--stages", "1", "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    ran = {k: v for c in data["port_sites"].values() for k, v in c["ran"].items()}
    assert ran == {"megatron/core/a.py:16 is_hip": ["imports"]}
    # the tree gone (a CI artifact): the site that ran is listed, with its stage, by the report alone
    doc = page_of(away(report, tmp_path))
    section = doc.find(id="coverage")
    items = section.find("article", cls="source-file", data_path="megatron/core/a.py").find_all("li", cls="site-ran")
    assert [(li.attrs["data-line"], li.attrs["data-stages"]) for li in items] == [("16", "imports")]
    assert items[0].text().endswith("is_hip() — ran in imports")
    assert not any("cannot be shown" in n.text() for n in section.find_all("p", cls="coverage-note"))
    # the same report as an older rocmport wrote it (no 'ran'): the tree finds the site, no stage named
    for c in data["port_sites"].values():
        del c["ran"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    a = page_of(old).find("article", cls="source-file", data_path="megatron/core/a.py")
    row = a.find("tr", cls="site-ran", data_line="16")
    assert "data-stages" not in row.attrs
    annots = [tr.text() for tr in a.find_all("tr", cls="annot")]
    assert any(
        "ran during this run's stages (imports); the report does not record which of them ran it" in t for t in annots
    )


def test_the_pr_body_links_the_verify_page(tmp_path):
    from rocmport.refresh.report import page_link

    page = tmp_path / "build" / "verify" / "refresh-core_v0.17.0.html"
    env = {
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "o/r",
        "GITHUB_RUN_ID": "42",
        "ROCMPORT_REPORT_ARTIFACT": "pages-release",
    }
    link = page_link(page, env)
    m = re.match(
        r"\[the verify report page\]\((?P<url>[^)]+)\) \(artifact `(?P<art>[^`]+)`, file `(?P<file>[^`]+)`\)$", link
    )
    assert m and (m["url"], m["art"], m["file"]) == (
        "https://github.com/o/r/actions/runs/42",
        "pages-release",
        page.name,
    )
    assert page_link(page, {}).startswith(f"`{page}`")


CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (Debian: apt-get install chromium; .ci/run installs it)")
def test_the_page_opens_in_a_real_headless_browser_without_console_errors(tmp_path):
    """Chromium opens the page from a file:// URL with the network off: no console message at error
    level, the plots are SVG elements in the DOM it built, its text has the verdict; a screenshot."""
    page = tmp_path / "page.html"
    page.write_text(render(reader.load(away(FAIL, tmp_path))))
    flags = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--proxy-server=127.0.0.1:9",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    env = {**os.environ, "HOME": str(tmp_path)}
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, env=env)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console
    built = parse(dom.stdout)  # the DOM as the browser built it
    assert built.find(id="verdict").text() == json.loads(FAIL.read_text())["verdict"]
    assert len(built.find(id="losses").find_all("svg")) == 1
    shot = subprocess.run(
        [*flags, f"--screenshot={tmp_path / 'page.png'}", "--window-size=1280,2000", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert shot.returncode == 0 and (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [line for line in shot.stderr.splitlines() if "CONSOLE" in line]


@pytest.mark.torch
def test_a_refresh_writes_its_verify_page_and_its_pr_body_links_it(tmp_path, monkeypatch):
    """A real refresh whose verify fails (the new release imports a package that does not exist): the
    new port's report and its page land in build/verify/refresh-<to>.*, and summary.md (the PR body)
    names the page; in a GitHub Actions run it links the run that holds it as an artifact."""
    from tests.helpers.refresh import Ported

    port = Ported(tmp_path, monkeypatch)
    port.tag({"megatron/core/__init__.py": "import rocmport_test_no_such_package  # noqa\n"}, "core_v0.17.0", "0.17.0")
    for key, value in {
        "GITHUB_SERVER_URL": "https://github.com",
        "GITHUB_REPOSITORY": "o/r",
        "GITHUB_RUN_ID": "7",
    }.items():
        monkeypatch.setenv(key, value)
    port.run("refresh", "--to", "v0.17", "--tp", "1", "--pp", "1")
    page = port.root / "build" / "verify" / "refresh-v0.17.html"
    doc = parse(page.read_text())
    stages = {r.attrs["data-stage"]: r.attrs["data-status"] for r in stage_rows(doc)}
    assert stages["imports"] == "fail" and "fail" in doc.find(id="verdict").classes
    assert json.loads(page.with_suffix(".json").read_text())["stages"][0]["status"] == "fail"
    body = (port.root / "build" / "refresh" / "summary.md").read_text()
    (line,) = [ln for ln in body.splitlines() if "the verify report page" in ln]
    assert "(https://github.com/o/r/actions/runs/7)" in line and f"file `{page.name}`" in line


def test_a_site_that_ran_before_and_not_after_is_shown_with_the_stages_that_ran_it(tmp_path):
    """Two reports with the same counts (one site ran in each) where the site that ran moved, and one
    site that both runs ran lost the functional stage: the comparison names the site that no longer
    runs with the stages that ran it, and the stages a site lost; a report without 'ran' is named as
    not compared."""
    from rocmport.verify.analyses.port_sites import Coverage

    def with_sites(name: str, ran: dict[str, list[str]], unreached: dict[str, str]) -> Path:
        data = json.loads(PASS.read_text())
        data["tree"] = str(tmp_path / "not-here")
        data["port_sites"] = {
            "capability-gates": Coverage(len(ran), len(ran) + len(unreached), None, unreached, "", ran).to_dict()
        }
        out = tmp_path / name
        out.write_text(json.dumps(data))
        return out

    site_a, site_b, site_c = (f"megatron/core/{f}.py:{n} is_hip" for f, n in (("a", 3), ("b", 7), ("c", 9)))
    before = with_sites(
        "before.json",
        {site_a: ["gpt-training", "functional"], site_c: ["imports", "functional"]},
        {site_b: "no case took it"},
    )
    after = with_sites(
        "after.json", {site_b: ["functional"], site_c: ["imports"]}, {site_a: "not taken by verify's cases"}
    )
    doc = parse(render_comparison(compare(reader.load(before), reader.load(after))))
    row = doc.find(id="site-changes").find("tr", cls="codemod-change", data_codemod="capability-gates")
    lost = {li.attrs["data-site"]: li.attrs["data-stages"] for li in row.find_all("li", cls="site-no-longer-ran")}
    assert lost == {site_a: "gpt-training functional"}
    moved = {li.attrs["data-site"]: li.text() for li in row.find_all("li", cls="site-stages-moved")}
    assert list(moved) == [site_c] and moved[site_c].endswith("imports functional → imports")
    # an older report (no 'ran'): not compared, and said so
    old = json.loads(before.read_text())
    del old["port_sites"]["capability-gates"]["ran"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    c = compare(reader.load(tmp_path / "old.json"), reader.load(after))
    assert c.codemods[0].no_longer_ran == {} and any("the first report does not record" in n for n in c.notes)


def test_an_fp8_cases_cuda_path_twin_is_drawn_beside_the_port_with_its_drift(tmp_path, monkeypatch):
    """Stage 4's `cuda_twin` (an FP8 case whose golden could not decide): its curve and its drift on the
    page; a twin that did not train is a note saying why."""
    monkeypatch.chdir(REPO)
    data = json.loads(PASS.read_text())
    losses = data["functional"]["losses"]
    te = "NVIDIA's Python layer with ROCm TE's arithmetic deltas (fp8-fnuz-on-gfx942)"
    data["functional"]["cuda_twin"] = {
        "te": te,
        "reason": "trained",
        "seconds": 15.3,
        "losses": losses,
        "max_rel_drift": 0.0,
        "tolerance": 2e-6,
        "matches": True,
    }
    path = tmp_path / "twin.json"
    path.write_text(json.dumps(data))
    run = next(r for r in reader.load(path).training if r.key == "functional")
    assert [c.losses for c in run.curves if c.label == "CUDA-path twin (reference)"] == [losses]
    assert ("max relative drift vs its CUDA-path twin", f"0 (tolerance 2e-06; {te})") in run.facts
    data["functional"]["cuda_twin"] = {
        "te": te,
        "reason": "functional: unsupported (MXFP8)",
        "seconds": 0.1,
        "losses": [],
    }
    path.write_text(json.dumps(data))
    run = next(r for r in reader.load(path).training if r.key == "functional")
    assert "its CUDA-path twin did not train the case: functional: unsupported (MXFP8)" in run.notes
    assert not [c for c in run.curves if c.label.startswith("CUDA-path twin")]
