"""Where a job's files live under the platform's home, and the environment its code sees."""

from __future__ import annotations

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

    def create(self, num_learners: int) -> None:
        for path in (self.data, self.results, self.checkpoints, self.state, self.home):
            path.mkdir(parents=True, exist_ok=True)
        for learner in range(1, num_learners + 1):
            self.logs(learner).mkdir(parents=True, exist_ok=True)
