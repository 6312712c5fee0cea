"""Names the argument behind a conversion error of ``_core``.

``_core`` takes its scalar arguments as Rust types, and the conversions (PyO3) raise a bare
``TypeError`` / ``OverflowError`` / ``UnicodeEncodeError`` that does not say which argument
was wrong (``'int' object is not an instance of 'bool'``). The wrappers catch those on the
error path only and call :func:`name_bad_argument`, which finds the first argument whose
Python type or range the core cannot take and returns an :class:`ArgumentError` naming it,
the expected kind and the value given. The call's hot path is unchanged.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, NoReturn, Optional, Tuple

from .errors import ArgumentError, Error, OutOfMemoryError

I64 = (-(2**63), 2**63 - 1)
U64 = (0, 2**64 - 1)


def _is_bool(v: Any) -> bool:
    """A Python or numpy bool (numpy 1 names its type ``bool_``, numpy 2 ``bool``)."""
    t = type(v)
    return t is bool or (t.__module__ == "numpy" and t.__name__ in ("bool_", "bool"))


def _as_int(v: Any, lo_hi) -> Optional[str]:
    if type(v) is bool:
        return None  # bool is an int to Python and to the core (a numpy bool is not an index)
    try:
        i = operator.index(v)
    except TypeError:
        return "an integer"
    lo, hi = lo_hi
    if not lo <= i <= hi:
        return f"an integer in [{lo}, {hi}]"
    return None


def _as_str(v: Any) -> Optional[str]:
    if not isinstance(v, str):
        return "a str"
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return "a str that encodes as UTF-8 (no lone surrogates)"
    return None


def _as_float(v: Any) -> Optional[str]:
    if isinstance(v, (str, bytes, bytearray)):
        return "a real number"
    try:
        float(v)
    except (TypeError, ValueError, OverflowError):
        return "a real number"
    return None


def _as_int_list(v: Any) -> Optional[str]:
    # a sequence (len and indexing), as the core takes it: not a set, a dict or a generator
    if isinstance(v, (str, bytes, bytearray, dict)) or not (hasattr(v, "__len__") and hasattr(v, "__getitem__")):
        return "a list of integers"
    items = list(v)
    return "a list of integers" if any(_as_int(x, I64) for x in items) else None


def _as_str_list(v: Any) -> Optional[str]:
    if isinstance(v, str):
        return None  # one name alone is accepted where a list is (select_backend)
    if isinstance(v, (bytes, bytearray)):
        return "a list of str"
    try:
        items = list(v)
    except TypeError:
        return "a list of str"
    return "a list of str" if any(_as_str(x) for x in items) else None


def _optional(check: Callable[[Any], Optional[str]]) -> Callable[[Any], Optional[str]]:
    def wrapped(v: Any) -> Optional[str]:
        if v is None:
            return None
        why = check(v)
        return None if why is None else f"None or {why}"

    return wrapped


def _bool(v: Any) -> Optional[str]:
    return None if _is_bool(v) else "a bool"


_i64 = lambda v: _as_int(v, I64)  # noqa: E731
_u64 = lambda v: _as_int(v, U64)  # noqa: E731

#: What each scalar argument of ``_core``'s functions must be, by name (``num_tokens`` as
#: select_experts takes it; select_backend's is required: ``SELECT_BACKEND_KINDS``).
KINDS: Dict[str, Callable[[Any], Optional[str]]] = {
    # fused_experts / fused_moe / select_experts
    "activation": _as_str,
    "apply_router_weight_on_input": _bool,
    "global_num_experts": _i64,
    "check_ids": _bool,
    "stream": _u64,
    "backend": _optional(_as_str),
    "use_fp8_w8a8": _bool,
    "per_channel_quant": _bool,
    "block_shape": _optional(_as_int_list),
    "topk": _i64,
    "renormalize": _bool,
    "scoring": _as_str,
    "num_expert_group": _optional(_i64),
    "topk_group": _optional(_i64),
    "routed_scaling_factor": _as_float,
    "num_tokens": _optional(_i64),
    # select_backend
    "num_experts": _i64,
    "top_k": _i64,
    "hidden_size": _i64,
    "intermediate_size": _i64,
    "dtype": _as_str,
    "device_name": _optional(_as_str),
    "quant": _optional(_as_str),
    "external_backends": _as_str_list,
    "activation_scales": _optional(_as_str),
}
SELECT_BACKEND_KINDS: Dict[str, Callable[[Any], Optional[str]]] = {"num_tokens": _i64}


def name_bad_argument(err: BaseException, args: Dict[str, Any],
                      kinds: Optional[Dict[str, Callable[[Any], Optional[str]]]] = None) -> BaseException:
    """The :class:`ArgumentError` for the first of ``args`` (name -> value) that the core
    cannot convert, chained to ``err``; ``err`` itself when it is a swapmoe error or no
    argument is to blame (a tensor's own ``__dlpack__`` failing, say). ``kinds`` overrides
    :data:`KINDS` for names that mean another kind in this call."""
    if isinstance(err, Error):
        return err
    for name, value in args.items():
        check = (kinds or {}).get(name) or KINDS.get(name)
        try:
            why = check(value) if check else None
        except Exception as e:  # noqa: BLE001  (the value's own __iter__/__index__ failed)
            why = f"a value the core can read ({type(e).__name__} while reading it)"
        if why:
            bad = ArgumentError(f"{name}: expected {why}, got {shown(value)}")
            bad.__cause__ = err
            return bad
    return err


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` for a message, at most ``limit`` characters, and never an exception of
    its own (a huge int, a failing ``__repr__``), with the type's name."""
    try:
        if isinstance(value, int) and value.bit_length() > 256:
            text = f"<an int of {value.bit_length()} bits>"  # repr may refuse (4300 digits)
        else:
            text = repr(value)
    except Exception:  # noqa: BLE001
        text = "<unprintable>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{text} ({type(value).__name__})"


CONVERSION_ERRORS = (TypeError, OverflowError, UnicodeEncodeError)


def quant_name(use_fp8_w8a8: Any, per_channel_quant: Any, block_shape: Any) -> Optional[str]:
    """The workspace's quantization scheme, as ``workspace_bytes`` names it, from the op's FP8
    arguments (the core validates them): the torch and the DLPack paths both size with it."""
    if not use_fp8_w8a8:
        return None
    if block_shape is not None:
        return "fp8_block128"
    return "fp8_channel" if per_channel_quant else "fp8_tensor"


def routing_shape(gating_shape: Any, topk: int) -> tuple:
    """(M, columns) of the [M, topk] router outputs a wrapper allocates for logits of shape
    ``gating_shape``: at most E columns (and none for a malformed shape), so that a topk past
    E is the core's error to name, not an allocation's."""
    two_d = len(gating_shape) == 2
    return (gating_shape[0] if two_d else 0), max(min(int(topk), gating_shape[1] if two_d else 0), 0)


def raise_named(err: BaseException, args: Dict[str, Any],
                kinds: Optional[Dict[str, Callable[[Any], Optional[str]]]] = None) -> NoReturn:
    """Raises :func:`name_bad_argument`'s error for ``err`` (``err`` itself, unchanged, where
    no argument is to blame). For the ``except CONVERSION_ERRORS`` clauses of the wrappers;
    ``args`` may be the wrapper's ``locals()``: only the names in :data:`KINDS` are checked,
    in order, so its parameters come before anything it computed."""
    bad = name_bad_argument(err, args, kinds)
    if bad is err:
        raise err
    raise bad from err


def host_router_outputs(empty: Callable[..., Any], float32: Any, int32: Any, m: int, k: int) -> Tuple[Any, Any]:
    """The router's [m, k] weights (float32) and ids (int32) in host memory, by ``empty``
    (numpy's or torch's) with those dtypes, through :func:`host_buffer`."""
    return (host_buffer(lambda: empty((m, k), dtype=float32), "topk_weights", (m, k), "float32"),
            host_buffer(lambda: empty((m, k), dtype=int32), "topk_ids", (m, k), "int32"))


def host_buffer(allocate: Callable[[], Any], what: str, shape: Any, dtype: Any) -> Any:
    """``allocate()`` of a host buffer the wrapper makes (numpy's or torch's ``empty``), with
    a failure to allocate it raised as :class:`OutOfMemoryError` naming the buffer, its
    shape and dtype (numpy raises a MemoryError of its own, torch a bare RuntimeError)."""
    try:
        return allocate()
    except MemoryError as e:
        err: BaseException = e
    except RuntimeError as e:
        if "alloc" not in str(e).lower():
            raise
        err = e
    raise OutOfMemoryError(
        f"{what}: expected a host buffer of shape {tuple(shape)} and dtype {dtype} to be allocatable, "
        f"got an allocation failure ({type(err).__name__}); split M into smaller calls"
        + (" or pass an out= of your own" if what == "out" else "")) from err

