"""Arrays on the wire: the dtypes that travel and the numpy/torch views over them.

Decoded arrays are numpy views over frame buffers; bfloat16 travels as ml_dtypes.bfloat16 and
becomes torch.bfloat16 through an int16 view, so no conversion copies the payload. ml_dtypes is
imported when a bfloat16 array first travels: its import costs about a second of CPU, which a
process that moves no bfloat16 (a scorer, the hub, anything on fp32 weights) never pays.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

from grpo_stream.protocols.errors import ProtocolError

if TYPE_CHECKING:
    import torch

Array: TypeAlias = npt.NDArray[Any]
"""An n-dimensional array field: one raw frame on the wire, dtype and shape in the header."""


BFLOAT16 = "bfloat16"


@functools.cache
def _numpy_dtypes() -> dict[str, np.dtype[Any]]:
    """The wire's dtypes that numpy has itself, by name, little-endian."""
    names = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
    names += ["float16", "float32", "float64"]
    return {name: np.dtype(name).newbyteorder("<") for name in names}


@functools.cache
def _numpy_names() -> dict[np.dtype[Any], str]:
    # dtype.name is a slow Python property; encode looks dtypes up here instead.
    return {dtype: name for name, dtype in _numpy_dtypes().items()}


@functools.cache
def bfloat16() -> np.dtype[Any]:
    """ml_dtypes' bfloat16, imported on first use (a second of CPU: see above)."""
    import ml_dtypes

    dtype: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
    return dtype


def wire_dtype(name: str) -> np.dtype[Any] | None:
    """The numpy dtype a wire dtype name decodes to; None for a name that cannot travel."""
    return bfloat16() if name == BFLOAT16 else _numpy_dtypes().get(name)


def wire_name(dtype: np.dtype[Any]) -> str | None:
    """The wire name of a numpy dtype (a big-endian one: None); None if it cannot travel.
    An ml_dtypes bfloat16 array exists only once ml_dtypes is imported: only then is it
    compared."""
    name = _numpy_names().get(dtype)
    if name is None and "ml_dtypes" in sys.modules and dtype == bfloat16():
        return BFLOAT16
    return name


def wire_dtypes() -> dict[str, np.dtype[Any]]:
    """Every dtype name on the wire -> its numpy dtype (imports ml_dtypes for bfloat16)."""
    return {**_numpy_dtypes(), BFLOAT16: bfloat16()}


def from_torch(tensor: torch.Tensor) -> Array:
    """A CPU numpy view of a tensor (bf16 becomes ml_dtypes.bfloat16); copies only off-CPU."""
    import torch

    t = tensor.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(bfloat16())
    try:
        return t.numpy()
    except TypeError as exc:
        raise ProtocolError("bad_type", f"torch dtype {t.dtype} cannot travel") from exc


def as_numpy(value: Any) -> Array:
    """The numpy array behind an Array field value (np.ndarray or torch.Tensor)."""
    if isinstance(value, np.ndarray):
        return value
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    if torch is not None and isinstance(value, torch.Tensor):
        return from_torch(value)
    raise ProtocolError("bad_type", f"expected an array, got {type(value).__name__}")


def arrays_equal(a: Any, b: Any) -> bool:
    """Same wire dtype, shape and element bytes (NaN equals NaN bit for bit; byte order ignored)."""
    x, y = as_numpy(a), as_numpy(b)
    if x.dtype.name != y.dtype.name or x.shape != y.shape:
        return False
    little = x.dtype.newbyteorder("<")
    return bool(x.astype(little, copy=False).tobytes() == y.astype(little, copy=False).tobytes())


def to_torch(arr: Array) -> torch.Tensor:
    """A torch tensor over a decoded array (bf16 via an int16 view); copies read-only input."""
    import torch

    if not arr.flags.writeable or any(s < 0 for s in arr.strides):
        arr = np.array(arr, copy=True)
    if wire_name(arr.dtype) == BFLOAT16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)
