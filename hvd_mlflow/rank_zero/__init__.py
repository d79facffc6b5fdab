"""What rank 0 alone does inside a Keras hook, and the one guard all of it runs in.

:mod:`.guard` is rule 1: nothing that rank 0 alone does may raise out of a hook (the other ranks would wait in
their next collective until the launcher kills the job), so each step here runs inside
``RankZeroGuard.step(...)``, which degrades (journal -> memory -> logging off) with one warning and re-raises only
under the test suite's test-mode switch. :mod:`.steps` holds those steps (the run, params and tags, the model at
the end); :mod:`.run_logger` turns global values into journal entries for the sender; :mod:`.model_logging` logs
the model.

Never calls a collective (the other ranks are not there) and never waits on the tracking server: requests are
the sender's, in :mod:`hvd_mlflow.delivery`. May import :mod:`hvd_mlflow.delivery`, :mod:`hvd_mlflow.every_rank`
and :mod:`hvd_mlflow.common`.
"""
