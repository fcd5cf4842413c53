"""``mpiexec -n N python -m nlevel.run [APP] [options]``: run an app's tasks over a farm.

With no APP it runs the built-in micro benchmark (:mod:`nlevel.runtime.micro`). Rank 0 shows
progress, prints a summary and writes the JSON report. The exit status is 0 only when
every task is committed; 2 for bad input (the message says which value and what was
expected); 75 when SIGUSR1 stopped it early with tasks left (resume with the same
command). Any other error on any rank aborts the whole job, so no rank hangs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Any, Sequence

from .._version import __version__
from ..config import GROUPS, SETTINGS, Config, parse_setting
from ..errors import AppError, CheckpointError, ConfigError, NlevelError
from ..roles.messages import TaskFailure
from .app import App, load_app
from . import signals

__all__ = ["main", "build_parser", "report_status"]

def build_parser(app: App | None = None) -> argparse.ArgumentParser:
    """Return the parser of nlevel's options, plus the app's own options when ``app`` is given."""
    p = argparse.ArgumentParser(
        prog="python -m nlevel.run",
        description="Run APP's tasks over an MPI farm (master / region-masters / slaves). "
        "Launch with mpiexec (or nlevel-mpiexec on a workstation). Settings also come from "
        "NLEVEL_<NAME> environment variables; flags win.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("app", nargs="?", metavar="APP", help="module name or .py file (default: built-in micro benchmark)")
    p.add_argument("--version", action="version", version=f"nlevel {__version__}")
    run = p.add_argument_group("run")
    run.add_argument("--checkpoint", metavar="FILE.h5", help="HDF5 checkpoint: completed tasks are never run again "
                     "(python -m nlevel.status FILE.h5 shows how the run stands, while it runs or after)")
    run.add_argument(
        "--fresh", action="store_true",
        help="ignore the checkpoint's progress and start over (the old file is renamed FILE.h5.<UTC time>.bak)"
    )
    run.add_argument(
        "--retry-failed", action="store_true",
        help="run again the ids the checkpoint records as failed or quarantined (its /failed), with those not "
        "yet done; a record is cleared when its id succeeds"
    )
    run.add_argument(
        "--report", metavar="FILE", default="nlevel-report.json", help="JSON report path (default nlevel-report.json; '' for none)"
    )
    run.add_argument("--quiet", action="store_true", help="no progress display and no summary")
    groups = {key: p.add_argument_group(title) for key, title in GROUPS.items()}
    for s in SETTINGS.values():
        if not s.cli:
            continue
        groups[s.group].add_argument(
            s.flag, dest=s.name, metavar=s.name.upper(), help=f"{s.help} [default {s.show()}; {s.env}]"
        )
    if app is not None:
        group = p.add_argument_group(f"{app.name} options")
        app.add_arguments(group)  # type: ignore[arg-type]
    return p


def _app_options(app: App, options: argparse.Namespace) -> dict[str, Any]:
    probe = argparse.ArgumentParser(add_help=False)
    app.add_arguments(probe)
    return {a.dest: getattr(options, a.dest, None) for a in probe._actions if a.dest != "help"}


def find_app(argv: Sequence[str]) -> str | None:
    """Return the APP argument: the first positional before any option nlevel does not know.

    App options come after APP (``python -m nlevel.run myapp --size 3``); with no APP,
    the first unknown option starts the built-in workload's options.
    """
    parser = build_parser()
    takes_value = {s for a in parser._actions if a.nargs is None and a.option_strings for s in a.option_strings}
    known = {s for a in parser._actions for s in a.option_strings}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return argv[i + 1] if i + 1 < len(argv) else None
        if not tok.startswith("-"):
            return tok
        name = tok.split("=", 1)[0]
        if name not in known:
            return None
        i += 2 if (tok in takes_value and "=" not in tok) else 1
    return None


def check_report_path(report: str, checkpoint: str | None) -> None:
    """Refuse a report path that would overwrite something that is not an nlevel report.

    Checked before the run starts, so a long run does not fail at its end.

    Raises:
        ConfigError: naming the path and what was expected.
    """
    if not report:
        return
    path = os.path.abspath(report)
    if checkpoint is not None and path == os.path.abspath(checkpoint):
        raise ConfigError(f"--report {report!r} is the checkpoint file; expected a separate .json path")
    if os.path.isdir(path):
        raise ConfigError(f"--report {report!r} is a directory; expected a file path such as report.json")
    if not os.path.isdir(os.path.dirname(path)):
        raise ConfigError(f"--report {report!r}: directory {os.path.dirname(path)!r} does not exist")
    if os.path.exists(path):
        try:
            with open(path) as f:
                ours = "nlevel_version" in json.load(f)
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise ConfigError(
                f"--report {report!r} exists and is not an nlevel report; nlevel will not overwrite it "
                f"(choose another path)"
            )


def _prepare(argv: Sequence[str] | None) -> tuple[App, argparse.Namespace, int, Config]:
    args = list(sys.argv[1:] if argv is None else argv)
    app = load_app(find_app(args))
    argv = args
    options = build_parser(app).parse_args(argv)
    overrides = {
        s.name: parse_setting(s.name, getattr(options, s.name), source=s.flag)
        for s in SETTINGS.values()
        if getattr(options, s.name, None) is not None
    }
    config = Config.from_env(**overrides, progress=not options.quiet)
    check_report_path(options.report, options.checkpoint)
    try:
        app.setup(options)
    except (ValueError, TypeError) as exc:
        raise AppError(f"APP {app.name!r} rejected its options: {exc}") from exc
    return app, options, app.total(options), config


def _say(exc: NlevelError) -> str:
    """An error as this command shows it: a checkpoint's remedy names --fresh, not a script's options."""
    return exc.explain("run") if isinstance(exc, CheckpointError) else str(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the farm; return the exit status (0 only when every task is committed)."""
    from ..api import Farm
    from . import transport
    from .report import format_summary, master_wrote, write_json

    world = transport.world()
    rank = world.Get_rank()
    problem: str | None = None
    try:
        app, options, total, config = _prepare(argv)
        fingerprint = {"app": app.name, **app.fingerprint(options)}
    except NlevelError as exc:
        problem = _say(exc)
    # Every rank parsed the same argv; agree before any farm collective so none hangs.
    try:
        problems = world.allgather(problem)
    except transport.MpiError:
        if not transport.setup_recovery(None):
            raise
        # Under ULFM a rank died before or during this gathering: the others parsed the same
        # argv, so this rank's own verdict is theirs; the farm's set-up then survives the death.
        problems = [problem]
    first = next((p for p in problems if p), None)
    if first is not None:
        if rank == 0:
            print(f"nlevel: error: {first}", file=sys.stderr, flush=True)
        return 2

    def tell(report: dict[str, Any]) -> None:
        """The report: to its file, and the summary (the master, after the end; or a process ending
        the job from inside a task that never returns, see Farm.on_forced_end)."""
        report["app"] = {"name": app.name, "options": _app_options(app, options), "argv": list(argv or sys.argv[1:])}
        if options.report:
            write_json(options.report, report)
        if not options.quiet:
            print(format_summary(report), flush=True)
            if options.report:
                print(f"  report: {os.path.abspath(options.report)}", flush=True)

    farm: Any = None
    status = 0
    try:
        with Farm(
            total,
            options.checkpoint,
            world,
            fingerprint=fingerprint,
            fresh=options.fresh,
            config=config,
            result_fields=app.result_fields,
            retry_failed=options.retry_failed,
        ) as farm:
            farm.hold_deputy()  # (released once the report file is written, below)
            farm.on_forced_end(tell)
            on_error = farm.config.on_task_error
            teams = app.takes_comm
            for task_id in farm:
                try:
                    result = app.do_job(task_id, farm.team if teams else None)
                except Exception as exc:
                    if on_error == "abort":
                        raise
                    if farm.config.task_output:
                        traceback.print_exc()  # (into the task's own .err file: its output says why it failed)
                    farm.fail(_task_error(task_id, rank, exc))  # retried elsewhere, or recorded failed
                    continue
                if result is not None:
                    farm.complete(result)
    except NlevelError as exc:
        if farm is None:  # the farm refused its input: the same error on every rank
            status = 2
            if rank == 0:
                print(f"nlevel: error: {_say(exc)}", file=sys.stderr, flush=True)
        else:  # the run happened but its end failed (the last checkpoint write): raised on every rank alike
            status = 1
            # Said once: by the master (the rank with the report), unless a failed write stopped the
            # job and was said when it happened.
            told = isinstance(exc, CheckpointError) and (farm.report or {}).get("stopped") in ("checkpoint", "lock")
            if farm.report is not None and not told:
                print(f"nlevel: error: {_say(exc)}", file=sys.stderr, flush=True)
    except (ValueError, RuntimeError) as exc:
        if farm is None or exc is not farm._misuse:
            raise
        # complete() refused what do_job returned: the master stopped the job and said why, once
        # (Farm._stop_for); this rank ends as the others do (the report, the agreed status).
        status = 1
    if (farm is not None and farm.report is not None and "written_by" in farm.report and options.report
            and master_wrote(options.report, farm.job)):
        farm.report = None  # (the master was not dead: it exited just after releasing this rank; its report stands)
    if farm is not None and farm.report is not None:  # the master (rank 0 unless it died)
        report = farm.report
        try:
            tell(report)
        finally:
            farm.release_deputy()  # (it watched the master until the report was on disk and told)
        status = max(status, report_status(report))
        if status == 0:
            status = _finish_app(app, farm, options)
    if farm is not None:
        farm.release_deputy()  # (no report file: nothing more to wait for; once only)
    # Every rank ends with the worst status any rank saw; no rank waits on one that failed alone.
    if farm is not None and (farm.ft or farm.failed):
        status = farm.agree_status(status)  # (no collective: a process may have exited unseen)
        farm.set_exit_code(status)  # the process ends with os._exit (MPI_Finalize may hang after failures)
        return status
    if farm is not None:
        status = farm.agree_status(status)
        if status:
            farm.set_exit_code(status)
        return status
    return transport.allreduce_max(world, status)


