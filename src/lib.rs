//! swapmoe: a fused Mixture-of-Experts operator. Rust core with embedded CUDA kernels.
//!
//! - [`problem`]: the validated problem descriptor and the GPU workspace layout
//! - [`oracle`]: backend and kernel choice, with reasons
//! - [`tables`]: tuned tables (measured choices by shape, device and M)
//! - [`cpu`]: the rayon reference path
//! - [`cuda`]: driver, primary context, embedded modules, launchers
//! - `python` (feature `python`): the `swapmoe._core` PyO3 module

pub mod cpu;
pub mod cuda;
pub mod error;
pub mod oracle;
pub mod problem;
pub mod routing;
pub mod tables;

#[cfg(feature = "python")]
mod python;

pub use error::{Error, Result};
