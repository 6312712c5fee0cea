//! DLPack in: any object with `__dlpack__` (torch, numpy, cupy, ...) becomes a `TensorDesc`.
//! The imported DLPack tensor is kept alive in `Imported` for the length of the call.

use super::to_pyerr;
use crate::error::Error;
use crate::problem::{DType, Device, TensorDesc};
use dlpark::ffi::{DLDataTypeCode, DLDeviceType};
use dlpark::python::{from_dlpack, DlpackStream, ImportedDlpack, StreamArg};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use std::ffi::c_void;

/// The consumer stream handed to producers: the stream the op will launch on. Producers
/// whose current stream is that one (torch's current stream) need no synchronization.
pub struct ConsumerStream(pub usize);

unsafe impl DlpackStream for ConsumerStream {
    fn as_python_arg(&self, _py: Python<'_>, device: dlpark::ffi::DLDevice) -> PyResult<StreamArg> {
        if device.device_type == DLDeviceType::CUDA {
            Ok(dlpark::python::consumer::stream::cuda(
                self.0 as *mut c_void,
            ))
        } else {
            Ok(dlpark::python::consumer::stream::none())
        }
    }

    unsafe fn wait_for_producer(
        &self,
        device: dlpark::ffi::DLDevice,
        producer: *mut c_void,
    ) -> PyResult<bool> {
        // Same stream (or a CPU tensor): already ordered. Otherwise let the producer's
        // Python protocol order its stream before ours.
        Ok(device.device_type != DLDeviceType::CUDA || producer as usize == self.0)
    }
}

pub struct Imported {
    _owner: ImportedDlpack,
    pub desc: TensorDesc,
}

fn dtype_of(code: DLDataTypeCode, bits: u8, lanes: u16) -> DType {
    match (code, bits, lanes) {
        (DLDataTypeCode::FLOAT, 32, 1) => DType::F32,
        (DLDataTypeCode::FLOAT, 16, 1) => DType::F16,
        (DLDataTypeCode::BFLOAT, 16, 1) => DType::BF16,
        (DLDataTypeCode::INT, 32, 1) => DType::I32,
        (DLDataTypeCode::INT, 64, 1) => DType::I64,
        (c, b, _) => DType::Other(c.0, b),
    }
}

/// Imports `obj` (argument `name`) through DLPack.
pub fn import(name: &str, obj: &Bound<'_, PyAny>, stream: usize) -> PyResult<Imported> {
    let consumer = ConsumerStream(stream);
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
                to_pyerr(
                    py,
                    Error::DType(format!(
                        "{name}: the tensor could not be imported through DLPack: {e}"
                    )),
                )
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
        _owner: imported,
        desc,
    })
}
