"""Which TensorBoard callbacks each rank runs, and which files of a log folder go into the run."""

from __future__ import annotations

from hvd_mlflow.delivery import folder_artifacts
from hvd_mlflow.every_rank import tensorboard


def _board(log_dir):
    import tensorflow as tf

    return tf.keras.callbacks.TensorBoard(log_dir=str(log_dir))


def test_other_ranks_run_no_tensorboard_or_their_own_folder(tmp_path):
    import tensorflow as tf

    board, other = _board(tmp_path / "tb"), tf.keras.callbacks.History()
    assert tensorboard.for_rank([board, other], 0, per_rank=False) == [board, other]
    assert tensorboard.for_rank([board, other], 1, per_rank=False) == [other]
    assert tensorboard.for_rank([board, other], 3, per_rank=True) == [board, other]
    assert board.log_dir == str(tmp_path / "tb" / "rank-3")
    tensorboard.for_rank([board], 3, per_rank=True)  # a second fit with the same callback: not nested again
    assert board.log_dir == str(tmp_path / "tb" / "rank-3")


def test_uploads_one_folder_at_the_root_several_by_name(tmp_path):
    one, two = _board(tmp_path / "a"), _board(tmp_path / "b")
    assert tensorboard.uploads([one]) == [(str(tmp_path / "a"), "tensorboard")]
    assert tensorboard.uploads([one, two, one]) == [(str(tmp_path / "a"), "tensorboard/a"),
                                                    (str(tmp_path / "b"), "tensorboard/b")]  # fmt: skip


def test_profiler_traces_only_when_asked(tmp_path):
    for name in ("train/events.out.tfevents.1", "validation/events.out.tfevents.2",
                 "train/plugins/profile/2026_12_01/host.xplane.pb", "top.txt"):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    without = {(p.relative_to(tmp_path).as_posix(), sub) for p, sub in folder_artifacts.files(tmp_path, profile=False)}
    assert without == {("train/events.out.tfevents.1", "train"), ("validation/events.out.tfevents.2", "validation"),
                       ("top.txt", "")}  # fmt: skip
    with_traces = {p.relative_to(tmp_path).as_posix() for p, _ in folder_artifacts.files(tmp_path, profile=True)}
    assert "train/plugins/profile/2026_12_01/host.xplane.pb" in with_traces and len(with_traces) == 4
