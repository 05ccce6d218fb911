"""Where a job's files live under the platform's home, and the environment its code sees."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class JobDirs:
    root: Path

    @classmethod
    def of(cls, jobs_dir: Path, job_id: str) -> JobDirs:
        return cls(jobs_dir / job_id)

    @property
    def archive(self) -> Path:
        return self.root / "model.zip"

    @property
    def code(self) -> Path:
        return self.root / "code"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def home(self) -> Path:
        return self.root / "home"

    def logs(self, learner: int) -> Path:
        """A learner's own log directory on the host (its LOG_DIR, wherever the learner
        sees it: the sandbox binds it at ``state_logs``)."""
        return self.root / "logs" / f"learner-{learner}"

    @property
    def state_logs(self) -> Path:
        """``$JOB_STATE_DIR/logs``, FfDL's LOG_DIR, as a learner's command sees it."""
        return self.state / "logs"

    @property
    def result_bucket(self) -> Path:
        """FfDL's RESULT_BUCKET_DIR: holds ``<training id>``, a link to the results."""
        return self.root / "result-bucket"

    def controller(self, learner: int, attempt: int) -> Path:
        return self.root / "learners" / str(learner) / f"attempt-{attempt}"

    def writable(self, learner: int) -> list[Path]:
        """The directories a learner's sandbox may write: its job's own, its own logs."""
        return [
            self.code,
            self.results,
            self.checkpoints,
            self.state,
            self.home,
            self.logs(learner),
        ]

    def create(self, num_learners: int, owner: tuple[int, int] | None = None) -> None:
        """Make the job's directories; with an ``owner`` (uid, gid), hand them over to it.

        The job's root stays the platform's and private; the directories a learner writes
        belong to the job's uid alone (0700). The data directory is the platform's until
        a controller has staged into it, and is read-only inside the sandbox.
        """
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for path in (self.data, self.results, self.checkpoints, self.state, self.home):
            path.mkdir(parents=True, exist_ok=True)
        for learner in range(1, num_learners + 1):
            self.logs(learner).mkdir(parents=True, exist_ok=True)
        self._link_ffdl_paths(num_learners, sandboxed=owner is not None)
        if owner is None:
            return
        self.root.chmod(0o700)
        self.logs(1).parent.chmod(0o755)
        uid, gid = owner
        owned = [self.results, self.checkpoints, self.state, self.home]
        owned += [self.logs(learner) for learner in range(1, num_learners + 1)]
        for path in owned:
            os.chown(path, uid, gid, follow_symlinks=False)
            path.chmod(0o700)

    def _link_ffdl_paths(self, num_learners: int, *, sandboxed: bool) -> None:
        """RESULT_BUCKET_DIR/<training id> → the results; ``$JOB_STATE_DIR/logs``: where the
        sandbox binds the learner's logs, or without one a link to the single learner's.

        The links are relative, so a job's directory still works once its home is moved or
        restored elsewhere; a link left pointing elsewhere (an older home's absolute path)
        is made again, and so is a copy of the results a copy that followed links left in
        the link's place."""
        self.result_bucket.mkdir(mode=0o755, exist_ok=True)
        link = self.result_bucket / self.root.name
        if not _links_to(link, self.results):
            if link.is_symlink():
                link.unlink()
            elif link.is_dir():
                shutil.rmtree(link)
            link.symlink_to(os.path.relpath(self.results, link.parent))
        if self.state_logs.is_symlink() and not _links_to(self.state_logs, self.logs(1)):
            self.state_logs.unlink()
        if os.path.lexists(self.state_logs):
            return
        if not sandboxed and num_learners == 1:
            self.state_logs.symlink_to(os.path.relpath(self.logs(1), self.state_logs.parent))
        else:
            self.state_logs.mkdir(mode=0o755)


def _links_to(link: Path, target: Path) -> bool:
    return link.is_symlink() and link.resolve() == target.resolve()
