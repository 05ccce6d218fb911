"""A platform whose learners run as on a machine of their own, for tests (run as
``python -m tests.learner.remote_node --home H --port P --work-root W --checkpoints C``).

Its backend is the local one, except that each learner is first moved the way the Ray
backend moves it onto a node: the spec rebased from the platform's home onto the node's work
root, the code fetched through the API with the job token and unpacked there, the results
sent back through the API (``results_via_api``) and checkpoints kept in a ``file://`` store
beside both. The controller itself runs unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import uvicorn

from ffdl.backends.base import Handle, LaunchRequest
from ffdl.backends.local import LocalBackend, LocalConfig
from ffdl.core.archive import unpack_archive
from ffdl.learner.remote_files import fetch_code
from ffdl.learner.spec import ObjectLocation, rebase_spec
from ffdl.server.app import create_app
from ffdl.server.settings import Settings

CHECKPOINT_SYNC_S = 0.2


class NodeBackend(LocalBackend):
    def __init__(self, config: LocalConfig, home: Path, work_root: Path, checkpoints: Path):
        super().__init__(config)
        self._home = home
        self._work_root = work_root
        self._checkpoints = checkpoints

    def launch(self, request: LaunchRequest) -> Handle:
        spec = rebase_spec(request.spec, str(self._home), str(self._work_root))
        code = Path(spec.workdir)
        if not code.exists():
            archive = code.parent / "model.zip"
            fetch_code(spec.api_url, spec.job_token, spec.training_id, str(archive))
            unpack_archive(archive, code)
        for name in ("RESULT_DIR", "LOG_DIR", "CHECKPOINT_DIR", "HOME", "DATA_DIR"):
            Path(spec.env[name]).mkdir(parents=True, exist_ok=True)
        spec = dataclasses.replace(
            spec,
            results_via_api=True,
            results_target=None,
            checkpoint_store=ObjectLocation(f"file://{self._checkpoints}/{spec.training_id}", {}),
            checkpoint_sync_s=CHECKPOINT_SYNC_S,
        )
        return super().launch(dataclasses.replace(request, spec=spec))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.learner.remote_node")
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--work-root", type=Path, required=True)
    parser.add_argument("--checkpoints", type=Path, required=True)
    args = parser.parse_args()
    settings = Settings.load(args.home, port=args.port)
    config = settings.backend_config()
    assert isinstance(config, LocalConfig)
    backend = NodeBackend(config, settings.home, args.work_root, args.checkpoints)
    app = create_app(settings, backend)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
