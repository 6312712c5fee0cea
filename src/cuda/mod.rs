//! CUDA side of the core: the driver (loaded at first use; the extension links no CUDA
//! library), the device's primary context (the one torch uses), the embedded modules,
//! and the launchers. Every launch goes on the caller's stream; nothing here allocates
//! device memory or waits for the device, except the opt-in `check_ids`.

pub mod launch;

use crate::error::{Error, Result};
use crate::oracle::{DeviceCaps, KernelId};
use cudarc::driver::sys::{self, CUresult};
use std::ffi::{c_void, CStr, CString};
use std::sync::{Mutex, OnceLock};

/// The fatbins that build.rs compiled and embedded.
pub mod images {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

const MAX_DEVICES: usize = 64;

/// `SWAPMOE_CUDA_PROBE` at build time: "" for a release build (build.rs).
const PROBE_NAME: &str = env!("SWAPMOE_CUDA_PROBE_BUILD");

/// The timing probe this build was compiled as (`Some("no_mma")`: the swap kernels skip
/// their math and return wrong results on purpose), or None for a release build.
pub fn probe_build() -> Option<&'static str> {
    (!PROBE_NAME.is_empty()).then_some(PROBE_NAME)
}

/// Set to "1", lets a probe build open a device (`check_probe_build_allowed`).
const PROBE_BUILD_OK_ENV: &str = "SWAPMOE_PROBE_BUILD_OK";

/// A probe build opens no device unless `SWAPMOE_PROBE_BUILD_OK=1` says its wrong results
/// are wanted (a timing experiment), so that it cannot pass for a release wheel.
fn check_probe_build_allowed(allowed: Option<&str>) -> Result<()> {
    match probe_build() {
        Some(probe) if allowed != Some("1") => Err(Error::Device(format!(
            "this swapmoe build is a timing probe (SWAPMOE_CUDA_PROBE={probe}): its kernels skip their \
             math and return wrong results on purpose. Set {PROBE_BUILD_OK_ENV}=1 to time it, or \
             install a release build"
        ))),
        _ => Ok(()),
    }
}

/// Raw driver handles are plain pointers; the driver allows their use from any thread.
#[derive(Clone, Copy, Debug)]
struct Handle(*mut c_void);
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

pub struct DeviceState {
    pub ordinal: i32,
    ctx: Handle,
    pub caps: DeviceCaps,
    modules: Vec<(&'static str, Handle)>,
    functions: [OnceLock<Handle>; KernelId::COUNT],
}

static DEVICES: [OnceLock<DeviceState>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
static INIT_LOCK: Mutex<()> = Mutex::new(());
static DRIVER: OnceLock<std::result::Result<i32, String>> = OnceLock::new();

fn error_string(code: CUresult) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    let ok = unsafe { sys::cuGetErrorString(code, &mut p) };
    if ok == CUresult::CUDA_SUCCESS && !p.is_null() {
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    } else {
        format!("{code:?}")
    }
}

pub(crate) fn check(code: CUresult, what: &str) -> Result<()> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda(format!(
            "{what} failed: {} ({code:?})",
            error_string(code)
        )))
    }
}

/// Loads libcuda and calls cuInit once. Returns the driver's CUDA version (e.g. 13000).
/// cudarc panics when the library or a symbol is missing, so every first touch of the
/// driver is behind `catch_unwind`.
pub fn driver_version() -> Result<i32> {
    DRIVER
        .get_or_init(|| {
            let present =
                std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
            if !present {
                return Err("no CUDA driver found (libcuda.so could not be loaded)".to_string());
            }
            std::panic::catch_unwind(|| unsafe {
                let r = sys::cuInit(0);
                if r != CUresult::CUDA_SUCCESS {
                    return Err(format!("cuInit failed: {}", error_string(r)));
                }
                let mut v = 0i32;
                let r = sys::cuDriverGetVersion(&mut v);
                if r != CUresult::CUDA_SUCCESS {
                    return Err(format!("cuDriverGetVersion failed: {}", error_string(r)));
                }
                Ok(v)
            })
            .unwrap_or_else(|_| Err("the CUDA driver is missing a required function".to_string()))
        })
        .clone()
        .map_err(Error::Cuda)
}

pub fn device_count() -> Result<i32> {
    driver_version()?;
    let mut n = 0;
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n)
}

fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute, what: &str) -> Result<i32> {
    let mut v = 0;
    check(
        unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) },
        what,
    )?;
    Ok(v)
}

