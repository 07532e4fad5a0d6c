"""The README's and the docs' figures against the code and the tracked results that produce them,
and their links against the files they point to (each test able to fail when either moves)."""
import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_reference import PAGE as CLI_PAGE
from cli_reference import generated_block, reference
from readme_tables import (
    context_parallel_table,
    cp_comm_table,
    eager_kernels_table,
    fp8_casts_table,
    framework_effects_table,
    placement_table,
)

from phaze.area import loo_markdown

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "phaze" / "data" / "reference" / "README.md"]


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


README = _read(ROOT / "README.md")


def _page(name: str) -> str:
    return _read(DOCS / name)


# --- tables generated from the code ----------------------------------------------------------------
def test_framework_context_parallel_and_fp8_tables_are_the_code():
    assert framework_effects_table() in _page("frameworks.md")
    assert eager_kernels_table() in _page("frameworks.md")
    assert context_parallel_table() in _page("validation.md")
    assert cp_comm_table() in _page("frameworks.md")
    assert fp8_casts_table() in _page("validation.md")


def test_placement_table_is_what_phaze_place_prints():
    table = placement_table()
    assert table in README
    assert table in _page("cli.md")


def test_area_power_table_is_the_fit():
    assert loo_markdown() in _page("area-power-cost.md")


def test_cli_flag_reference_is_generated_from_the_parser():
    # `python tests/cli_reference.py` rewrites the block; a flag added, renamed or re-described in
    # phaze.cli without it fails here, so --help and docs/cli.md never disagree
    assert generated_block(_read(CLI_PAGE)) == reference()


def test_every_flag_in_help_is_documented():
    page = _read(CLI_PAGE)
    for command in ("evaluate", "validate", "place", "calibrate", "schedule", "search", "sweep", "report", "area"):
        out = subprocess.run([sys.executable, "-m", "phaze.cli", command, "--help"], capture_output=True,
                             text=True, cwd=ROOT, check=True).stdout
        section = page[page.index(f"### `phaze {command}`"):]
        section = section[:section.find("\n### ", 1) if "\n### " in section[1:] else len(section)]
        options = re.findall(r"^ {2}(-.*?)(?: {2,}|$)", out, flags=re.M)     # "  --tp TP", "  --sp, --no-sp"
        flags = {w.split()[0] for o in options for w in o.split(", ")} - {"-h", "--help"}
        assert flags, command
        for flag in sorted(flags):
            assert f"`{flag}`" in section, (command, flag)
    for flag in ("--allow-oom", "--params", "--time-limit", "--runs", "--unseen", "--ep"):
        assert f"`{flag}`" in page


# --- figures quoted from tracked results ----------------------------------------------------------
def _summary_row(label: str) -> list[str]:
    """The leave-one-source-out row of results/validation/summary.txt that starts with ``label``."""
    text = _read(ROOT / "results" / "validation" / "summary.txt")
    loso = text[text.index("leave-one-source-out"):text.index("in-sample")]
    line = next(x for x in loso.splitlines() if x.strip().startswith(label))
    return line.strip()[len(label):].split()


def test_validation_headline_is_the_tracked_summary():
    rows, mape, bias, _median, _max, within = _summary_row("all expressed runs")
    _, per_source_mape, _ = _summary_row("per-source mean (8 sources)")
    assert f"On {rows} published training runs" in README
    assert f"**{mape[:-1]} % mean absolute error** of the step time, bias {bias[:-1]} %, {within[:-1]} % of runs" \
        in " ".join(README.split())
    assert f"**{per_source_mape[:-1]} %** with each of the 8 sources" in " ".join(README.split())
    # the validation page's headline table row is the same summary
    page = _page("validation.md")
    assert (f"| **all expressed runs** | {rows} | **{mape[:-1]} %** | {bias[:-1]} % | {_median[:-1]} % "
            f"| {_max[:-1]} % | {within[:-1]} % |") in page


