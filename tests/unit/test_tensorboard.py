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


def test_only_the_files_a_fit_created_or_changed_are_uploaded_never_other_ranks(tmp_path):
    import os

    def write(name, content):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)

    for name in ("train/events.old", "kept.txt", "grown.txt", "rank-1/train/events.old"):
        write(name, "before")
        os.utime(tmp_path / name, ns=(10**18, 10**18))
    before = folder_artifacts.snapshot(tmp_path)
    assert before["train/events.old"] == (6, 10**18) and len(before) == 4
    write("train/events.new", "x")
    write("grown.txt", "before and after")
    write("rank-1/train/events.new", "rank 1's")
    write("rank-10/train/events.new", "not another rank's: a world of 2")
    write("plugins/profile/run/host.xplane.pb", "trace")
    upload = folder_artifacts.FolderUpload(str(tmp_path), "tensorboard", False, before, skip=("rank-1",))
    assert folder_artifacts.changed(upload) == ["grown.txt", "rank-10/train/events.new", "train/events.new"]
    with_traces = folder_artifacts.FolderUpload(str(tmp_path), "tensorboard", True, before, skip=("rank-1",))
    listed = folder_artifacts.changed(with_traces)
    assert "plugins/profile/run/host.xplane.pb" in listed and len(listed) == 4
    (tmp_path / "grown.txt").unlink()  # gone before the upload: left out
    sent = folder_artifacts.files(tmp_path, profile=True, only=listed)
    assert [(p.relative_to(tmp_path).as_posix(), sub) for p, sub in sent] == [
        ("plugins/profile/run/host.xplane.pb", "plugins/profile/run"),
        ("rank-10/train/events.new", "rank-10/train"),
        ("train/events.new", "train"),
    ]
    assert folder_artifacts.snapshot(tmp_path / "absent") == {}
    assert tensorboard.other_rank_dirs(3) == ("rank-1", "rank-2") and tensorboard.other_rank_dirs(1) == ()
