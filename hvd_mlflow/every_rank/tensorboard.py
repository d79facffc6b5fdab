"""Keras' ``TensorBoard`` callback under Horovod, in ``fit`` calls that :func:`hvd_mlflow.autolog` patches.

Every rank runs the same ``fit`` with the same callbacks, so a ``TensorBoard`` callback on every rank puts every
rank's local values into one shared folder: in TensorBoard, the same jumping, repeated curves as N writers in MLflow.
So, for each ``fit``:

* **Rank 0's** ``TensorBoard`` writes where it was told, and shows the global values: hvd-mlflow's callback runs
  first and writes the global epoch values back into Keras' logs (batch values are global at the batches
  ``log_every_n_steps`` reduces, rank 0's own elsewhere). Once Keras' ``fit`` has called every callback's
  ``on_train_end`` (TensorBoard's closes its writers and stops its profiler), the files of its folder that this
  ``fit`` created or changed go into the run's artifacts under ``tensorboard/`` (``tensorboard/<folder name>/`` for
  each of several callbacks), as they are then on disk: an earlier run's files in a reused folder stay out. They are
  sent by the sender within ``flush_timeout`` and journaled, so ``hvd-mlflow sync`` uploads what could not be sent.
  Profiler traces (``plugins/profile/``, often hundreds of MB) are left out unless ``tensorboard_profile=True``
  (:mod:`hvd_mlflow.delivery.folder_artifacts`).
* **Other ranks** leave their ``TensorBoard`` out of the ``fit`` (one INFO line), or, with
  ``tensorboard_per_rank=True``, write into ``<log_dir>/rank-<N>/``, never beside rank 0's files. Those folders
  stay on each rank's disk (on another node rank 0 cannot see them, and a rank may still be writing when rank 0's
  ``fit`` ends): they are never uploaded.

``TensorBoard`` calls no collective, so none of this changes which collectives a rank runs (rule 2). A
``HorovodMlflowCallback`` passed by hand sees no other callback: there the user keeps TensorBoard to rank 0.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .._log import logger

ARTIFACT_ROOT = "tensorboard"
RANK_DIR = "rank-{rank}"


def is_tensorboard(callback: Any) -> bool:
    """Keras' (or tf_keras') ``TensorBoard`` callback, or a subclass of it."""
    return any(
        klass.__name__ == "TensorBoard" and klass.__module__.split(".", 1)[0] in ("keras", "tf_keras", "tensorflow")
        for klass in type(callback).__mro__
    )


def for_rank(callbacks: Sequence[Any], rank: int, per_rank: bool) -> list[Any]:
    """``callbacks`` as this rank runs them: rank 0's unchanged; elsewhere ``TensorBoard`` left out, or pointed at
    ``<log_dir>/rank-<rank>`` with ``per_rank``."""
    if rank == 0:
        return list(callbacks)
    kept = []
    for callback in callbacks:
        if not is_tensorboard(callback):
            kept.append(callback)
        elif per_rank:
            own = RANK_DIR.format(rank=rank)
            if Path(str(callback.log_dir)).name != own:  # a second fit with the same callback
                callback.log_dir = os.path.join(str(callback.log_dir), own)
            kept.append(callback)
        else:
            logger.info("hvd-mlflow: rank %d runs no TensorBoard callback (rank 0's writes the global values into "
                        "%s; tensorboard_per_rank=True keeps one folder per rank)", rank, callback.log_dir)  # fmt: skip
    return kept


def other_rank_dirs(size: int) -> tuple[str, ...]:
    """The ``rank-<N>`` sub-folders the other ranks of a world of ``size`` write into with ``per_rank``."""
    return tuple(RANK_DIR.format(rank=rank) for rank in range(1, size))


def uploads(callbacks: Iterable[Any]) -> list[tuple[str, str]]:
    """(local folder, artifact path) of each ``TensorBoard`` callback's log folder."""
    folders = list(dict.fromkeys(os.path.abspath(str(cb.log_dir)) for cb in callbacks if is_tensorboard(cb)))
    if len(folders) == 1:
        return [(folders[0], ARTIFACT_ROOT)]
    return [(folder, f"{ARTIFACT_ROOT}/{Path(folder).name}") for folder in folders]
