"""How autolog reads a ``fit`` call and passes its callbacks on, whatever signature the ``fit`` it wraps has.

Another tool may have replaced ``Model.fit`` by a plain ``def fit(self, *args, **kwargs)`` wrapper before
``autolog()`` (experiment trackers and users' decorators do): ``callbacks`` is then none of its parameters, and a
callback bound against that signature would never reach Keras. So a call is read against Keras' own ``fit``
signature of the flavour, found by unwrapping (``__wrapped__``), else in the flavour's ``Model`` MRO, else Keras'
documented positional order (the same in both flavours, :data:`DOCUMENTED_ORDER`); and the callbacks are passed:

* as the parameter ``callbacks`` where the ``fit`` called has one (Keras' own, a wrapper keeping its parameters);
* else by keyword where it takes ``**kwargs`` (with the arguments given positionally from ``callbacks`` on);
* else not at all: :meth:`FitCall.with_callbacks` raises :class:`CannotPass`, and autolog refuses the fit before
  it trains.

Which of these applies depends on the signatures alone, so it is the same on every rank (rule 2).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

# Keras' fit parameters in their documented positional order: Keras 3, Keras 2 and tf_keras alike up to
# validation_freq; the last three are Keras 2's and tf_keras'.
DOCUMENTED_ORDER: tuple[tuple[str, Any], ...] = (
    ("x", None), ("y", None), ("batch_size", None), ("epochs", 1), ("verbose", "auto"), ("callbacks", None),
    ("validation_split", 0.0), ("validation_data", None), ("shuffle", True), ("class_weight", None),
    ("sample_weight", None), ("initial_epoch", 0), ("steps_per_epoch", None), ("validation_steps", None),
    ("validation_batch_size", None), ("validation_freq", 1), ("max_queue_size", 10), ("workers", 1),
    ("use_multiprocessing", False),
)  # fmt: skip
CALLBACKS = "callbacks"


class CannotPass(TypeError):
    """The ``fit`` called has no parameter ``callbacks`` and no ``**kwargs``: no callback can be handed to it."""


def _own_signature(function: Callable[..., Any]) -> inspect.Signature | None:
    """``function``'s own parameters (not those of what it says it wraps); None if it has no signature."""
    try:
        return inspect.signature(function, follow_wrapped=False)
    except (TypeError, ValueError):
        return None


def _names_callbacks(signature: inspect.Signature | None) -> bool:
    parameter = signature.parameters.get(CALLBACKS) if signature is not None else None
    return parameter is not None and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)


def _takes_keywords(signature: inspect.Signature | None) -> bool:
    return signature is not None and any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())


def _documented() -> inspect.Signature:
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter("self", kind)]
    parameters += [inspect.Parameter(name, kind, default=default) for name, default in DOCUMENTED_ORDER]
    return inspect.Signature(parameters)


def keras_signature(fit: Callable[..., Any], model_class: type) -> inspect.Signature:
    """Keras' own ``fit`` signature behind ``fit`` (``model_class.fit`` as found, perhaps another tool's wrapper):
    the first in ``fit``'s ``__wrapped__`` chain that names ``callbacks``, else the first ``fit`` in
    ``model_class``'s MRO that does, else :data:`DOCUMENTED_ORDER`."""
    function: Any = fit
    seen: set[int] = set()
    while function is not None and id(function) not in seen:
        seen.add(id(function))
        signature = _own_signature(function)
        if _names_callbacks(signature):
            return signature
        function = getattr(function, "__wrapped__", None)
    for klass in model_class.__mro__:
        signature = _own_signature(klass.__dict__["fit"]) if callable(klass.__dict__.get("fit")) else None
        if _names_callbacks(signature):
            return signature
    return _documented()


class FitCall:
    """How to read and re-issue calls of one ``fit`` (``called``: the function autolog wraps).

    Example::

        plan = FitCall(Model.fit, Model)
        call = plan.bind(model, args, kwargs)
        call.arguments["callbacks"]          # what the user gave, however they gave it
        args, kwargs = call.with_callbacks([mine, *theirs])
        Model.fit(*args, **kwargs)
    """

    def __init__(self, called: Callable[..., Any], model_class: type) -> None:
        own = _own_signature(called)
        self._keras = keras_signature(called, model_class)
        if _names_callbacks(own):
            self.reads, self.passes = own, "parameter"  # Keras' own fit, or a wrapper keeping its parameters
        else:
            self.reads, self.passes = self._keras, "keyword" if _takes_keywords(own) else "none"

    def bind(self, model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> BoundFit:
        """The call ``fit(model, *args, **kwargs)`` read against the signature the arguments reach (a ``TypeError``
        for a call Keras would refuse too)."""
        return BoundFit(self, self.reads.bind(model, *args, **kwargs), model, args, dict(kwargs))


class BoundFit:
    """One ``fit`` call: its arguments by Keras' names, and the same call with other callbacks."""

    def __init__(
        self, plan: FitCall, bound: inspect.BoundArguments, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._plan, self._bound, self._model, self._args, self._kwargs = plan, bound, model, args, kwargs
        self.arguments: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = bound.signature.parameters[name].kind
            if kind == inspect.Parameter.VAR_KEYWORD:
                self.arguments.update(value)
            elif kind != inspect.Parameter.VAR_POSITIONAL:
                self.arguments[name] = value

    def with_callbacks(self, callbacks: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` of the same call with ``callbacks`` instead (the model first in ``args``); raises
        :class:`CannotPass` when the ``fit`` called cannot be handed them."""
        if self._plan.passes == "parameter":
            self._bound.arguments[CALLBACKS] = callbacks
            return tuple(self._bound.args), dict(self._bound.kwargs)
        if self._plan.passes == "none":
            raise CannotPass(
                "the fit called (another tool's wrapper of Keras' fit) has no parameter 'callbacks' and no **kwargs"
            )
        names = list(self._plan.reads.parameters)[1:]  # Keras' names after the model's
        at = names.index(CALLBACKS)
        kwargs = dict(self._kwargs)
        kwargs.update(zip(names[at:], self._args[at:], strict=False))  # given positionally from callbacks on
        kwargs[CALLBACKS] = callbacks
        return (self._model, *self._args[:at]), kwargs
