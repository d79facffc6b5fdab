from __future__ import annotations

import pytest

from hvd_mlflow.csv_import import read_csv_logger


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