/// The device's state, created on first use: primary context retained for the life of
/// the process, every embedded module loaded. An ordinal out of range is blamed on
/// `hidden_states` (the op's tensors name the device).
pub fn device(ordinal: i32) -> Result<&'static DeviceState> {
    device_for(ordinal, "hidden_states")
}

/// As [`device`], with `what` (the caller's argument) named in an ordinal's range error.
pub fn device_for(ordinal: i32, what: &str) -> Result<&'static DeviceState> {
    if ordinal < 0 || ordinal as usize >= MAX_DEVICES {
        return Err(Error::Device(format!(
            "{what}: expected a CUDA device ordinal in [0, {MAX_DEVICES}), got {ordinal}"
        )));
    }
    let slot = &DEVICES[ordinal as usize];
    if let Some(d) = slot.get() {
        return Ok(d);
    }
    let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = slot.get() {
        return Ok(d);
    }
    let state = std::panic::catch_unwind(|| init_device(ordinal, what)).unwrap_or_else(|_| {
        Err(Error::Cuda(
            "the CUDA driver is missing a required function".into(),
        ))
    })?;
    let _ = slot.set(state);
    Ok(slot.get().expect("just set"))
}

fn init_device(ordinal: i32, what: &str) -> Result<DeviceState> {
    check_probe_build_allowed(std::env::var(PROBE_BUILD_OK_ENV).ok().as_deref())?;
    driver_version()?;
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::Device(format!(
            "{what}: expected a CUDA device ordinal below {count} (devices visible), got {ordinal}"
        )));
    }
    let mut dev: sys::CUdevice = 0;
    check(
        unsafe { sys::cuDeviceGet(&mut dev, ordinal) },
        "cuDeviceGet",
    )?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    check(
        unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
        "cuDevicePrimaryCtxRetain",
    )?;
    let previous = current_context()?;
    check(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")?;
    // the caller's context (none included) current again on every return
    let _current = CurrentContext {
        previous: (previous != ctx).then_some(previous),
    };
    use sys::CUdevice_attribute as A;
    let major = attribute(
        dev,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        "compute capability",
    )?;
    let minor = attribute(
        dev,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        "compute capability",
    )?;
    let sm_count = attribute(
        dev,
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        "multiprocessor count",
    )?;
    let mut name = [0 as std::ffi::c_char; 256];
    check(
        unsafe { sys::cuDeviceGetName(name.as_mut_ptr(), 256, dev) },
        "cuDeviceGetName",
    )?;
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    if major < 8 {
        return Err(Error::Device(format!(
            "hidden_states: swapmoe's CUDA kernels need compute capability >= 8.0 (sm_80), got {name} (sm_{major}{minor})"
        )));
    }
    let mut modules = Vec::new();
    for (mname, image) in images::FATBINS {
        let mut module: sys::CUmodule = std::ptr::null_mut();
        let r = unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(Error::Cuda(format!(
                "loading kernel module {mname:?} on {name} (sm_{major}{minor}) failed: {}. The wheel embeds {:?}",
                error_string(r),
                images::TARGETS
            )));
        }
        modules.push((*mname, Handle(module as *mut c_void)));
    }
    Ok(DeviceState {
        ordinal,
        ctx: Handle(ctx as *mut c_void),
        caps: DeviceCaps {
            name,
            capability: (major, minor),
            sm_count,
        },
        modules,
        functions: [const { OnceLock::new() }; KernelId::COUNT],
    })
}

fn current_context() -> Result<sys::CUcontext> {
    let mut cur: sys::CUcontext = std::ptr::null_mut();
    check(unsafe { sys::cuCtxGetCurrent(&mut cur) }, "cuCtxGetCurrent")?;
    Ok(cur)
}

/// The device's primary context made current for the life of this value; dropping it makes
/// the thread's previous context (none included) current again. The caller's state is then
/// as it was: the CUDA runtime takes its current device from the thread's context, so a call
/// on tensors of a device that is not torch's current one would otherwise move torch's
/// current device (and CuPy's) to the tensors' device. On torch's own threads the primary
/// context of the tensors' device is usually current already, and nothing is switched.
#[must_use = "the context is switched back when this is dropped"]
pub struct CurrentContext {
    /// The context to make current again, where this one switched.
    previous: Option<sys::CUcontext>,
}

impl Drop for CurrentContext {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            // Nothing to report from a drop: the only failure is a driver that lost the
            // context, which the next driver call reports.
            let _ = unsafe { sys::cuCtxSetCurrent(previous) };
        }
    }
}

