"""The committed reproduction reports are what their committed run records give.

``results/README.md`` lists, for each report trained with ``--runs results/NAME``, the command
that writes it. Run on a copy of the records git keeps (config, metrics, logs, the cached
protocol files, the chart plots; no checkpoints) of the runs it plans, each command must reuse
every run, train nothing, and write the tables, settings, claim verdicts and chart plots the
committed report shows. A report edited by hand, records left uncommitted, or a change to how
kdml names run folders or scores a table would each show up here.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kdml import cli

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [command for command in
            re.findall(r"`(kdml reproduce [^`]*)`", (ROOT / "results" / "README.md").read_text())
            if "--out" in command]
# libyaml's parser where PyYAML has it: several times faster over hundreds of config.yaml, and
# the same values as PyYAML's own for the plain YAML that kdml writes there
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def tracked_files(folder: str) -> list[str]:
    """The files git keeps under ``folder`` (a checkout also holds checkpoints it ignores)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", folder], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the committed run records cannot be listed")
    return [name for name in listed.split("\0") if name]


def planned_run_folders(args: list[str]) -> set[str]:
    """The run folders (``RUNS/NAME/seed-N``, as git names them) that the ``kdml reproduce``
    command ``args`` plans, chosen as it chooses its experiments (``--only``). The others of
    its runs folder (most of ``results/reproduce/``'s 605 for a Fashion-MNIST report) it never
    reads, and copying them was most of each check's time."""
    from fnmatch import fnmatchcase

    from kdml.cli.parser import build_parser
    from kdml.reproduce.catalog import experiments
    from kdml.reproduce.runner import plan

    options = build_parser().parse_args(args)
    chosen = [experiment for experiment in experiments(options.paper, options.quick)
              if not options.only
              or any(fnmatchcase(experiment.key, pattern) for pattern in options.only)]
    planned = plan(chosen, options.seeds, options.runs, options.device)
    return {run.run_dir.as_posix() for runs in planned.values() for run in runs}


def compared_lines(report: str) -> list[str]:
    """The numbers of a report: its training time and machines, tables, settings lines and
    claims (the commands it prints name the runs folder and report path, which differ for the
    copy, and its header names the machine writing it)."""
    training = re.findall(r"^Written by .*?\(torch [^)]*\); (.*?)\. Settings:", report,
                          re.MULTILINE)
    return training + [line for line in report.splitlines()
                       if line.startswith(("|", "- ", "Settings:", "Charts of"))
                       and "kdml reproduce" not in line]


def chart_plots(report: Path) -> dict[str, bytes]:
    """The chart plots ``report`` shows, by file name: kept with the run records
    (``reproduce-charts.png``), since the records have no checkpoints to draw them from."""
    return {Path(link).name: (report.parent / link).read_bytes()
            for link in re.findall(r"!\[charts\]\(([^)]*)\)", report.read_text())}


def test_results_readme_lists_each_records_folder():
    """Each folder of committed records has a command that checks its report below."""
    folders = {shlex.split(command)[shlex.split(command).index("--runs") + 1]
               for command in COMMANDS}
    committed = {"/".join(name.split("/")[:2]) for name in tracked_files("results")
                 if name.count("/") > 1}  # results/NAME/..., not results/README.md
    assert COMMANDS and folders == committed


@pytest.mark.parametrize("command", COMMANDS,
                         ids=[shlex.split(command)[-1] for command in COMMANDS])
def test_a_committed_report_is_what_its_committed_records_give(command, tmp_path, capsys,
                                                               monkeypatch):
    args = shlex.split(command)[1:]
    runs, report = args[args.index("--runs") + 1], args[args.index("--out") + 1]
    # a run the plan names but git lacks is not copied, and trains (or fails) below
    planned = planned_run_folders(args)
    for name in tracked_files(runs):
        if name.rsplit("/", 1)[0] not in planned:
            continue
        copy = tmp_path / "runs" / name[len(runs) + 1:]
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy)
    args[args.index("--runs") + 1] = str(tmp_path / "runs")
    args[args.index("--out") + 1] = str(tmp_path / "report.md")
    # in this process (cli.main, as the kdml command calls it): a Python of its own for each
    # of these commands spent more time importing torch than writing the report
    monkeypatch.chdir(tmp_path)
    code = cli.main([*args, "--no-progress"])
    done = capsys.readouterr()
    assert code == 0, done.err[-2000:]
    planned = re.findall(r"^\[\d+/\d+\] ", done.out, re.MULTILINE)
    reused = re.findall(r"^  reused: (?:finished|diverged) earlier", done.out, re.MULTILINE)
    assert planned and len(reused) == len(planned), "a run was trained, not reused"
    written = compared_lines((tmp_path / "report.md").read_text())
    committed = compared_lines((ROOT / report).read_text())
    assert written == committed
    assert chart_plots(tmp_path / "report.md") == chart_plots(ROOT / report)


