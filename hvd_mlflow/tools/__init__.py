"""The command line after training (or beside it): ``hvd-mlflow`` (:mod:`.cli`) and what its commands do:
``sync`` a journal (:mod:`.syncing`), ``import-csv`` a Keras CSV (:mod:`.csv_import`), ``plot`` a run
(in :mod:`.cli`), ``doctor`` (:mod:`.doctor`).

Runs in its own process, never inside ``fit``: a bad input is one line and exit status 1, never a traceback. May
import every wing (it reuses delivery's uploader and the metric names' rules), and no wing imports it.
"""