impl DeviceState {
    /// Makes the primary context current on this thread until the returned value is dropped.
    pub fn make_current(&self) -> Result<CurrentContext> {
        let cur = current_context()?;
        if cur == self.ctx.0 as sys::CUcontext {
            return Ok(CurrentContext { previous: None });
        }
        check(
            unsafe { sys::cuCtxSetCurrent(self.ctx.0 as sys::CUcontext) },
            "cuCtxSetCurrent",
        )?;
        Ok(CurrentContext {
            previous: Some(cur),
        })
    }

    pub fn function(&self, id: KernelId) -> Result<sys::CUfunction> {
        let slot = &self.functions[id.index()];
        if let Some(h) = slot.get() {
            return Ok(h.0 as sys::CUfunction);
        }
        let module = self
            .modules
            .iter()
            .find(|(n, _)| *n == id.module())
            .ok_or_else(|| {
                Error::Cuda(format!(
                    "kernel module {:?} is not embedded in this build",
                    id.module()
                ))
            })?;
        let sym = CString::new(id.symbol()).expect("symbol names have no NUL");
        let mut f: sys::CUfunction = std::ptr::null_mut();
        check(
            unsafe { sys::cuModuleGetFunction(&mut f, module.1 .0 as sys::CUmodule, sym.as_ptr()) },
            &format!("looking up kernel {}", id.symbol()),
        )?;
        let big_smem = id.max_dynamic_smem_bytes();
        if let Some(bytes) = big_smem {
            // More than the default 48 KiB of dynamic shared memory must be asked for.
            let bytes = bytes as i32;
            check(
                unsafe {
                    sys::cuFuncSetAttribute(
                        f,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes,
                    )
                },
                &format!(
                    "allowing {bytes} bytes of shared memory for {}",
                    id.symbol()
                ),
            )?;
        }
        let _ = slot.set(Handle(f as *mut c_void));
        Ok(f)
    }

    /// Device address and size in bytes of the `__device__` variable `symbol` of the embedded
    /// module `module` (e.g. the stamp buffer of a `SWAPMOE_CUDA_STAMPS=1` profiling build).
    pub fn module_global(&self, module: &str, symbol: &str) -> Result<(u64, usize)> {
        let _current = self.make_current()?;
        let handle = self
            .modules
            .iter()
            .find(|(n, _)| *n == module)
            .ok_or_else(|| {
                let names: Vec<&str> = self.modules.iter().map(|(n, _)| *n).collect();
                Error::Argument(format!(
                    "module: expected one of the embedded modules {names:?}, got {module:?}"
                ))
            })?;
        let sym = CString::new(symbol).map_err(|_| {
            Error::Argument(format!(
                "symbol: expected a name without NUL bytes, got {symbol:?}"
            ))
        })?;
        let mut ptr: sys::CUdeviceptr = 0;
        let mut bytes: usize = 0;
        let r = unsafe {
            sys::cuModuleGetGlobal_v2(
                &mut ptr,
                &mut bytes,
                handle.1 .0 as sys::CUmodule,
                sym.as_ptr(),
            )
        };
        if r == CUresult::CUDA_ERROR_NOT_FOUND {
            return Err(Error::Argument(format!(
                "symbol: expected a __device__ variable of module {module:?}, got {symbol:?}, \
                 which this build does not have (profiling symbols need SWAPMOE_CUDA_STAMPS=1 at build time)"
            )));
        }
        check(r, &format!("looking up {symbol} in module {module}"))?;
        Ok((ptr as u64, bytes))
    }

    /// Resolves every kernel, so that a later CUDA-graph capture does no module work.
    pub fn warmup(&self) -> Result<usize> {
        let _current = self.make_current()?;
        let all = KernelId::all();
        for id in &all {
            self.function(*id)?;
        }
        Ok(all.len())
    }
}

/// Whether `stream` is capturing a CUDA graph.
pub fn stream_is_capturing(stream: usize) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    check(
        unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut status) },
        "cuStreamIsCapturing",
    )?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_build_opens_no_device_unless_told_to() {
        match probe_build() {
            None => {
                assert!(check_probe_build_allowed(None).is_ok());
                assert!(check_probe_build_allowed(Some("0")).is_ok());
            }
            Some(probe) => {
                for refused in [None, Some("0"), Some("yes")] {
                    let err = check_probe_build_allowed(refused).unwrap_err();
                    assert!(matches!(&err, Error::Device(m) if m.contains(probe)
                        && m.contains("SWAPMOE_PROBE_BUILD_OK=1")));
                }
                assert!(check_probe_build_allowed(Some("1")).is_ok());
            }
        }
    }
}
