"""Beyond one machine: ``grader grade --ray [ADDRESS]`` grades on a Ray cluster with Ray Data.

The driver (this process) does everything but the grading, as a local run does: it streams the
dataset, validates and renders every row, resumes what an earlier run finished, and writes the
results in input order. The rows left to grade are put into Ray's object store in blocks (it
spills to disk, so any size fits) and become a Ray Dataset; ``map_batches`` sends them to
``replicas`` engine actors (:class:`GradeActor`), each holding one engine replica with
``gpus`` GPUs (vLLM's ``tensor_parallel_size``; vLLM shards the model across the GPUs Ray gives
its actor). Inside each actor is the same code a local run uses:
:class:`grader.run.executor.GradeWorker`, built from the run's plan. Each batch's
records come back to the driver as they finish and are written to the resumable log at once:
an interrupted cluster run resumes like a local one.

On a cluster every node needs grader, its dependencies and the model directory at the same
path (a shared filesystem or the same image); nothing is downloaded.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from collections.abc import Iterable, Iterator
from typing import Any, cast

from grader.errors import EXIT_ENGINE, GraderError
from grader.run.ahead import Watch
from grader.run.executor import Graded, GradeWorker, Pending
from grader.run.request import RunPlan
from grader.run.rows import Job

# Hugging Face libraries in the actors must stay offline, like this process.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class RayError(GraderError, RuntimeError):
    """The Ray cluster cannot run this job; the message says why in one line."""

    exit_code = EXIT_ENGINE


class GradeActor:
    """One engine replica: a :class:`grader.run.executor.GradeWorker` that loads the plan's
    backend once, then grades each batch of pending rows."""

    def __init__(self, plan: RunPlan) -> None:
        os.environ.update(OFFLINE)
        self.worker = GradeWorker(plan)
        self.about = json.dumps(self.worker.describe(), ensure_ascii=False, default=str)

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        pending: list[tuple[Job, str]] = [pickle.loads(b) for b in batch.column("job").to_pylist()]
        graded = self.worker.grade(pending)
        return pa.table({
            "position": pa.array([position for position, _ in graded], pa.int64()),
            "record": pa.array([pickle.dumps(record) for _, record in graded], pa.binary()),
            "about": pa.array([self.about] * len(graded), pa.string()),
        })


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail in seconds on a HOST:PORT nobody answers at: Ray 2.60's ``ray.init`` retries such an
    address for more than 8 minutes (seen here: ``--ray=127.0.0.1:1`` still waiting at 500 s)."""
    import socket

    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():  # "auto", "local", or "": Ray's own lookup, which is quick
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise RayError(f"--ray {address}: cannot connect: {exc}") from None


class RayExecutor:
    """Engine actors on a Ray cluster, fed by a Ray Data ``map_batches``.

    Args:
        address: as ``ray.init`` takes it, "" for its default (``RAY_ADDRESS``, else a running
            local instance, else a new local one).
        replicas: engine actors; None: as many as the cluster's GPUs hold.
    """

    def __init__(self, address: str, replicas: int | None = None) -> None:
        self.address, self.wanted_replicas = address, replicas
        self.resources: dict[str, float] = {}
        self.replicas = 0
        self.gpus = 0.0
        self.chunk_size = 0
        self.about: dict[str, object] | None = None
        self.started = False

    def open(self) -> None:
        try:
            import ray
        except ImportError:
            raise RayError("--ray needs Ray: pip install 'grader[ray]'") from None
        _check_reachable(self.address)
        try:
            ray.init(address=self.address or None, ignore_reinit_error=True,
                     include_dashboard=False, logging_level=logging.WARNING,
                     runtime_env={"env_vars": OFFLINE})
        except Exception as exc:  # ConnectionError, or a bad address
            raise RayError(f"--ray {self.address}: cannot connect: {exc}") from None
        self.resources = cast(Any, ray).cluster_resources()  # Ray leaves it untyped

    def choose_backend(self, name: str) -> tuple[str, str | None]:
        """``auto`` on a cluster: vLLM when it is installed and the cluster has GPUs."""
        from grader.backends import choose_cluster_backend

        if name != "auto":
            return name, None
        return choose_cluster_backend(int(self.resources.get("GPU", 0)))

    def start(self, plan: RunPlan) -> None:
        from grader.backends import backend_class

        request, backend_name = plan.request, plan.backend
        cluster_gpus = self.resources.get("GPU", 0)
        declared = backend_class(backend_name)
        settings = request.settings_for(backend_name) or declared.settings()
        # what one copy of the backend holds: vLLM's --tensor-parallel-size, transformers' one
        # GPU where its device asks for one (auto: where the cluster has them)
        gpus = float(declared.resources(settings, gpus=cluster_gpus).get("GPU", 0.0))
        replicas = self.wanted_replicas
        if replicas is None:
            replicas = max(1, int(cluster_gpus // gpus)) if gpus else 1
        if gpus * replicas > cluster_gpus:
            raise RayError(f"{replicas} engine replica(s) x {gpus:g} GPU(s) each need "
                           f"{gpus * replicas:g} GPUs; the Ray cluster has {cluster_gpus:g}")
        self.replicas, self.gpus = replicas, gpus
        self.plan = plan
        self.chunk_size = request.chunk_size or declared.default_chunk_size(settings)
        self.started = True

    def grade(self, blocks: Iterable[Pending], watch: Watch | None = None) -> Iterator[Graded]:
        """``watch`` is not heard: an actor reports per block."""
        import pyarrow as pa
        import ray
        import ray.data

        # Every block goes to the object store as it is read: the driver keeps references only.
        refs: list[Any] = [
            ray.put(pa.table({"job": pa.array([pickle.dumps(p) for p in pending], pa.binary())}))
            for pending in blocks if pending]
        if not refs:
            return
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # grader shows its own
        dataset = ray.data.from_arrow_refs(refs).map_batches(
            GradeActor, fn_constructor_kwargs={"plan": self.plan}, batch_size=self.chunk_size,
            batch_format="pyarrow", concurrency=self.replicas, num_gpus=self.gpus, num_cpus=1)
        try:
            batches: Iterable[Any] = dataset.iter_batches(batch_format="pyarrow", batch_size=None)
            for batch in batches:
                if batch.num_rows and self.about is None:
                    self.about = json.loads(batch.column("about")[0].as_py())
                yield [(position, pickle.loads(record)) for position, record in zip(
                    batch.column("position").to_pylist(), batch.column("record").to_pylist(),
                    strict=True)]
        except Exception as exc:  # an actor that died or failed to load its engine
            cause = str(exc).strip().splitlines()
            raise RayError(f"the Ray pipeline failed: {cause[-1] if cause else type(exc).__name__}") from exc

    def describe(self) -> dict[str, object]:
        about = self.about or {}
        return {"engine": about.get("engine"), "token_budget": about.get("token_budget"),
                "ray": {"address": self.address or "default", "replicas": self.replicas,
                        "gpus_per_replica": self.gpus,
                        "cluster_resources": {k: v for k, v in self.resources.items()
                                              if k in {"CPU", "GPU"}}}}

    def close(self) -> None:
        """Disconnect (a local instance this process started stops with it)."""
        try:
            import ray
        except ImportError:
            return
        if ray.is_initialized():
            ray.shutdown()
