"""Every source of one learner's evaluation metrics, started and stopped together.

The manifest's ``evaluation_metrics.type`` decides what is read besides ffdl's own
``emetrics.jsonl`` (always followed, as ``ffdl.sdk.report`` writes it): FfDL's
``evaluation-metrics.txt`` for ``emetrics``, the TensorBoard event files under ``in:`` for
``tensorboard``; the regex groups match the job's output lines whatever the type. This
module owns that choice and the promise behind it: when the type the manifest asked for
yielded nothing by the end, a ``[ffdl]`` line says so and where it looked.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from ffdl.learner import metrics
from ffdl.learner.regex_metrics import LineMatcher
from ffdl.learner.spec import LearnerSpec, host_path, learner_log_dir

if TYPE_CHECKING:
    from ffdl.learner.tensorboard import TensorBoardReader

# How often a job's TensorBoard event files are read while it runs.
TENSORBOARD_POLL_S = 0.5


class MetricSources:
    """The learner's metric readers: ``start`` before the command, ``feed`` each output
    line, ``stop`` once the command has ended (a last read of every file, then the
    "nothing found" line where one is due)."""

    def __init__(
        self,
        spec: LearnerSpec,
        on_file_metric: Callable[[metrics.EMetric], None],
        on_problem: Callable[[str], None],
    ) -> None:
        self._spec = spec
        self._on_file_metric = on_file_metric
        self._on_problem = on_problem
        self._tailers: list[metrics.EmetricsTailer] = []
        self._board: TensorBoardReader | None = None
        self._from_files = 0
        self._lines = LineMatcher(spec.metric_groups, spec.metrics_line_lookahead, on_problem)

    def start(self) -> None:
        """Start following every metrics file of this learner; what an earlier attempt
        left in them is skipped (it was reported then)."""
        paths = [self._spec.emetrics_file] if self._spec.emetrics_file else []
        log_dir = learner_log_dir(self._spec)
        if self._spec.metrics_type == "emetrics" and log_dir:
            paths.append(os.path.join(log_dir, metrics.FFDL_EMETRICS_FILE))
        for path in paths:
            tailer = metrics.EmetricsTailer(
                path, self._file_metric, self._on_problem, skip_existing=True
            )
            tailer.start()
            self._tailers.append(tailer)
        if self._spec.metrics_type == "tensorboard":
            self._board = self._start_tensorboard()

    def feed(self, line: str) -> list[metrics.EMetric]:
        """The metrics one output line of the job yields."""
        return self._lines.feed(line)

    def stop(self, *, tell: bool = True) -> None:
        """Read every file a last time and stop; with ``tell``, say when the manifest's
        metric type yielded nothing."""
        for tailer in self._tailers:
            tailer.stop()
        if self._board is not None:
            self._board.stop()
        if tell:
            self._tell_missing()

    def _file_metric(self, metric: metrics.EMetric) -> None:
        self._from_files += 1
        self._on_file_metric(metric)

    def _start_tensorboard(self) -> TensorBoardReader | None:
        """A reader of the event files under ``in:`` (default ``$LOG_DIR/tb``), started;
        None, with a line saying why, when there is nothing this learner should read."""
        from ffdl.learner import tensorboard  # the reader's imports cost half a second

        spec = self._spec
        try:
            where = tensorboard.resolve_dir(
                spec.metrics_in, spec.env, lambda path: host_path(spec, path)
            )
        except tensorboard.MetricsDirError as exc:
            self._on_problem(f"evaluation metrics (tensorboard): {exc}; no metrics are read")
            return None
        own = (learner_log_dir(spec) or "").rstrip("/") + "/"
        if spec.learner > 1 and not where.directory.startswith(own):
            # A directory outside this learner's LOG_DIR is the job's: the first learner
            # reads it, so that no metric is reported twice.
            self._on_problem(
                f"evaluation metrics (tensorboard): {where.seen} is shared; learner 1 reads it"
            )
            return None
        self._on_problem(f"evaluation metrics (tensorboard): reading scalars from {where.seen}")
        reader = tensorboard.TensorBoardReader(
            where.anchor,
            where.directory,
            self._file_metric,
            self._on_problem,
            poll_s=TENSORBOARD_POLL_S,
            seen=where.seen,
        )
        reader.start()
        return reader

    def _tell_missing(self) -> None:
        kind = self._spec.metrics_type
        if kind == "tensorboard" and self._board is not None and self._board.reported == 0:
            self._on_problem(f"evaluation metrics (tensorboard): {self._board.nothing_found()}")
        elif kind == "regex_extractor" and self._lines.matched == 0:
            names = ", ".join(repr(name) for name in self._spec.metric_groups)
            self._on_problem(
                f"evaluation metrics (regex_extractor): no output line matched the groups {names}"
            )
        elif kind == "emetrics" and self._lines.matched == 0 and self._from_files == 0:
            ours = os.path.basename(self._spec.emetrics_file or "emetrics.jsonl")
            self._on_problem(
                f"evaluation metrics (emetrics): no metrics were written to $LOG_DIR/{ours} "
                f"or $LOG_DIR/{metrics.FFDL_EMETRICS_FILE}"
            )
