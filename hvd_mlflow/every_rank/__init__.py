"""What every rank runs inside ``fit``'s Keras hooks, and everything that decides which collectives a rank calls.

The fit's plan agreed at train begin (:mod:`.fit_plan`), the batch clock (:mod:`.batch_steps`), the metric states
and their exact results (:mod:`.metric_state`), the one collective per epoch and, with logged batches, per ~100
optimizer steps (:mod:`.aggregate` over :mod:`.collectives`), what rides in it (:mod:`.epoch_exchange`,
:mod:`.divergence`, :mod:`.system_metrics`), metric names (:mod:`.names`), empty shards (:mod:`.shards`), elastic state
(:mod:`.elastic`), the Keras flavour (:mod:`.keras_flavour`), which rank's TensorBoard runs (:mod:`.tensorboard`)
and the run's params read from the model (:mod:`.run_params`).

Rule 2 lives here: every decision that changes which collectives a rank calls is derived from what Keras passes
to every rank alike, or agreed in a collective; never from one rank's optimizer state, clock, files or server
answers. An error raised here is raised on every rank at the same point. Imports only :mod:`hvd_mlflow.common`
and the top's leaves (``config``, ``errors``, ``_log``, ``_version``): nothing of rank 0's logging or of delivery,
so nothing here can wait on the tracking server.
"""
