"""Exception classes. Every error swapmoe raises is a :class:`Error`; each subclass also
derives from the built-in exception that fits, so ``except ValueError`` keeps working."""


class Error(Exception):
    """Base class of every swapmoe error."""


class ShapeError(Error, ValueError):
    """A shape, stride, layout or index value the op cannot take."""


class DTypeError(Error, TypeError):
    """A dtype the op cannot take, or an object that is not a DLPack tensor."""


class DeviceError(Error, ValueError):
    """Tensors on different devices, or on a device swapmoe does not run on."""


class ArgumentError(Error, ValueError):
    """A bad non-tensor argument (unknown activation, conflicting options)."""


class CudaError(Error, RuntimeError):
    """A CUDA driver failure, or no usable CUDA driver."""


class OutOfMemoryError(Error, MemoryError):
    """A buffer the call needs cannot exist: a host buffer that could not be allocated (the
    CPU path's intermediate), or a CUDA workspace whose size passes 2^64 bytes
    (:func:`swapmoe.workspace_bytes`)."""


__all__ = ["Error", "ShapeError", "DTypeError", "DeviceError", "ArgumentError", "CudaError", "OutOfMemoryError"]
