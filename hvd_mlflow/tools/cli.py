"""The ``hvd-mlflow`` command.

hvd-mlflow sync                      # upload every pending journal under .hvd_mlflow/journal
hvd-mlflow sync path/to/x.journal.sqlite --tracking-uri http://mlflow:5000
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from .. import config
from .._version import __version__
from ..delivery import destination
from ..delivery import journal as journal_module


class _OneLineErrors(click.Group):
    """Every error of every command ends in one line that says what is wrong (and, where known, what to do),
    never in a Python traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as error:  # noqa: BLE001 - turned into the one-line error below
            raise click.ClickException(_explain(error)) from None


def _explain(error: BaseException) -> str:
    from ..common.redact import redact

    message = " ".join(redact(str(error)).split())[:500] or type(error).__name__
    code = getattr(error, "error_code", "")
    if code == "RESOURCE_DOES_NOT_EXIST" or "not found" in message.lower():
        return f"{message}; check the id and the tracking server (--tracking-uri or MLFLOW_TRACKING_URI)"
    if isinstance(error, ValueError | OSError):
        return message
    return f"{type(error).__name__}: {message}"


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hvd-mlflow")
@click.option("-v", "--verbose", is_flag=True, help="Say more about what is done.")
def main(verbose: bool) -> None:
    """Tools around hvd-mlflow's Keras callback."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")
    if not verbose:
        logging.setLogRecordFactory(_one_line(logging.getLogRecordFactory()))


def _one_line(make: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    """Without -v, what any library logs (MLflow logs its store's errors with their trace) is one line: its message
    and the error's own, whitespace folded, without the trace, which -v shows."""

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            text = record.getMessage()
            error = record.exc_info[1] if isinstance(record.exc_info, tuple) else None
            if error is not None and str(error) not in text:
                text = f"{text}: {type(error).__name__}: {error}"
        except Exception:  # noqa: BLE001 - a message (or error) that cannot be formatted: left for logging to report
            return record
        if record.exc_info or record.stack_info or "\n" in text:
            record.msg, record.args = " ".join(text.split()), ()
            record.exc_info = record.stack_info = None
        return record

    return factory


@main.command()
@click.argument("journals", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--tracking-uri",
    envvar=config.ENV_PREFIX + "SYNC_TRACKING_URI",
    help="Upload there instead of the tracking URI recorded in each journal.",
)
@click.option("--keep", is_flag=True, help="Keep journal files once fully delivered (default: delete them).")
@click.option("--force", is_flag=True, help="Also upload journals whose training process still runs.")
def sync(journals: tuple[Path, ...], tracking_uri: str | None, keep: bool, force: bool) -> None:
    """Upload what training could not deliver, from journal files (default: every journal in
    $HVD_MLFLOW_JOURNAL_DIR, else .hvd_mlflow/journal under the working directory).

    Only hvd-mlflow journals are touched: any other file is refused, unchanged; a journal's lock and SQLite
    companions (as a glob gives them) are skipped. Safe to run again, or after a partial upload: nothing is
    logged twice. A run that hvd-mlflow created is ended with the training's outcome (KILLED when the training
    died without one). Entries the server refuses for good stay in the journal, and the command fails naming them.
    """
    from .syncing import journal_paths

    paths = journal_paths(journals) if journals else journal_module.find()
    if not paths:
        click.echo(f"no journal in {journal_module.default_directory()}: nothing to upload")
        return
    problems = [problem for path in paths if (problem := _sync_one(path, tracking_uri, keep=keep, force=force))]
    if len(problems) == 1:
        raise click.ClickException(problems[0])
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        raise click.ClickException(
            f"{len(problems)} of {len(paths)} journal(s) not fully uploaded (why is said above); nothing is lost: "
            "run the same command again once that is fixed"
        )


def _sync_one(path: Path, tracking_uri: str | None, *, keep: bool, force: bool) -> str | None:
    """Sync one journal, saying what was done; the one-line problem when something is left, else None."""
    from ..common.redact import redact
    from .syncing import sync_one

    try:
        journal_module.inspect(path)  # before anything is said on stderr: a refusal is one line
        with click.progressbar(length=0, label=path.name, file=sys.stderr) as bar:

            def progress(settled: int, total: int) -> None:
                bar.length = total
                bar.update(settled)

            result = sync_one(path, tracking_uri, keep=keep, force=force, on_progress=progress)
    except journal_module.NotAJournal as error:
        return f"{path}: refused, not an hvd-mlflow journal ({error}); left untouched"
    except Exception as error:  # noqa: BLE001 - go on with the other journals, fail at the end
        return f"{path}: not uploaded: {' '.join(redact(str(error)).split())[:500]}"
    click.echo(result.summary())
    for note in result.notes:
        click.echo(f"{path}: {note}")
    return result.problem()


@main.command("import-csv")
@click.argument("csv_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--run-id", help="Import into this run.")
@click.option("--experiment", help="Import into a run of this experiment (created on the first import).")
@click.option(
    "--tracking-uri", envvar=destination.TRACKING_URI_VARIABLE, help="Default: MLFLOW_TRACKING_URI, else MLflow's."
)
def import_csv(csv_file: Path, run_id: str | None, experiment: str | None, tracking_uri: str | None) -> None:
    """Upload a Keras CSVLogger file (the seed recipe's training_metrics.csv) into a run, at step = epoch.

    Safe to run again: points already in the run are not sent twice, and with --experiment the same file goes
    to the same run (found by the file's checksum tag).
    """
    from .csv_import import import_csv as do_import

    if bool(run_id) == bool(experiment):
        raise click.UsageError("give exactly one of --run-id and --experiment")
    with click.progressbar(length=0, label=f"{csv_file.name}: epochs", file=sys.stderr) as bar:

        def progress(settled: int, total: int) -> None:
            bar.length = total
            bar.update(settled)

        result = do_import(
            csv_file, run_id=run_id, experiment=experiment, tracking_uri=tracking_uri, on_progress=progress
        )
    click.echo(f"{csv_file}: {result.sent} points sent, {result.already} already there, into run {result.run_id}")


@main.command()
@click.argument("run_id")
@click.option("--metrics", "-m", multiple=True, help="Metrics to draw (default: all); repeat the option.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("curves.png"))
@click.option(
    "--tracking-uri", envvar=destination.TRACKING_URI_VARIABLE, help="Default: MLFLOW_TRACKING_URI, else MLflow's."
)
def plot(run_id: str, metrics: tuple[str, ...], output: Path, tracking_uri: str | None) -> None:
    """Draw a run's training curves to a PNG: each metric with its val_ twin, by epoch.

    RUN_ID may be ``last``: the most recently started run of MLFLOW_EXPERIMENT_ID / MLFLOW_EXPERIMENT_NAME, else
    of the default experiment.
    """
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)  # None: MLflow's tracking URI
    if run_id == "last":
        run_id = _last_run_id(client)
    charts = curves(client, run_id, metrics or None)
    if not charts:
        raise click.ClickException(f"run {run_id} has no metrics")
    save_png(charts, output, title=f"run {run_id}")
    click.echo(f"{output}: run {run_id}, {len(charts)} chart(s), {sum(len(s) for s in charts.values())} curve(s)")


def _last_run_id(client: object) -> str:
    experiment_id, name = destination.experiment_from_environment()
    if not experiment_id and name:
        experiment = client.get_experiment_by_name(name)  # type: ignore[attr-defined]
        if experiment is None:
            raise click.ClickException(f"no experiment named {name!r}")
        experiment_id = experiment.experiment_id
    runs = client.search_runs([experiment_id or "0"], order_by=["attributes.start_time DESC"], max_results=1)  # type: ignore[attr-defined]
    if not runs:
        raise click.ClickException(f"experiment {experiment_id or '0'} has no run: pass a RUN_ID")
    return runs[0].info.run_id


def curves(client: Any, run_id: str, metrics: Iterable[str] | None = None) -> dict[str, dict[str, list]]:
    """A run's training curves, ``{chart: {key: [(step, value), ...]}}``: each metric with its ``val_`` twin on one
    chart."""
    keys = sorted(metrics or client.get_run(run_id).data.metrics)
    charts: dict[str, dict[str, list]] = {}
    for key in keys:
        chart = key[4:] if key.startswith("val_") else key
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        charts.setdefault(chart, {})[key] = history
    return charts


def save_png(charts: dict[str, dict[str, list]], path: Path, title: str = "") -> Path:
    """The charts as a PNG, train and validation of each metric on one chart (as Studio shows them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, max(1, len(charts)))
    rows = (len(charts) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.2 * rows), squeeze=False)
    for ax, (chart, series) in zip(axes.flat, charts.items(), strict=False):
        for key, points in series.items():
            ax.plot([s for s, _ in points], [v for _, v in points], marker="o", ms=3, label=key)
        ax.set(title=chart, xlabel="epoch (step)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(charts) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


@main.command()
def doctor() -> None:
    """What this environment will do: Python, TensorFlow and Keras flavour, Horovod build, ranks, tracking URI
    (credentials masked) and whether it answers, the AzureML plugin and job mode, pending journal entries.
    Under the job's launcher (mpirun -np N hvd-mlflow doctor) rank 0 also says the world size, ranks per host
    and which host is rank 0. Exits non-zero when something will not work, saying what to do."""
    from .doctor import checks, reports

    found = checks()
    # under mpirun every rank joins the checks and rank 0 alone says what the job will do, but a rank that could not
    # join says why (its failures: they carry no warning), and its exit ends the job
    for check in found if reports() else [check for check in found if not check.ok]:
        mark = "ok " if check.ok and not check.warning else "?? " if check.ok else "!! "
        click.echo(f"{mark}{check.name:<24} {check.value}")
        if check.warning:
            click.echo(f"   {'':<24} -> {check.warning}")
        if not check.ok:
            click.echo(f"   {'':<24} -> {check.fix}")
    if not all(check.ok for check in found):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
