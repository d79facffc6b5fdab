from __future__ import annotations

import pytest
from mlflow.utils.validation import _validate_metric_name

from hvd_mlflow.common import compat
from hvd_mlflow.errors import HvdMlflowError
from hvd_mlflow.every_rank.names import MetricNameCollisionError, NameMap, clean


@pytest.mark.parametrize(
    "name, expected",
    [("val_loss", "val_loss"), ("acc@5", "acc_5"), ("f(1)", "f_1_"), ("précision", "précision"),
     ("a//b", "a/b"), ("/abs", "abs"), ("..", "_"), ("top 1/err:x", "top 1/err:x")],
)  # fmt: skip
def test_clean_names_are_accepted_by_mlflow(name, expected):
    if not compat.names_take_colons():  # MLflow before 2.13 refuses ':' (the oldest row: 2.12)
        expected = expected.replace(":", "_")
    assert clean(name) == expected
    _validate_metric_name(clean(name))


def test_long_names_are_cut_to_the_limit():
    assert len(clean("x" * 300)) == 250


def test_two_names_cleaning_to_one_is_an_error():
    with pytest.raises(MetricNameCollisionError, match="'a@b', 'a#b' -> 'a_b'") as raised:
        NameMap()(["a@b", "a#b", "ok"])
    assert isinstance(raised.value, HvdMlflowError)


def test_param_collisions_are_set_aside_instead_of_raised():
    names = NameMap(what="param", raise_on_collision=False)
    assert names(["a@b", "a#b", "ok", "c(1)"]) == {"ok": "ok", "c(1)": "c_1_"}
    assert names.collided == {"a@b", "a#b"}
