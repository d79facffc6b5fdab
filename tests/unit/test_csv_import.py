from __future__ import annotations

import pytest

from hvd_mlflow.tools.csv_import import read_csv_logger


def test_reads_keras_csvlogger_files_skipping_na_cells(tmp_path):
    path = tmp_path / "training_metrics.csv"
    path.write_text("epoch,accuracy,loss,val_loss\n0,0.5,1.25,NA\n1,0.75,0.5,0.625\n")
    assert read_csv_logger(path) == [
        {"epoch": 0, "accuracy": 0.5, "loss": 1.25},
        {"epoch": 1, "accuracy": 0.75, "loss": 0.5, "val_loss": 0.625},
    ]


def test_a_file_without_epoch_column_is_refused_clearly(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("step,loss\n0,1.0\n")
    with pytest.raises(ValueError, match="no 'epoch' column"):
        read_csv_logger(path)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("epoch\n0\n1\n", None),  # one column: read (no metric in it), not 'Could not determine delimiter'
        ("loss\n1.0\n0.5\n", "row 1: no 'epoch' column"),  # one column, not a CSVLogger file
        ("epoch,loss\n0,1.0\n1,0.5,9\n", "row 3 has 3 fields, the header 2"),  # ragged: a row too long
        ("epoch,loss,acc\n0,1.0,0.5\n1,0.5\n", "row 3 has 2 fields, the header 3"),  # ragged: a row too short
        ("epoch;loss\n0;1.0\n1;x;2\n", "row 3 has 3 fields, the header 2"),  # another delimiter, ragged
        ("epoch,loss\nzero,1.0\n", "row 2: epoch 'zero' is not a number"),
    ],
)
def test_one_column_and_ragged_files_are_read_or_refused_naming_the_file_and_row(tmp_path, text, said):
    """A one-column or ragged CSV: read when it can be (one column), else a ValueError naming the file and the row
    (it was csv.Error 'Could not determine delimiter', or a TypeError on the list DictReader keeps a long row's
    extra cells in)."""
    path = tmp_path / "training_metrics.csv"
    path.write_text(text)
    if said is None:
        assert read_csv_logger(path) == [{"epoch": 0}, {"epoch": 1}]
        return
    with pytest.raises(ValueError) as raised:
        read_csv_logger(path)
    assert type(raised.value) is ValueError and str(raised.value).startswith(f"{path}: {said}")