def committed_claims() -> list[tuple[str, str]]:
    """Each claim line of the committed reports (those ``results/README.md``'s commands write),
    with its verdict: ``holds``, ``does not hold`` or ``not shown``."""
    reports = sorted({shlex.split(command)[shlex.split(command).index("--out") + 1]
                      for command in COMMANDS})
    return [(match.group(1), line) for report in reports
            for line in (ROOT / report).read_text().splitlines()
            if (match := re.match(r"- .* \([^()]*\): (holds|does not hold|not shown): ", line))]


def test_findings_gives_each_claim_that_does_not_hold_with_its_numbers():
    """docs/findings.md tells what each report found. Its summary of docs/reproduction.md said
    "the rest are within the seeds' spread" after Table 3's "JRD has the smaller lambda + d_H"
    on mnist5k had become "does not hold" (2026-12-05, when JMMD's runs were trained again),
    and its DTML section gave no numbers for the claims that do not hold."""
    findings = " ".join((ROOT / "docs" / "findings.md").read_text().split())
    differences = [(re.search(r" by (\d+\.\d+ \+- \d+\.\d+)", line), line)
                   for verdict, line in committed_claims() if verdict == "does not hold"]
    assert differences and all(found for found, _ in differences)
    assert [line for found, line in differences if found.group(1) not in findings] == []


def test_the_readme_s_table_of_verdicts_is_the_committed_reports():
    """README's table of every paper claim's verdict per dataset: each verdict it gives with
    its numbers is a claim line of a committed report, with that verdict and those numbers."""
    readme = (ROOT / "README.md").read_text()
    rows = [row for block in readme.split("\n\n")
            if block.startswith(("| Paper claim |", "| DTML (Hu, Lu and Tan) claim |"))
            for row in block.splitlines()[2:]]
    claims, checked = committed_claims(), 0
    for row in rows:
        for cell in row.split("|")[2:-1]:
            for number in re.finditer(r"[+-]?(\d+\.\d+) \+- (\d+\.\d+)", cell):
                said = re.findall(r"does not hold|not shown|hold", cell[:number.start()])[-1]
                verdict = "holds" if said == "hold" else said
                pair = f"{number.group(1)} +- {number.group(2)}"
                assert any(pair in line for found, line in claims if found == verdict), (
                    f"README: {row.split('|')[1].strip()}: {verdict} {pair}: no such claim")
                checked += 1
    assert checked >= 20


def test_the_readme_s_table_of_verdicts_gives_every_paper_claim_that_is_decided():
    """The other way round: each paper claim that a committed report finds holding or not
    holding is in README's table, with its numbers. The table had no row for Atlas Table 2's
    "16 charts beat 1 at d = 4", which holds on Fashion-MNIST (+0.090 +- 0.065). kdml's own
    checks and ablations (``(kdml's ...)``, and the head ablation's claims "both with heads 64
    wide") are docs/findings.md's, not the table's."""
    readme = (ROOT / "README.md").read_text()
    table = "\n".join(row for block in readme.split("\n\n")
                      if block.startswith(("| Paper claim |", "| DTML (Hu, Lu and Tan) claim |"))
                      for row in block.splitlines()[2:])
    decided = [(re.search(r" by \+?(\d+\.\d+ \+- \d+\.\d+)", line), line)
               for verdict, line in committed_claims()
               if verdict != "not shown" and "(kdml's" not in line
               and "both with heads 64 wide" not in line]
    assert decided and all(found for found, _ in decided)
    assert [line for found, line in decided if found.group(1) not in table] == []


def test_benchmarks_md_quotes_the_committed_reports_training_minutes_as_they_are_now():
    """docs/benchmarks.md gives the training minutes of the reports whose runs were trained
    again. It kept "The 375 runs took 271.1 minutes in all, as the report says" and Figure 5's
    634.8 after the JMMD runs at alpha = 0.1 were trained again on 2026-12-05, when the reports'
    headers became 269.3 and 591.1 (Table 3's, 114.3, was not given at all)."""
    benchmarks = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())
    quotes = {
        "docs/reproduction.md": r"The 375 runs took (\d+\.\d) minutes in all, as the report says",
        "docs/reproduction-fashion-mnist-generalization.md":
            r"the report now counts (\d+\.\d) minutes for its 10 runs",
        "docs/reproduction-fashion-mnist-regularizers.md":
            r"the report now counts (\d+\.\d) minutes for the 65 runs",
    }
    for report, quote in quotes.items():
        header = re.search(r"; (\d+\.\d) minutes of training in all", (ROOT / report).read_text())
        said = re.search(quote, benchmarks)
        assert header and said, report
        assert said.group(1) == header.group(1), report