def report_status(report: dict[str, Any]) -> int:
    """The exit status a run's report calls for: 75 when it stopped early with ids left to run
    (the batch script resubmits, the checkpoint resumes), 1 when ids failed or the checkpoint
    could not be written, else 0.

    Stopped with every id committed or failed is 1, not 75: nothing is left to resume (the
    master's release said 1, and 75 from here was the worse of the two).
    """
    from .report import exit_status

    return exit_status(complete=bool(report["complete"]), stopped=bool(report.get("stopped")),
                       left=report["total"] - report["committed"] - len(report.get("failed_tasks") or ()),
                       error="checkpoint_error" in report or bool(report.get("user_errors")))


def _task_error(task_id: int, rank: int, exc: BaseException) -> TaskFailure:
    """The error of a task that raised, with where it ran, for the report (the last 20 traceback lines)."""
    from .rank import task_failure
    from .transport import host

    return task_failure(task_id, rank, host(), exc, traceback.format_exc())


def _finish_app(app: App, farm: Any, options: argparse.Namespace) -> int:
    """Rank 0: hand the committed results to the app's ``finish``; an error there is reported, not a hang."""
    results = farm.results()
    assert results is not None
    try:
        app.finish(results[0], results[1], options)
    except Exception:
        print(f"nlevel: error: APP {app.name!r} finish() failed (every task is committed in the checkpoint):",
              file=sys.stderr)
        traceback.print_exc()
        return 1
    return 0


def _entry() -> None:
    signals.install()  # first thing: a SIGUSR1 while the rank is still starting must not kill it
    try:
        code = main()
    except SystemExit as exc:
        from .launch import record_exit

        record_exit(exc.code if isinstance(exc.code, int) else 1 if exc.code else 0)
        raise
    except BaseException:
        from .transport import host, world

        from ..config import Config

        try:
            ft = Config.from_env().ft
        except NlevelError:
            ft = False
        sys.stderr.write(f"nlevel: rank {world().Get_rank()} on {host()}: unhandled error; "
                         f"{'killing this process' if ft else 'aborting the job'}\n")
        traceback.print_exc()
        sys.stderr.flush()
        if ft:
            from .transport import kill_self

            kill_self()
        world().Abort(1)
        raise
    from .launch import record_exit

    record_exit(code)  # (under ULFM mpiexec itself returns 0 whatever the ranks' statuses)
    sys.exit(code)


if __name__ == "__main__":
    _entry()
