"""The batch size of a fit call, read off real tf.data pipelines and checked against the batches they yield."""

from __future__ import annotations

import numpy as np
import pytest

from hvd_mlflow.every_rank import batch_size

tf = pytest.importorskip("tensorflow")


def samples(n: int = 40):
    x = np.arange(n * 3, dtype="float32").reshape(n, 3)
    return tf.data.Dataset.from_tensor_slices((x, x[:, 0]))


def first_batch(dataset) -> int:
    """The independent truth: the leading size of the first element the pipeline yields."""
    x, _ = next(iter(dataset))
    return int(x.shape[0])


KNOWN = {
    "batch": lambda d: d.batch(16),
    "shuffle, batch, map, prefetch, repeat": lambda d: (
        d.shuffle(8).batch(16, drop_remainder=True).map(lambda x, y: (x * 2, y)).prefetch(2).repeat()
    ),
    "repeat, batch, cache, take, filter": lambda d: d.repeat().batch(7).cache().take(3).filter(lambda x, y: True),
    "parallel batch": lambda d: d.batch(8, num_parallel_calls=2),
    "padded batch": lambda d: d.padded_batch(5),
    "options, shard": lambda d: d.batch(10).with_options(tf.data.Options()).shard(2, 0),
    "batched again": lambda d: d.batch(16).unbatch().batch(4),
    "map_and_batch": lambda d: d.apply(tf.data.experimental.map_and_batch(lambda x, y: (x, y), 6)),
}
UNKNOWN = {
    "never batched": lambda d: d,
    "unbatched after": lambda d: d.batch(16).unbatch(),
    "rebatched": lambda d: d.batch(16).rebatch(4),
    "flat_map after": lambda d: d.batch(16).flat_map(lambda x, y: tf.data.Dataset.from_tensors((x, y))),
    "interleave after": lambda d: d.batch(16).interleave(lambda x, y: tf.data.Dataset.from_tensors((x, y))),
}


@pytest.mark.parametrize("pipeline", list(KNOWN))
def test_a_pipeline_s_constant_batch_is_read_off_it(pipeline):
    dataset = KNOWN[pipeline](samples())
    assert batch_size.of_dataset(dataset) == first_batch(dataset)
    assert batch_size.of_fit({"x": dataset}) == first_batch(dataset)


@pytest.mark.parametrize("pipeline", list(UNKNOWN))
def test_a_pipeline_whose_batch_cannot_be_known_gives_none_never_a_guess(pipeline):
    assert batch_size.of_dataset(UNKNOWN[pipeline](samples())) is None


def test_fit_s_batch_size_wins_and_arrays_take_keras_default():
    x = np.zeros((10, 3), "float32")
    assert batch_size.of_fit({"x": x, "batch_size": 5}) == 5
    assert batch_size.of_fit({"x": x}) == batch_size.KERAS_DEFAULT == 32
    assert batch_size.of_fit({"x": (row for row in x)}) is None  # a generator: unknown
    assert batch_size.of_fit({}) is None