def test_held_out_offload_rows_figure_is_their_tracked_scoring():
    """S25's 6 offload rows, scored once after activation offload was modelled: the README's figure
    and the validation page's row are the tracked file's, and the file scores exactly those rows."""
    text = (ROOT / "results" / "validation" / "held_out_s25_offload.txt").read_text()
    assert "HELD OUT: S25_maxtext_tpuv5" in text and "(6 of 6 rows expressed)" in text
    n, mape, bias, median, top, within = re.search(
        r"^  all expressed runs +(\d+) +([\d.]+)% +([+-][\d.]+)% +([\d.]+)% +([\d.]+)% +(\d+)%", text,
        flags=re.M).groups()
    flat = " ".join(README.split())
    assert f"scored once: **{mape} %**, bias {bias} % (`results/validation/held_out_s25_offload.txt`)" in flat
    page = _page("validation.md").replace("−", "-")
    assert (f"| 128B on 1 to 32 v5e-256 slices | {n} | **{mape} %** | {bias} % | {median} % | {top} % "
            f"| {within} % |") in page
    rows = list(csv.DictReader(open(ROOT / "results" / "validation" / "held_out_s25_offload.csv")))
    assert sorted(r["run_id"] for r in rows) == [f"R{1088 + i}" for i in range(6)]
    assert all("offload=qkv_proj" in r["plan"] and r["status"] == "ok" for r in rows)


def test_held_out_tpu_figure_is_the_tracked_scoring():
    text = (ROOT / "results" / "validation" / "held_out_s25.txt").read_text()
    assert "HELD OUT: S25_maxtext_tpuv5" in text     # scored with parameters fitted without it
    expressed, total = re.search(r"\((\d+) of (\d+) rows expressed\)", text).groups()
    stats = {name: re.search(rf"^  {name} +\d+ +([\d.]+)% +([+-][\d.]+)%", text, flags=re.M).groups()
             for name in ("all expressed runs", "tpuv5e", "tpuv5p")}
    flat = " ".join(README.split())
    assert f"({expressed} of {total} expressed;" in flat
    mape, bias = stats["all expressed runs"]
    assert f"**{mape} %**, bias {bias} % (v5e {stats['tpuv5e'][0]} % / {stats['tpuv5e'][1]} %, " \
           f"v5p {stats['tpuv5p'][0]} % / {stats['tpuv5p'][1]} %;" in flat
    # the validation page's table of it is the same scoring
    page = _page("validation.md")
    for name, label in (("all expressed runs", "all expressed runs"), ("tpuv5e", "TPU v5e"), ("tpuv5p", "TPU v5p")):
        rows, *cells = re.search(rf"^  {name} +(\d+) +([\d.]+)% +([+-][\d.]+)% +([\d.]+)% +([\d.]+)% +(\d+)%",
                                 text, flags=re.M).groups()
        m, b, med, mx, within = cells
        m = f"**{m} %**" if name == "all expressed runs" else f"{m} %"
        assert re.search(rf"^\| {re.escape(label)}[^|]* \| {rows} \| {re.escape(m)} \| {re.escape(b)} % \| "
                         rf"{med} % \| {mx} % \| {within} % \|$", page, flags=re.M), name


