//! One error type for the whole core. Each variant becomes one Python exception class
//! (see `python/swapmoe/errors.py`); messages name the argument, the expected value and
//! the value given.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A shape, stride or layout that the op cannot take (Python: `ShapeError`, a `ValueError`).
    Shape(String),
    /// A dtype that the op cannot take (Python: `DTypeError`, a `TypeError`).
    DType(String),
    /// A tensor on the wrong or an unsupported device (Python: `DeviceError`, a `ValueError`).
    Device(String),
    /// A bad scalar argument such as an unknown activation (Python: `ArgumentError`, a `ValueError`).
    Argument(String),
    /// A CUDA driver failure, or no usable driver (Python: `CudaError`, a `RuntimeError`).
    Cuda(String),
    /// A host buffer the call needs could not be allocated (Python: `OutOfMemoryError`, a
    /// `MemoryError`): the CPU path's intermediate, or a size that overflows.
    Memory(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Shape(m)
            | Error::DType(m)
            | Error::Device(m)
            | Error::Argument(m)
            | Error::Cuda(m)
            | Error::Memory(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

/// The Python exception classes of `swapmoe.errors`, in `Error::class_index` order.
pub const CLASS_NAMES: [&str; 6] = [
    "ShapeError",
    "DTypeError",
    "DeviceError",
    "ArgumentError",
    "CudaError",
    "OutOfMemoryError",
];

impl Error {
    /// The position of this error's Python class in `CLASS_NAMES`.
    pub fn class_index(&self) -> usize {
        match self {
            Error::Shape(_) => 0,
            Error::DType(_) => 1,
            Error::Device(_) => 2,
            Error::Argument(_) => 3,
            Error::Cuda(_) => 4,
            Error::Memory(_) => 5,
        }
    }

    /// The Python exception class this error is raised as.
    pub fn class_name(&self) -> &'static str {
        CLASS_NAMES[self.class_index()]
    }
}
