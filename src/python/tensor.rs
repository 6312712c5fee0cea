//! DLPack in: any object with `__dlpack__` (torch, numpy, cupy, ...) becomes a `TensorDesc`.
//! The imported DLPack tensor is kept alive in `Imported` for the length of the call.

use super::to_pyerr;
use crate::error::Error;
use crate::problem::{DType, Device, TensorDesc};
use dlpark::ffi::{DLDataTypeCode, DLDeviceType};
use dlpark::python::{from_dlpack, DlpackStream, ImportedDlpack, StreamArg};
use pyo3::exceptions::{PyException, PyMemoryError, PyTypeError};
use pyo3::prelude::*;
use std::ffi::c_void;

/// The consumer stream handed to producers: the stream the op will launch on.
///
/// Contract: the inputs are ready on `stream`. The Python shim always passes the
/// producing library's *current* stream (torch's or cupy's), on which the inputs are
/// already ordered, so CUDA producers are asked for no synchronization (`stream=-1`).
/// That saves an event record and wait per tensor, and keeps the import legal during
/// CUDA-graph capture.
pub struct ConsumerStream;

unsafe impl DlpackStream for ConsumerStream {
    fn as_python_arg(&self, _py: Python<'_>, device: dlpark::ffi::DLDevice) -> PyResult<StreamArg> {
        if device.device_type == DLDeviceType::CUDA {
            Ok(dlpark::python::consumer::stream::no_sync())
        } else {
            Ok(dlpark::python::consumer::stream::none())
        }
    }

    unsafe fn wait_for_producer(
        &self,
        _device: dlpark::ffi::DLDevice,
        _producer: *mut c_void,
    ) -> PyResult<bool> {
        // See the contract above: the data is already ordered on the launch stream.
        Ok(true)
    }
}

pub struct Imported {
    /// The DLPack import that keeps the memory alive; None for a view into a buffer that
    /// another `Imported` of the same call keeps alive (`Imported::view`).
    _owner: Option<ImportedDlpack>,
    pub desc: TensorDesc,
}

impl Imported {
    /// A tensor carved out of memory another import of the same call owns (the router's
    /// outputs inside a caller's workspace). The caller keeps that import alive as long.
    pub fn view(desc: TensorDesc) -> Self {
        Imported { _owner: None, desc }
    }
}

fn dtype_of(code: DLDataTypeCode, bits: u8, lanes: u16) -> DType {
    match (code, bits, lanes) {
        (DLDataTypeCode::FLOAT, 32, 1) => DType::F32,
        (DLDataTypeCode::FLOAT, 16, 1) => DType::F16,
        (DLDataTypeCode::BFLOAT, 16, 1) => DType::BF16,
        (DLDataTypeCode::INT, 32, 1) => DType::I32,
        (DLDataTypeCode::INT, 64, 1) => DType::I64,
        // kDLFloat8_e4m3fn (DLPack 1.1); torch exports float8_e4m3fn with it.
        (c, 8, 1) if c.0 == 10 => DType::F8E4M3,
        (c, b, _) => DType::Other(c.0, b),
    }
}

/// Imports `obj` (argument `name`) through DLPack.
pub fn import(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Imported> {
    let consumer = ConsumerStream;
    let py = obj.py();
    let imported = match from_dlpack(obj.as_borrowed(), Some(&consumer), None) {
        Ok(t) => t,
        Err(err) => {
            if !obj.hasattr("__dlpack__")? {
                return Err(to_pyerr(
                    py,
                    Error::DType(format!(
                        "{name}: expected a tensor that supports DLPack (torch, numpy, cupy, ...), got {}",
                        obj.get_type().name()?
                    )),
                ));
            }
            // Older producers (numpy 2.0) reject the keyword arguments: import a plain capsule.
            let retry = if err.is_instance_of::<PyTypeError>(py) {
                obj.call_method0("__dlpack__")
                    .and_then(|c| from_dlpack(c.as_borrowed(), None, None))
            } else {
                Err(err)
            };
            retry.map_err(|e| {
                // An interrupt, an exit or a failed allocation inside the producer's
                // __dlpack__ is not the tensor's fault: it goes up as it was raised.
                if !e.is_instance_of::<PyException>(py) || e.is_instance_of::<PyMemoryError>(py) {
                    return e;
                }
                // The producer's first line says why; the rest (torch appends its C++
                // stack) stays on the chained original.
                let text = e.to_string();
                let why = text.lines().next().unwrap_or_default();
                let err = to_pyerr(
                    py,
                    Error::DType(format!(
                        "{name}: the tensor could not be imported through DLPack: {why}"
                    )),
                );
                err.set_cause(py, Some(e));
                err
            })?
        }
    };
    let desc = {
        let t = imported.validate().map_err(|e| {
            to_pyerr(
                py,
                Error::Shape(format!("{name}: invalid DLPack tensor: {e}")),
            )
        })?;
        let dt = t.dtype();
        let dev = t.device();
        let device = match dev.device_type {
            DLDeviceType::CPU => Device::Cpu,
            DLDeviceType::CUDA => Device::Cuda(dev.device_id),
            other => Device::Other(other.0, dev.device_id),
        };
        let strides = t
            .strides_or_compact()
            .map_err(|e| {
                to_pyerr(
                    py,
                    Error::Shape(format!("{name}: invalid DLPack strides: {e}")),
                )
            })?
            .into_owned();
        TensorDesc {
            dtype: dtype_of(dt.code, dt.bits, dt.lanes),
            shape: t.shape().to_vec(),
            strides,
            device,
            addr: t.data_ptr() as usize + t.byte_offset() as usize,
            read_only: imported.flags().contains(dlpark::DlpackFlags::READ_ONLY),
        }
    };
    Ok(Imported {
        _owner: Some(imported),
        desc,
    })
}
