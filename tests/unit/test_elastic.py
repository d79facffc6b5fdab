from __future__ import annotations

from types import SimpleNamespace

from hvd_mlflow.every_rank import elastic


def named(name: str, message: str = "") -> BaseException:
    return type(name, (Exception,), {})(message)


def test_resets_as_horovod_classifies_them():
    assert elastic.is_reset(named("HorovodInternalError"))
    assert elastic.is_reset(named("HostsUpdatedInterrupt"))
    # a peer died inside fit: TensorFlow raises UnknownError from Horovod's op; Horovod's elastic run resets on it
    assert elastic.is_reset(named("UnknownError", "{{function_node __wrapped__HorovodAllreduce_grads_0}} failed"))
    assert not elastic.is_reset(named("UnknownError", "some other TensorFlow failure"))
    assert not elastic.is_reset(ValueError("HorovodAllreduce"))


def test_steps_follow_the_state_epoch_and_history_is_bounded(monkeypatch):
    monkeypatch.setattr(elastic, "HISTORY_EPOCHS", 3)
    state = SimpleNamespace(epoch=5)
    session = elastic.ElasticSession(state)
    session.fit_begins()
    assert [session.step(e) for e in (0, 1, 2)] == [5, 6, 7]  # Keras restarts at 0; the run goes on at 5
    for step in range(10):
        session.link.remember(step, 1000 + step, {"loss": float(step)})
    assert [s for s, _, _ in session.replay()] == [7, 8, 9]
    assert elastic.link(state) is session.link  # every callback of this process shares it
    session.agreed_run("run-1", owns_run=True)
    session.agreed_run(None, owns_run=False)  # a later fit that did not learn it keeps what is known
    assert (session.link.run_id, session.link.owns_run) == ("run-1", True)
