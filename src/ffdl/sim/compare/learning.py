"""Speeds learned online: each job's step-time model fitted to the step times it was seen to
take (``JobView.observed``) by ``ffdl.elastic.throughput.fit``, starting from the prior, as
the live autoscaler learns them. Policies that use it (``elastic-fit``, ``pollux-fit``) plan
on the fit and never on the family's true speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ffdl.elastic.throughput import StepObservation, ThroughputModel, fit, prior
from ffdl.sim.compare.jobs import JobView


@dataclass
class OnlineFit:
    """One fitted model per job, refitted only when the job was seen to take something new."""

    _fits: dict[str, tuple[int, StepObservation | None, ThroughputModel]] = field(
        default_factory=dict
    )

    def model(self, view: JobView) -> ThroughputModel:
        seen = view.observed
        key = (seen.count, seen.latest)
        cached = self._fits.get(view.id)
        if cached is not None and cached[:2] == key:
            return cached[2]
        model = fit(seen.each(), prior())
        self._fits[view.id] = (*key, model)
        return model

    def fitted(self) -> dict[str, tuple[int, ThroughputModel]]:
        """Per job: how many step times its latest model was fitted to, and the model."""
        return {job_id: (count, model) for job_id, (count, _, model) in self._fits.items()}