def test_a_committed_report_shows_each_experiment_as_the_catalog_describes_it():
    """A section's title, paper column and note (what kdml reproduce writes beside the tables,
    which the comparison above leaves out) are the catalog's: a note added to an experiment
    reaches its committed reports, not only the reports written after."""
    from kdml.reproduce.catalog import experiments

    shown = 0
    for report in sorted((ROOT / "docs").glob("reproduction*.md")):
        text = report.read_text()
        for experiment in experiments("all"):
            heading = f"\n### {experiment.mirrors}: {experiment.dataset}\n"
            if heading not in text:
                continue
            section = text.split(heading, 1)[1].split("\n### ", 1)[0]
            assert experiment.title in section, (report.name, experiment.key)
            assert f"Paper column: {experiment.paper_data}." in section, (report.name,
                                                                          experiment.key)
            assert experiment.note in section, (report.name, experiment.key)
            shown += 1
    assert shown >= 20


def test_the_docs_give_the_digits_pair_s_own_source_nn_accuracy_as_the_pca_row_records_it():
    """The inputs' own source-NN accuracy on ``mnist5k->digits`` is the DTML report's PCA row
    (all 64 components: a rotation, which leaves the distances as they were; `kdml train pca
    --dataset 'mnist5k->digits' data.pca_dim=0` gives the same 0.7974). docs/findings.md called
    that row "the inputs' own distances (0.797 ...)" and, a paragraph before, gave the inputs'
    own as 0.798, as docs/recipes.md and docs/datasets.md did."""
    report = (ROOT / "docs" / "reproduction-dtml.md").read_text()
    section = report.split("LFW table: mnist5k->digits\n", 1)[1]
    pca = re.search(r"^\| PCA \| (\d\.\d{3}) \+- ", section, re.MULTILINE)
    quotes = {"findings.md": r"(\d\.\d{3}) for the inputs themselves",
              "recipes.md": r"where the inputs' own is (\d\.\d{3})",
              "datasets.md": r"`mnist5k->digits` (\d\.\d{3}), `digits->mnist5k`"}
    assert pca
    for doc, quote in quotes.items():
        found = re.findall(quote, " ".join((ROOT / "docs" / doc).read_text().split()))
        assert found == [pca.group(1)], doc


def test_results_readme_says_from_when_a_record_names_its_machine():
    """results/README.md says from when ``reproduce.json`` names the machine a run trained on.
    It said "since 2026-12-04", but the 25 runs of Fashion-MNIST's CPU Table 2 at d = 8,
    trained on 2026-12-04 before kdml kept the machine (74304595, 20:08), do not name it."""
    from datetime import datetime

    readme = " ".join((ROOT / "results" / "README.md").read_text().split())
    said = re.search(r"for runs trained since (\d{4}-\d\d-\d\d)(?: (\d\d:\d\d) UTC)?", readme)
    assert said
    since = datetime.fromisoformat(f"{said.group(1)}T{said.group(2) or '00:00'}")
    checked = 0
    for name in tracked_files("results"):
        if not name.endswith("/reproduce.json"):
            continue
        lines = (ROOT / name).with_name("train.log").read_text().splitlines()
        last = datetime.strptime(lines[-1][:16], "%Y-%m-%d %H:%M")
        named = "machine" in json.loads((ROOT / name).read_text())
        assert named == (last >= since), name
        checked += 1
    assert checked > 500


def test_findings_gives_n1_s_nt_xent_at_d8_as_the_records_have_it():
    """docs/findings.md gives MSimCLR n = 1's NT-Xent at d = 8 (the CPU Table 2's narrow heads,
    10 epochs) twice: "falls only to 5.48" and, in the head ablation, "still stays at 5.49",
    where its records' epoch-10 values average 5.4846 (seed 0: 5.48496)."""
    values = []
    for name in tracked_files("results/simclr-table2-cnn"):
        if not name.endswith("/config.yaml"):
            continue
        config = yaml.load((ROOT / name).read_text(), Loader=SAFE_LOADER)
        method = config["method"]
        cell = (config["recipe"], method.get("dim"), method.get("n_charts"),
                config["train"]["epochs"], method.get("proj_hidden") or None)
        if cell == ("msimclr", 8, 1, 10, None):
            metrics = json.loads((ROOT / name).with_name("metrics.json").read_text())
            values.append(metrics["epochs"][-1]["train/nt_xent"])
    assert len(values) == 5
    findings = " ".join((ROOT / "docs" / "findings.md").read_text().split())
    said = re.findall(r"falls only to (\d\.\d\d) at d = 8|NT-Xent still stays at (\d\.\d\d)",
                      findings)
    assert len(said) == 2
    assert {a or b for a, b in said} == {f"{sum(values) / len(values):.2f}"}
