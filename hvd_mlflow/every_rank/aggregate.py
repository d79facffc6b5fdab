"""Turn each rank's epoch logs into global values with one collective.

Every rank packs, in one float64 vector (one part per reduction: an epoch's logs, and the logged batches that ride
along, end to end): the numeric entries of its logs in sorted key order; each value times
the number of samples it was measured on, and that number; the state of its Keras metrics (training state and
validation state, see :mod:`hvd_mlflow.every_rank.metric_state`); and a signature of all that layout (a 20-bit hash
``h`` and ``h*h``). One sum-allreduce of that vector gives every reduction:

* ``exact`` (default): each metric's result computed from its state summed over ranks: the metric of all
  ranks' samples together (AUC, precision and recall of the union, accuracy and loss over uneven shards);
  entries that come from no metric, or from a metric whose state does not add up, fall back to ``weighted``;
* ``weighted``: the mean weighted by the samples each rank saw;
* ``mean``: the unweighted mean of the ranks' values, Horovod's ``MetricAverageCallback`` semantics.

With ``spread`` keys, the same vector is all-gathered instead (still one collective) and summed on each
rank in rank order, which also gives each key's minimum and maximum over ranks.

The sums of the signature equal ``size*h`` and ``size*h*h`` only if every rank's ``h`` is the same, so every
rank checks at no extra cost that all ranks had the same keys. When they differ (or Horovod refuses vectors of
different lengths), one ``allgather_object`` of the key lists builds an error that names the keys each rank
lacks, raised on every rank: never a silent mix of different metrics, never a hang.
"""

from __future__ import annotations

import dataclasses
import numbers
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .._log import warn_once
from ..errors import MetricKeyMismatchError
from .collectives import Collectives
from .metric_state import MetricState, compute_all, spans
from .tracing import Agreement

_SIGNATURE_BITS = 20


def scalar(value: Any) -> float | None:
    """``value`` as a float when it is one number (Python, NumPy or 0-d tensor), else ``None``."""
    if isinstance(value, numbers.Real):  # bool too
        return float(value)
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        try:
            value = value.numpy()
        except Exception:  # noqa: BLE001 - not a tensor after all
            return None
    if isinstance(value, np.ndarray | np.generic) and np.size(value) == 1:
        try:
            return float(np.asarray(value, dtype=np.float64).reshape(()))
        except (TypeError, ValueError):
            return None
    return None


def numeric_entries(logs: Mapping[str, Any]) -> dict[str, float]:
    """The entries of ``logs`` that are single numbers, in sorted key order; others are warned about once."""
    out: dict[str, float] = {}
    for key in sorted(logs):
        value = scalar(logs[key])
        if value is None:
            warn_once(
                f"non-scalar:{key}",
                "hvd-mlflow: log entry %r is not a single number (%s); it is not reduced nor logged",
                key,
                type(logs[key]).__name__,
            )
            continue
        out[key] = value
    return out


def key_signature(keys: Iterable[str]) -> float:
    """A hash of the key list that survives a float64 sum exactly."""
    digest = zlib.crc32("\x00".join(keys).encode("utf-8"))
    return float(digest & ((1 << _SIGNATURE_BITS) - 1))


def mismatch_message(key_lists: list[list[str]]) -> str:
    """Name, per rank, the keys that some other rank has and this one lacks."""
    union = sorted(set().union(*map(set, key_lists)))
    lines = [
        "hvd-mlflow: ranks reported different metric keys at epoch end, so they cannot be combined "
        "(every rank must compile the same metrics and pass the same validation data)."
    ]
    for rank, keys in enumerate(key_lists):
        lacking = [k for k in union if k not in keys]
        if lacking:
            lines.append(f"  rank {rank} lacks: {', '.join(lacking)}")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Part:
    """One reduction's share of a collective: a rank's values, the metric states they come from, what rides along
    (summed over ranks) and the result keys whose state does not add up."""

    values: Mapping[str, float]
    states: Sequence[MetricState] = ()
    carry: Mapping[str, float] = dataclasses.field(default_factory=dict)
    not_additive: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class Reduced:
    """One part's global values, and what every rank reads back with them."""

    values: dict[str, float]
    spread: dict[str, float]  # "<key>_rank_min"/"_rank_max" of the spread keys
    carried: dict[str, float]  # the sums over ranks of what each rank carried
    carried_per_rank: dict[str, list[float]]  # in gather mode: each rank's own
    train_samples: float | None  # training samples over all ranks, if known
    inexact: set[str]  # with exact: keys whose value is the weighted mean


@dataclasses.dataclass(frozen=True)
class _Packed:
    keys: list[str]
    states: list[MetricState]
    layout: list[str]
    vector: np.ndarray


