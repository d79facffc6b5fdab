"""What a run already holds, read once when the uploader attaches to it, then kept up to date as it sends.

Used for resuming (``resume="skip"``: a point at or below its metric's last logged step is not sent again; a param
equal to the logged one is not sent, a changed one goes to a JSON artifact) and for the per-run budgets of
AzureML (the metric names and tags the run holds count against its 50 and 50).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any


@dataclasses.dataclass
class RunContents:
    last_steps: dict[str, int] = dataclasses.field(default_factory=dict)  # metric key -> its last step in the run
    params: dict[str, str] = dataclasses.field(default_factory=dict)
    tag_keys: set[str] = dataclasses.field(default_factory=set)
    skip: bool = True  # resume="skip": nothing at or below a metric's last step is sent again

    @classmethod
    def read(cls, client: Any, run_id: str, skip: bool) -> RunContents:
        """One ``get_run``: the run's metrics (their last steps), params and tag keys."""
        data = client.get_run(run_id).data
        last_steps = {m.key: m.step for m in getattr(data, "_metric_objs", [])}
        return cls(last_steps, dict(data.params), set(data.tags), skip)

    @property
    def metric_names(self) -> set[str]:
        return set(self.last_steps)

    def sent(self, points: Iterable[tuple[str, float, int, int]]) -> None:
        for key, _value, _timestamp, step in points:
            self.last_steps[key] = max(step, self.last_steps.get(key, step))

    def changed_params(self, params: dict[str, str]) -> dict[str, dict[str, str]]:
        """Params whose value differs from the logged one (MLflow cannot change a param)."""
        return {k: {"logged": self.params[k], "now": v} for k, v in params.items() if k in self.params
                and self.params[k] != v}  # fmt: skip