def test_place_against_the_runs_plans_is_the_tracked_comparison():
    """bench_place_vs_runs.py's per-run rows give its summary, the README quotes the summary, and no
    run's own plan beats place's best (a slower one is a hole in the search)."""
    rows = list(csv.DictReader(open(ROOT / "results" / "placement" / "place_vs_runs.csv")))
    text = (ROOT / "results" / "placement" / "place_vs_runs.txt").read_text()
    scored = [r for r in rows if r["status"] != "run plan does not fit"]
    count = {k: sum(r["status"] == k for r in scored) for k in ("faster", "same", "slower")}
    assert count["slower"] == 0 and len(set(r["run_id"] for r in rows)) == len(rows)
    for r in scored:
        ratio = float(r["run_step_s"]) / float(r["place_step_s"])
        assert (ratio > 1) if r["status"] == "faster" else (abs(ratio - 1) < 1e-5), r["run_id"]
    gains = sorted(float(r["throughput_gain_pct"]) for r in scored)
    median = gains[len(gains) // 2]
    assert (f"place's best against the run's own plan, {len(scored)} runs: faster {count['faster']}, "
            f"the same {count['same']}, slower 0") in text
    assert f"median {median:+.1f} %" in text
    flat = " ".join(README.split())
    assert f"Given each of the {len(scored)} published runs whose own plan fits phaze's memory model" in flat
    assert (f"no slower in all {len(scored)}: faster in {count['faster']}, the same in {count['same']}, "
            f"**{median:+.1f} %** throughput at the median") in flat


def test_readme_fuzz_count_is_the_benchmarks_page():
    bench, flat = " ".join(_page("benchmarks.md").split()), " ".join(README.split())
    cases, bad = re.search(r"\*\*([\d,]+) cases, (\d+) bad endings\*\*", bench).groups()
    assert f"throws {cases} cases at phaze" in flat and f"**{bad} bad endings**" in flat


def test_readme_speed_and_unseen_gpu_figures_are_the_docs_measurements():
    # measured figures (not reproducible in a test) are quoted from the page that records their
    # measurement: a remeasured benchmark that leaves the README behind fails here
    bench, flat = " ".join(_page("benchmarks.md").split()), " ".join(README.split())
    whole = re.search(r"whole process, best and worst of 3 \| ([\d.]+)–([\d.]+) s", bench)
    assert f"in {whole.group(2)} s as a whole process" in flat
    plans = re.search(r"distinct plans evaluated, empty caches, in-process \| ~([\d,]+) per minute", bench)
    assert f"about {plans.group(1)} distinct plans per minute" in flat
    a100 = re.search(r"\| A100-80GB \| (\d+) \(\d+ known to fit\) \| ([\d.]+) s \|", bench)
    assert f"over {a100.group(1)} layouts of GPT-3 175B in {a100.group(2)} s cold" in flat
    cand = re.search(r"five-workload candidate mean ([\d.]+) s / worst [\d.]+ s \(([\d.]+) trials per minute\)",
                     bench)
    assert f"scored in {cand.group(1)} s on average ({cand.group(2)} trials per minute" in flat
    unseen = re.search(r"\| set 1 H100 rows, cost model as at commit \w+ .*? \| (\d+) \| \*\*([\d.]+) %\*\*",
                       _page("validation.md"))
    assert f"predicting H100 runs from the chip file: {unseen.group(2)} %" in flat
    # the latest alternated pair: the README's rounding of the last such paragraph of benchmarks.md
    said = re.search(r"the latest, after .*?, ([\d.]+) and ([\d.]+) s a candidate and ([\d,]+) and ([\d,]+) plans per "
                     r"minute against ([\d.]+) and ([\d.]+) s and ([\d,]+) and ([\d,]+) for its first code \((\w+)\)",
                     flat).groups()
    last = bench[bench.rindex("After the session"):]
    measured = re.search(r"first code \((\w+)\).*?: ([\d.]+) and ([\d.]+) s a five-workload candidate and "
                         r"([\d,]+) and ([\d,]+) distinct plans per minute against ([\d.]+) and ([\d.]+) s and "
                         r"([\d,]+) and ([\d,]+)", last).groups()

    def hundreds(x: str) -> str:
        return f"{round(int(x.replace(',', '')) / 100) * 100:,}"
    assert said[8] == measured[0] and said[:2] == measured[1:3] and said[4:6] == measured[5:7]
    assert [said[k] for k in (2, 3, 6, 7)] == [hundreds(measured[k]) for k in (3, 4, 7, 8)]


def _certificate_lines(text: str) -> list[str]:
    start = text.index("- designs in the space:")
    lines = []
    for line in text[start:].splitlines():
        if not line.startswith("- "):
            break
        lines.append(line)
    return lines


def test_paper_certificate_is_the_tracked_study():
    report = _read(ROOT / "results" / "phaze-paper-exact" / "report.md")
    cert = _certificate_lines(report)
    assert "\n".join(cert) in _page("search.md")
    evaluated = cert[-2].split(": ")[1]
    space = cert[0].split(": ")[1]
    best = re.search(r"\*\*Best design: trial \d+\*\* \([^)]*\): ([\d,]+) tokens/s .*?: ([+-][\d.]+ %) over TPUv4",
                     report)
    flat = " ".join(README.split())
    assert f"**proven optimal having evaluated {evaluated} of the {space} designs**" in flat
    assert f"**{best.group(1)} tokens/s**" in flat
    assert f"**{best.group(2)} over TPUv4**" in flat


def test_paper_front_counts_are_the_tracked_study():
    # the proven front's paragraph in docs/search.md: its evaluations, the band they are a share of,
    # each pruning level's count and the designs GPT-3 175B runs with block recompute on, all read
    # from the tracked front study (a rerun that moves them makes the page stale)
    report = _read(ROOT / "results" / "phaze-paper-exact-front" / "report.md")
    count = {k: int(re.search(rf"- {re.escape(k)}: ([\d,]+)", report).group(1).replace(",", ""))
             for k in ("pruned by the closed-form bound (level 0)", "pruned by an evaluated design that dominates them",
                       "pruned by the placement's layout bounds (level 1)", "evaluated")}
    l0, dom, l1, ev = count.values()
    band = l0 + dom + l1 + ev
    with open(ROOT / "results" / "phaze-paper-exact-front" / "pareto.csv", newline="", encoding="utf-8") as fh:
        front = list(csv.DictReader(fh))
    block = sum("recompute=block" in r["GPT-3 175B:plan"] for r in front)
    page = " ".join(_page("search.md").split())
    assert (f"having evaluated {ev} designs** ({100 * ev / band:.2f} % of the band's {band:,}; level 0 pruned "
            f"{l0:,}, dominance {dom}, level 1 {l1:,})") in page
    assert f"On {block} of the {len(front)} designs GPT-3 175B's plan re-runs" in page


def test_quickstart_exact_search_is_what_the_code_proves(tmp_path):
    # the quick start's space searched exactly, as docs/search.md quotes it: the certificate and the
    # proven throughput in the README and the search page are what phaze prints now
    proc = subprocess.run([sys.executable, "-m", "phaze.cli", "search", str(ROOT / "search" / "quickstart.yaml"),
                           "--sampler", "exact", "--quiet", "--study", "readme-exact"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = _read(tmp_path / "results" / "readme-exact" / "report.md")
    cert = _certificate_lines(report)
    page = _page("search.md")
    assert "```\n" + "\n".join(cert) + "\n```" in page
    tokens = re.search(r"\*\*Best design: trial \d+\*\* \([^)]*\): ([\d,]+) tokens/s", report).group(1)
    evaluated, space = cert[-2].split(": ")[1], cert[0].split(": ")[1]
    assert f"**{tokens} tokens/s**" in page
    flat = " ".join(README.split())
    assert f"proves **{tokens} tokens/s** best having evaluated {evaluated} of its {space} designs" in flat


def test_quickstart_figures_are_what_the_quick_start_writes(tmp_path):
    # the first quick-start command, run in a scratch folder: the counts the README quotes come from
    # its trials.csv, it writes every figure tracked under results/quickstart/, and the README's
    # picture is byte-identical to the one it writes
    proc = subprocess.run([sys.executable, "-m", "phaze.cli", "search", str(ROOT / "search" / "quickstart.yaml"),
                           "--quiet"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "results" / "quickstart"
    with open(out / "trials.csv", newline="", encoding="utf-8") as fh:
        evaluated = [r["evaluated"] for r in csv.DictReader(fh)]
    flat = " ".join(README.split())
    assert (f"{evaluated.count('True')} designs evaluated and {evaluated.count('False')} proposals over the "
            "area budget") in flat
    tracked = {p.name for p in (ROOT / "results" / "quickstart").glob("*.png")}
    assert tracked and tracked <= {p.name for p in out.glob("*.png")}
    assert "](results/quickstart/front.png)" in README
    assert (out / "front.png").read_bytes() == (ROOT / "results" / "quickstart" / "front.png").read_bytes()
    # docs/power.md quotes its GPU baselines, held to the 300 W budget
    with open(out / "baselines.csv", newline="", encoding="utf-8") as fh:
        base = {r["baseline"]: float(r["throughput_tokens_per_s"]) for r in csv.DictReader(fh)}
    assert (f"fell from 6.52 to {base['h100-sxm'] / 1e6:.2f} million tokens/s and its A100 from 3.73 to "
            f"{base['a100-80gb'] / 1e6:.2f}") in " ".join(_page("power.md").split())


# --- the pages themselves -----------------------------------------------------------------------------
def test_readme_is_a_front_door():
    lines = README.splitlines()
    assert len(lines) <= 300
    # no run-on paragraph: a figure's history lives in docs/ (benchmarks.md, search.md), not here
    assert max(map(len, lines)) <= 300
    assert "pip install -e . && phaze search search/quickstart.yaml" in lines
    assert 'pip install -e ".[test]" && ruff check . && pytest' in lines
    assert "| `phaze report` |" in README
    assert "@inproceedings{wang2024phaze" in README


def test_docs_pages_have_no_run_on_lines():
    # a figure's history belongs in git, not in a paragraph that grows a clause each round: outside
    # code blocks and tables no line of a docs page runs past 400 characters
    for page in sorted((ROOT / "docs").glob("*.md")):
        long = [n for n, line in enumerate(_strip_code(_read(page)).splitlines(), 1)
                if len(line) > 400 and not line.startswith("|")]
        assert not long, f"{page.name}: lines {long}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _strip_code(_read(path)), flags=re.M):
        s = _slug(heading)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def _strip_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _links(path: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", _strip_code(_read(path)))
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_internal_links_point_to_existing_files_and_anchors(page):
    links = _links(page)
    assert page.name != "README.md" or page.parent != ROOT or len(links) > 20
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue                                  # http(s), mailto: not ours to check offline
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), (str(page.relative_to(ROOT)), link)
        assert ROOT in path.parents or path == ROOT, (page, link)     # nothing outside the clone
        if anchor:
            assert path.suffix == ".md" and anchor in _anchors(path), (str(page.relative_to(ROOT)), link)


def test_design_page_lists_every_module():
    page = _page("design.md")
    table = page[page.index("## Modules"):page.index("\n## ", page.index("## Modules") + 1)]
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "phaze").rglob("*.py") if p.name != "__init__.py"}
    listed = set(re.findall(r"`(phaze/[\w/]+\.py)`", table))
    assert modules == listed, (sorted(modules - listed), sorted(listed - modules))


def test_nothing_points_outside_the_clone():
    # a clone of phaze alone has no ../shared: no page, docstring or config may send a reader there
    files = [ROOT / "README.md", *DOCS.rglob("*.md"), *(ROOT / "phaze").rglob("*.py"), *(ROOT / "search").glob("*"),
             *(ROOT / "phaze" / "data").rglob("*.md")]
    for path in files:
        text = _read(path)
        for bad in ("../shared", "shared/DESIGN", "DESIGN.md", "shared/reference"):
            assert bad not in text, (str(path.relative_to(ROOT)), bad)
