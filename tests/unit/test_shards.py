"""Which of a rank's shards are empty, read from fit's arguments as Keras takes them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hvd_mlflow.every_rank import shards


def test_empty_parts_from_every_form_of_fit_data():
    tf = pytest.importorskip("tensorflow")
    x, y = np.zeros((8, 3), "float32"), np.zeros(8)
    none, nothing = np.zeros((0, 3), "float32"), np.zeros(0)
    assert shards.empty_parts({"x": x, "validation_data": (x, y)}) == ()
    assert shards.empty_parts({"x": none, "validation_data": (x, y)}) == ("training",)
    assert shards.empty_parts({"x": x, "validation_data": (none, nothing)}) == ("validation",)
    assert shards.empty_parts({"x": {"a": none}, "validation_data": [{"a": none}, nothing]}) == (
        "training",
        "validation",
    )
    assert shards.empty_parts({"x": [x, x], "validation_data": ([none, none], nothing)}) == ("validation",)
    empty_dataset = tf.data.Dataset.from_tensor_slices((none, nothing)).batch(4)
    assert shards.empty_parts({"x": empty_dataset}) == ("training",)
    assert shards.empty_parts({"x": x, "validation_data": empty_dataset}) == ("validation",)
    assert shards.empty_parts({"x": tf.constant(none)}) == ("training",)
    unknown = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True)  # cardinality unknown
    assert shards.empty_parts({"x": unknown, "validation_data": unknown.repeat()}) == ()
    assert shards.empty_parts({"x": (i for i in range(3))}) == ()  # a generator is not judged
    assert shards.empty_parts({"x": x[:1], "validation_split": 0.25}) == ("training",)  # its 1 sample validates
    assert shards.empty_parts({"x": x, "validation_split": 0.25}) == ()


def test_the_message_names_each_empty_rank_and_shard():
    text = shards.message({3: ("validation",), 1: ("training", "validation")})
    assert text.endswith("  rank 1: training and validation data is empty\n  rank 3: validation data is empty")


def test_batches_differ_only_in_what_every_rank_knows():
    """keras.distribution's check: sample counts, batch sizes and steps, each compared where known."""
    even = shards.batches({"x": np.zeros((48, 2)), "validation_data": (np.zeros((24, 2)), None)}, 16)
    assert even == shards.Batches(48, 24, 16, 16)
    assert not shards.unequal([even, even])
    short = shards.batches({"x": np.zeros((40, 2)), "validation_data": (np.zeros((24, 2)), None)}, 16)
    assert shards.unequal([even, short])  # the last batches: 16 and 8
    # a given number of steps does not make the counts irrelevant: Keras 3 keeps one iterator over the epochs, and
    # the process with fewer batches ends its second epoch early
    stepped = [shards.batches({"x": np.zeros((n, 2)), "steps_per_epoch": 3}, 16) for n in (48, 64)]
    assert shards.unequal(stepped)
    assert shards.unequal([dataclasses.replace(even, steps=3), dataclasses.replace(even, steps=4)])
    # validation batches of other sizes, or other numbers of them
    assert shards.unequal([even, shards.batches({"x": np.zeros((48, 2)), "validation_batch_size": 8,
                                                 "validation_data": (np.zeros((24, 2)), None)}, 16)])  # fmt: skip
    assert shards.unequal([dataclasses.replace(even, validation_steps=n) for n in (1, 2)])
    split = [shards.batches({"x": np.zeros((n, 2)), "validation_split": 0.25}, 8) for n in (40, 40)]
    assert split[0] == shards.Batches(30, 10, 8, 8) and not shards.unequal(split)
    assert shards.unequal([even, shards.Batches(48, None, 16, 16)])  # one has validation data, the other none
    message = shards.unequal_message([even, short])
    assert "process 1: training 40, validation 24, batch size 16" in message and "drop the remainder" in message
