"""Facts every wing may read, and nothing else: which versions these are (:mod:`.compat`), what hvd-mlflow needs
besides its requirements (:mod:`.dependencies`), the job's ranks and hosts (:mod:`.topology`), and how a secret is
kept out of what is written (:mod:`.redact`).

May run anywhere (every rank, rank 0's sender thread, the command line); imports nothing of hvd-mlflow but the
top's ``errors``. Never calls a collective nor makes a request.
"""
