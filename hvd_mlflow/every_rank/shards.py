"""Whether this rank's shard of ``fit``'s data is empty: found from ``fit``'s arguments on each rank, agreed at
train begin (:mod:`hvd_mlflow.every_rank.fit_plan`), so that every rank raises the same error when any rank's is.

An empty shard is a rank's own data (a dataset sharded over more ranks than it has files or samples), so it may
never decide anything on that rank alone (errors.py's contract): Keras cannot train on it nor evaluate it (Keras 3
fails in the middle of the first epoch, tf_keras before ``on_train_begin``), and that rank alone stopping leaves the
others waiting in a collective. What cannot be sized without reading it (a generator, a dataset of unknown
cardinality) is not judged here: Keras then fails on that rank alone, as without hvd-mlflow.

Under ``keras.distribution`` the processes' batches must also be alike (:class:`Batches`): JAX joins them into one
global batch. Under Horovod the ranks' training steps per epoch must be equal: each step averages the gradients
over the ranks. What each rank sees of its data is carried in the same agreement, and a difference raises
``ShardMismatchError`` on every process. Validation may differ in steps under Horovod (no collective per step).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

TRAINING, VALIDATION = "training", "validation"


def length(data: Any) -> int | None:
    """How many samples (or batches, for a dataset or a Keras ``Sequence``) ``data`` holds; None if unknown."""
    if data is None:
        return None
    if isinstance(data, Mapping):
        return length(next(iter(data.values()))) if data else None
    if isinstance(data, list | tuple):
        return length(data[0]) if data else None
    cardinality = getattr(data, "cardinality", None)
    if cardinality is not None and hasattr(data, "element_spec"):  # a tf.data.Dataset
        try:
            count = int(cardinality())
        except Exception:  # noqa: BLE001 - not sized: not judged
            return None
        return count if count >= 0 else None  # INFINITE (-1) and UNKNOWN (-2)
    shape = getattr(data, "shape", None)
    if shape is not None:
        try:
            return int(shape[0]) if len(shape) else None
        except (TypeError, ValueError, IndexError):
            return None
    try:
        return len(data)
    except Exception:  # noqa: BLE001 - a generator or an iterator: not sized
        return None


def sizes(arguments: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """How many training and validation samples (or batches) ``fit``'s bound ``arguments`` hold on this rank, after
    Keras' own ``validation_split``; None where not known (no validation, a generator)."""
    samples = length(arguments.get("x"))
    split = float(arguments.get("validation_split") or 0.0)
    if samples is not None and 0.0 < split < 1.0 and arguments.get("validation_data") is None:
        train = int(math.floor(samples * (1.0 - split)))  # Keras' own split, in both flavours
        return train, samples - train
    validation = arguments.get("validation_data")
    if isinstance(validation, list | tuple):
        validation = validation[0] if validation else None
    return samples, length(validation)


def empty_parts(arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """Which of this rank's training and validation data ``fit``'s bound ``arguments`` show to be empty."""
    train, validation = sizes(arguments)
    return tuple(part for part, n in ((TRAINING, train), (VALIDATION, validation)) if n == 0)


@dataclasses.dataclass(frozen=True)
class Batches:
    """What a rank's batches are made of, from ``fit``'s arguments and Keras' step count (None: not known). An
    engine that joins every process's batch into one global batch (``keras.distribution``) needs them alike on every
    process: the same steps, each of the same size. A given ``steps_per_epoch`` does not make the sample counts
    irrelevant: Keras 3 then keeps one iterator over the epochs, and a process whose data runs out first ends its
    epoch early. For a dataset the counts are its batches: the last one's size is not known here."""

    training: int | None = None
    validation: int | None = None
    batch_size: int | None = None
    validation_batch_size: int | None = None
    steps: int | None = None
    validation_steps: int | None = None


def batches(arguments: Mapping[str, Any], batch_size: int | None) -> Batches:
    """This rank's :class:`Batches` before Keras counts its steps (:meth:`dataclasses.replace` adds them)."""
    train, validation = sizes(arguments)
    validation_batch = arguments.get("validation_batch_size") or batch_size
    given = arguments.get("validation_steps")
    return Batches(train, validation, batch_size, validation_batch, None, int(given) if given else None)


def unequal(by_rank: Sequence[Batches]) -> bool:
    """Whether the ranks' batches differ in anything every rank knows."""
    for name in Batches.__dataclass_fields__:
        known = {getattr(b, name) for b in by_rank} - {None}
        if len(known) > 1 or (known and any(getattr(b, name) is None for b in by_rank)):
            return True
    return False


def unequal_message(by_rank: Sequence[Batches]) -> str:
    """The error every process raises alike: each one's batches, and the fix."""
    lines = [
        f"  process {rank}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in vars(b).items() if v is not None)
        for rank, b in enumerate(by_rank)
    ]
    return (
        "hvd-mlflow: keras.distribution joins every process's batch into one global batch, so every process must "
        "give batches of the same size at every step, and these processes' data differ (Keras would compute "
        "different values on each process without an error, or wait forever); give every process the same number "
        "of samples (drop the remainder when sharding), or the same steps_per_epoch from data that repeats. Raised "
        "on every process at train begin:\n" + "\n".join(lines)
    )


def unequal_steps(by_rank: Sequence[Batches]) -> bool:
    """Whether the ranks' training steps per epoch differ (each rank's Keras count; not judged where unknown)."""
    return len({b.steps for b in by_rank} - {None}) > 1


def unequal_steps_message(by_rank: Sequence[Batches]) -> str:
    """The one-line error every Horovod rank raises alike: each rank's training steps, and the fix."""
    steps = ", ".join(f"rank {rank}: {b.steps}" for rank, b in enumerate(by_rank))
    return (
        f"hvd-mlflow: the ranks' training data give different steps per epoch ({steps}), so Horovod's gradient "
        "averaging would wait at the first step one rank does not take, and the job would hang or fail without "
        "saying why; give every rank the same number of batches (equal shards: drop the remainder when sharding) "
        "or the same steps_per_epoch from data that repeats. Raised on every rank at train begin."
    )


def message(empty_by_rank: Mapping[int, tuple[str, ...]]) -> str:
    """The error every rank raises alike: which rank's shards are empty."""
    lines = [f"  rank {rank}: {' and '.join(parts)} data is empty" for rank, parts in sorted(empty_by_rank.items())]
    return (
        "hvd-mlflow: some ranks have no data to train or validate on, so they cannot take part in the training "
        "(Keras cannot fit or evaluate an empty set, and the other ranks would wait for them); shard the data so "
        "that every rank gets at least one batch (fewer ranks, or shard by sample rather than by file), or pass no "
        "validation_data. Raised on every rank at train begin:\n" + "\n".join(lines)
    )