class Reducer:
    """Global values of every rank's epoch logs, by ``mode`` (one of :data:`hvd_mlflow.config.REDUCTIONS`, which
    :class:`hvd_mlflow.config.Options` checks)."""

    def __init__(self, collectives: Collectives, mode: str = "exact", spread: Sequence[str] = (), gather: bool = False):
        self._comm = collectives
        self.mode = mode
        self.spread_keys = tuple(spread)
        self._gather_rows = gather or bool(self.spread_keys)  # one row per rank from the collective: an allgather
        self.agreement = Agreement()  # compiled results from summed states, once agreed (tracing.py)

    def reduce_all(self, parts: Sequence[Part], tag: str) -> list[Reduced]:
        """Every part's global values (``.values``), with what every rank reads back from the same collective; one
        collective for all the parts (their vectors end to end, then one signature of the whole layout: every rank
        reads it at the same place); ``tag`` names it (the same on every rank). A part's ``carry``: more numbers
        summed over ranks (``.carried``), e.g. rank 0's optimizer step, which the others carry as 0: a value every
        rank then agrees on. Its ``not_additive``: result keys (with their prefix) that come from a state that does
        not add up: weighted, never computed from the sum. An epoch's part comes last, after the logged batches
        kept until the epoch's end.

        Example::

            [reduced] = Reducer(collectives.Solo()).reduce_all([Part({"loss": 0.25})], tag="epoch")
            reduced.values  # {"loss": 0.25}
        """
        if self._comm.logs_are_global:
            parts = [self._with_own_values(part) for part in parts]
        packed = [self._pack(part) for part in parts]
        keys = [k for p in packed for k in p.keys]
        layout = [item for i, p in enumerate(packed) for item in ([*p.layout] if i == 0 else ["|", *p.layout])]
        signature = key_signature(layout)
        vector = np.concatenate([*(p.vector for p in packed), [signature, signature * signature]])
        if self._comm.size == 1:
            total, per_rank = vector, vector[None, :]
        else:
            try:
                if self._gather_rows:
                    total, per_rank = self._gather(vector, keys, layout, tag)
                else:
                    total, per_rank = self._comm.allreduce_sum(vector, name=f"hvd_mlflow.{tag}"), None
            except Exception as error:
                # Horovod refuses vectors of different lengths on every rank alike ("Mismatched ..."), and so does
                # tf.distribute ("Shape mismatch"): then, and only then, every rank gathers the layouts to say which
                # keys differ. Any other error (an elastic reset, a failure of this rank alone) is raised as it is:
                # no rank calls a collective alone.
                if "Mismatched" in str(error) or "Shape mismatch" in str(error):
                    self._raise_if_layouts_differ(keys, layout, tag)
                raise
        size = self._comm.size
        if total[-2] != size * signature or total[-1] != size * signature * signature:
            self._raise_if_layouts_differ(keys, layout, tag)
        slices = spans(p.vector.size for p in packed)
        # from this collective on (every rank reads the same sums of the last part's carry), compiled if all were
        # ready (tracing.READY_KEY; a carry without it changes nothing)
        carry, end = list(parts[-1].carry), slices[-1].stop
        self.agreement.learn(dict(zip(carry, total[end - len(carry) : end].tolist(), strict=True)), size)
        # exact: every part's results from its summed states, all together (the states of one model)
        computed: list[dict[str, float]] = []
        if self.mode == "exact":
            states = [state for pack in packed for state in pack.states]
            summed = [total[p_at][s] for p, p_at in zip(packed, slices, strict=True) for s in _state_spans(p)]
            agreed = self.agreement
            computed = compute_all(states, summed, compiled=agreed.compiled, healthy=agreed.healthy) if states else []
        owns = spans(len(pack.states) for pack in packed)  # each part's share of ``computed``
        return [
            self._unpack(part, pack, total[at], per_rank[:, at] if per_rank is not None else None, computed[own])
            for part, pack, at, own in zip(parts, packed, slices, owns, strict=True)
        ]

    def _with_own_values(self, part: Part) -> Part:
        """``part`` with this rank's own values where the reduction needs them and Keras' logs hold the global ones
        (tf.distribute): every key for ``mean`` and ``weighted``, the keys of metrics whose state does not add up and
        the spread keys for ``exact``; computed from this rank's own metric states (its local copies)."""
        needed = set(part.values) if self.mode != "exact" else (set(part.not_additive) | set(self.spread_keys))
        needed &= set(part.values)
        if not needed or not part.states:
            return part
        states = list(part.states)
        own: dict[str, float] = {}
        for results in compute_all(states, [s.values for s in states], compiled=self.agreement.compiled):
            own.update(results)
        values = {k: own.get(k, v) if k in needed else v for k, v in part.values.items()}
        return dataclasses.replace(part, values=values)

    def _pack(self, part: Part) -> _Packed:
        """One part's share of the collective: its values, weighted values and samples, states, carry."""
        keys = list(part.values)
        states = list(part.states) if self.mode != "mean" else []
        samples = [_samples_for(key, states) for key in keys]
        local = np.array(list(part.values.values()), dtype=np.float64)
        pieces = [local]
        if self.mode != "mean":
            pieces += [local * samples, np.array(samples, dtype=np.float64)]
        pieces += [state.values for state in states]
        pieces += [np.array(list(part.carry.values()), dtype=np.float64)]
        layout = [*keys, self.mode, *(f"{s.prefix}:{s.values.size}" for s in states), *(f"+{k}" for k in part.carry)]
        return _Packed(keys, states, layout, np.concatenate(pieces))

    def _unpack(
        self,
        part: Part,
        pack: _Packed,
        total: np.ndarray,
        per_rank: np.ndarray | None,
        computed: list[dict[str, float]],
    ) -> Reduced:
        at = total.size - len(part.carry)
        carried = {name: float(total[at + i]) for i, name in enumerate(part.carry)}
        carried_per_rank = (
            {name: per_rank[:, at + i].tolist() for i, name in enumerate(part.carry)} if per_rank is not None else {}
        )
        if self._comm.values_are_global:  # keras.distribution on JAX: Keras' values are the global ones, alike on
            return Reduced(dict(part.values), {}, carried, carried_per_rank, None, set())  # every rank: no spread
        spread: dict[str, float] = {}
        for key in (k for k in self.spread_keys if k in part.values):
            column = per_rank[:, pack.keys.index(key)]
            spread.update({f"{key}_rank_min": float(column.min()), f"{key}_rank_max": float(column.max())})
        n, keys = len(pack.keys), pack.keys
        if self.mode == "mean":
            values = {key: float(total[i]) / self._comm.size for i, key in enumerate(keys)}
            return Reduced(values, spread, carried, carried_per_rank, None, set())
        weighted_sum, weights = total[n : 2 * n], total[2 * n : 3 * n]
        train = [i for i, key in enumerate(keys) if not key.startswith("val_")]
        train_samples = float(weights[train[0]]) if train and any(s.prefix == "" for s in pack.states) else None
        values = {
            key: float(weighted_sum[i] / weights[i]) if weights[i] else float(total[i]) / self._comm.size
            for i, key in enumerate(keys)
        }
        inexact = set(values) if self.mode == "exact" else set()  # exact: the keys no state's results give
        for results in computed:  # with exact: each state's results from its summed state
            found = {k: v for k, v in results.items() if k in values and k not in part.not_additive}
            values.update(found)
            inexact -= found.keys()
        return Reduced(values, spread, carried, carried_per_rank, train_samples, inexact)

    def _gather(
        self, vector: np.ndarray, keys: list[str], layout: list[str], tag: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """All ranks' vectors (each prefixed by its length) in one allgather: their sum, and one row per rank."""
        gathered = self._comm.allgather(np.concatenate([[float(vector.size)], vector]), name=f"hvd_mlflow.{tag}")
        rows, at = [], 0
        while at < gathered.size:
            length = int(gathered[at])
            rows.append(gathered[at + 1 : at + 1 + length])
            at += 1 + length
        if len({row.size for row in rows}) != 1:
            self._raise_if_layouts_differ(keys, layout, tag)
        per_rank = np.stack(rows)
        return per_rank.sum(axis=0), per_rank

    def _raise_if_layouts_differ(self, keys: list[str], layout: list[str], tag: str) -> None:
        try:
            gathered = self._comm.allgather_object((keys, layout), name=f"hvd_mlflow.{tag}.keys")
        except Exception as error:  # an engine that aborts every collective after a mismatch (tf.distribute)
            raise MetricKeyMismatchError(
                "hvd-mlflow: ranks reported metric layouts of different sizes at epoch end, so they cannot be "
                f"combined, and the other ranks' keys cannot be gathered ({type(error).__name__}); this rank's: "
                f"{', '.join(keys)}"
            ) from error
        if any(other_keys != keys for other_keys, _ in gathered):
            raise MetricKeyMismatchError(mismatch_message([other_keys for other_keys, _ in gathered]))
        if any(other_layout != layout for _, other_layout in gathered):
            raise MetricKeyMismatchError(
                "hvd-mlflow: ranks have the same metric keys but different metric states or reductions: "
                + "; ".join(
                    f"rank {r}: {[x for x in lay if x != '|' and x not in keys]}" for r, (_, lay) in enumerate(gathered)
                )  # fmt: skip
            )


def _state_spans(pack: _Packed) -> list[slice]:
    """Where each of a part's metric states sits in the part's share of the collective (after values, weighted
    values and samples)."""
    return spans((state.values.size for state in pack.states), start=3 * len(pack.keys))


def _samples_for(key: str, states: Sequence[MetricState]) -> float:
    """How many samples ``key``'s value was measured on (the matching state's loss count), 1 if unknown."""
    validation = key.startswith("val_")
    for state in states:
        if (state.prefix == "val_") == validation:
            return state.samples
    return 1.0
