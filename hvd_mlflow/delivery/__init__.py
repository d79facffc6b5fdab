"""Everything that talks to MLflow: what runs on rank 0's sender thread or after training, never on the training
thread's critical path.

The durable journal (:mod:`.journal`), the sender thread (:mod:`.sender`) and the uploader that turns journal
entries into requests (:mod:`.uploader`: the run's creation, what it holds and its end :mod:`.run_lifecycle`, a
refused entry's isolation :mod:`.isolation`, AzureML's budgets :mod:`.metric_names`,
:mod:`.params_tags`, the server's answers :mod:`.server_answers`, with the limits
:mod:`.limits`, :mod:`.metric_budget`, :mod:`.batching`), where to log
(:mod:`.destination`), which files of a folder become artifacts (:mod:`.folder_artifacts`), and the user's own
MLflow calls on every rank: rank 0's pass, the others get MLflow's entities without a request
(:mod:`.mlflow_calls`, :mod:`.stand_ins`).

Never calls a Horovod collective and decides none: imports only :mod:`hvd_mlflow.common` and the top's
leaves (``config``, ``errors``, ``_log``, ``_version``), never :mod:`hvd_mlflow.every_rank` nor
:mod:`hvd_mlflow.rank_zero`. A failure here reaches the training thread only as a state the guard reads
(:mod:`hvd_mlflow.rank_zero.guard`).
"""
