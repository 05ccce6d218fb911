"""Where a job's files live under the platform's home, and the environment its code sees."""

from __future__ import annotations

import os
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
        return self.root / "logs" / f"learner-{learner}"

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
