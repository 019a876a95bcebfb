"""The `experiment` command (`python -m reproduction NAME`, or `vitlab experiment NAME` from a checkout): one of the
paper's findings reproduced at small scale."""

from __future__ import annotations

import argparse
import logging
import sys
from contextlib import nullcontext
from pathlib import Path

from vitlab.cli import jobs, precision_name, seed

DEFAULT_OUT = "runs/experiments"
QUICK_OUT = "runs/experiments-quick"
DEFAULT_REPORT = "REPRODUCTION.md"
DEFAULT_RECORDS = "reproduction/records"


def main(argv: list[str] | None = None) -> int:
    """vitlab's command line with this package's `experiment` verb: `main(["experiment", "pilot", ...])` (global flags
    such as -q before the verb, as with `vitlab`)."""
    from vitlab.cli import main as vitlab_main

    return vitlab_main(argv, commands={"experiment": register})


def register(sub: argparse._SubParsersAction) -> None:
    from reproduction import NAMES, PILOT

    p = sub.add_parser(
        "experiment", help="reproduce one of the paper's findings at small scale (results.json, figures)",
        description="Run one experiment of the paper at CPU scale: " + ", ".join(NAMES) + " (all: every one in "
                    "turn; report: only rewrite REPRODUCTION.md from the stored results). Every number comes "
                    "from runs the command performs, each in its own run directory under OUT/_runs/, shared "
                    "between experiments; a finished run is never redone and an interrupted one resumes, so "
                    "running the same command again continues where it stopped. Writes OUT/NAME/results.json "
                    "and figures, and (full runs) rewrites REPRODUCTION.md.")
    p.add_argument("name", metavar="NAME", nargs="+",
                   help=f"{PILOT} (the pre-training source), {', '.join(NAMES)}, all, or report; several run one "
                        "after the other, each later one's runs taking the cores an earlier one leaves idle (while "
                        "its runs wait for a learning rate to be chosen, say)")
    p.add_argument("--quick", action="store_true",
                   help="the pipeline in seconds (tiny sets, a few steps, one seed): checks that it runs, not "
                        "what it finds")
    p.add_argument("--out", help=f"where runs and results go (default {DEFAULT_OUT}; with --quick {QUICK_OUT})")
    p.add_argument("--seeds", type=seed, nargs="+", metavar="SEED",
                   help="seeds of the compared runs (default: the experiment's, 0 1 2 for most; --quick: 0)")
    p.add_argument("--estimate", action="store_true",
                   help="measure step times, print what is left to run and how long it will take, run nothing "
                        "(all: each experiment after the ones before it)")
    p.add_argument("--jobs", type=jobs, metavar="N",
                   help="runs trained side by side, each on its share of the cores (default: one per core; small "
                        "models use a core better alone than two threads do)")
    p.add_argument("--report", metavar="PATH",
                   help=f"the Markdown report to rewrite from OUT's full results (default {DEFAULT_REPORT} for "
                        "full runs, none for --quick)")
    p.add_argument("--force", action="store_true",
                   help="let --report replace a file that is not a report vitlab wrote (a report starts with the "
                        "line `<!-- written_by: vitlab experiment report -->`)")
    p.add_argument("--records", metavar="DIR",
                   help=f"where every finished run's result.json is also written, to be committed (default "
                        f"{DEFAULT_RECORDS} for full runs, none for --quick): on a new machine a run recorded there "
                        "is not trained again unless its weights are wanted (a new evaluation, a fine-tuning from "
                        "it still to run)")
    p.add_argument("--precision", type=precision_name(int8=False), default="auto",
                   help="auto or fp32: the designs pin float32 (every recorded run was trained in it); auto "
                        "resolves to it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from reproduction import NAMES, PILOT, stopping
    from reproduction.experiments import experiments
    from reproduction.parallel import Pool, cpu_count
    from reproduction.spec import DESIGN_PRECISION
    from vitlab.cli import UserError

    asked = [n for name in args.name for n in (NAMES if name == "all" else [] if name == "report" else [name])]
    names = list(dict.fromkeys(asked))  # each once, in the order first named
    unknown = [n for n in names if n not in (*NAMES, PILOT)]
    if unknown:
        raise UserError(f"unknown experiment {unknown[0]!r}; choose one of {PILOT}, {', '.join(NAMES)}, all or "
                        "report")
    if args.precision not in ("auto", DESIGN_PRECISION):
        raise UserError(f"--precision {args.precision}: the experiment designs pin {DESIGN_PRECISION} (their recorded "
                        "runs were trained in it, and a run's result must not depend on the machine); use auto or "
                        f"{DESIGN_PRECISION}")
    if args.seeds and len(set(args.seeds)) != len(args.seeds):
        raise UserError(f"--seeds lists a seed twice ({' '.join(map(str, args.seeds))}); give each seed once")
    if args.verbosity > 0:  # every sub-run's training log on the console, as `vitlab train` prints it
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = Path(args.out or (QUICK_OUT if args.quick else DEFAULT_OUT))
    table = experiments()
    assumed = {} if args.estimate and len(names) > 1 else None  # `all --estimate`: each after the ones before
    report = None if args.estimate else args.report or (None if args.quick else DEFAULT_REPORT)
    jobs = args.jobs or cpu_count()
    if report:  # before any run: a file the report may not replace is said now, not after hours of training
        from reproduction.report.report import previous_report

        previous_report(Path(report), args.force)
    # one pool of workers for the whole command: a later experiment's run goes on across the hand-over
    one_pool = jobs > 1 and len(names) > 1 and not args.estimate
    # SIGTERM and Ctrl-C stop every run at its next step with a checkpoint, then the command (experiments.stopping)
    with stopping.CommandStop() as stop, Pool(jobs) if one_pool else nullcontext() as pool:
        for i, name in enumerate(names):
            if not _run_one(table[name], out, args, assumed, [table[n] for n in names[i + 1:]], jobs, pool):
                if pool is not None:  # a run stopped by a signal only its worker received: the others stop too
                    pool.halt()
                return stopping.exit_code(stop.signal)
            if report:  # after each experiment: its results and figures are ready to commit before the next ends
                _write_report(out, report, args.force)
    if stop.signal:  # it came while the last runs of a later experiment were finishing: they stopped
        _say_stopped(stop.signal)
        return stopping.exit_code(stop.signal)
    if report and not names:  # `report`: only rewrite it
        _write_report(out, report, args.force)
    return 0


def _write_report(out: Path, report: str, force: bool) -> None:
    from reproduction.report.report import write_report

    write_report(out, Path(report), force=force)
    print(f"wrote {report} from the results in {out}")


def _run_one(experiment, out: Path, args: argparse.Namespace, assumed: dict | None, then: list, jobs: int,
             pool) -> bool:
    """One experiment (the ones after it, `then`, fill the cores it leaves idle, on the command's `pool`);
    False if a run was stopped (SIGTERM, Ctrl-C) and the experiment with it."""
    from reproduction.experiment import run_experiment
    from reproduction.runner import Interrupted
    from reproduction.stopping import Stopped, interruptible, requested

    try:
        records = args.records or (None if args.quick else DEFAULT_RECORDS)
        with interruptible():  # a stop signal here ends the experiment; elsewhere it is noted, and ends it next
            Stopped.raise_if(requested())
            results = run_experiment(experiment, out, args.quick, tuple(args.seeds) if args.seeds else None,
                                     args.estimate, assumed=assumed, jobs=jobs, records=records, then=then,
                                     pool=pool)
    except (Interrupted, Stopped) as err:
        _say_stopped(requested(), err)
        return False
    if results is not None:
        print_summary(results, out / experiment.name)
    return True


def _say_stopped(signal: str | None, err: Exception | None = None) -> None:
    what = f"stopped by {signal}" if signal else f"interrupted ({err})"
    print(f"vitlab experiment: {what}: the runs in progress stopped at a checkpoint; run the same command again to "
          "continue", file=sys.stderr)


def print_summary(results: dict, folder: Path) -> None:
    print(f"{results['experiment']} ({results['paper']}), {results['mode']} run, seeds "
          f"{' '.join(str(s) for s in results['seeds'])}, {results['wall_seconds']:.0f} s:")
    for line in results["measured"]:
        print(f"  {line}")
    check = results["check"]
    if results["mode"] == "quick":
        print("  (--quick: a check of the pipeline; its numbers say nothing about the finding)")
    elif "decision" in results:
        print(f"  decision by the rule: {results['decision']}")
    elif "verdict" in results:
        print(f"  verdict: {results['verdict']['state']}: {results['verdict']['result']}")
    else:
        print(f"  the paper's ordering {'holds' if check['holds'] else 'does not hold'} here by the rule: "
              f"{check['rule']}")
    print(f"  {folder / 'results.json'}; figures: {', '.join(f['file'] for f in results['figures'])}")
