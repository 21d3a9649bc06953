//! Training DFlash and Domino drafters with burn, for any target the engine runs: self-distilled
//! data from the engine ([`distill`]), the base-anchored curriculum ([`train`]), export in the
//! public checkpoint formats ([`export`]) that `domino generate --draft` loads.
//!
//! The burn device is chosen at run time: [`cpu_device`] always works; with the `wgpu` cargo
//! feature, [`wgpu_device`] trains on a GPU through burn's own wgpu runtime.

pub mod cpu_target;
pub mod data;
pub mod distill;
pub mod draft;
pub mod error;
pub mod export;
pub mod feature_scale;
pub mod loss;
pub mod model;
pub mod rng;
pub mod schedule;
pub mod soft_labels;
pub mod train;
pub mod weights;

pub use error::{Result, TrainError};
pub use loss::{EvalStats, LossKind};
pub use train::{train, StepStats, TrainOptions, TrainSummary};

/// burn's pure-Rust CPU backend (Flex), with autodiff.
pub fn cpu_device() -> burn::tensor::Device {
    burn::tensor::Device::flex().autodiff()
}

/// burn's wgpu backend on the default adapter, with autodiff.
#[cfg(feature = "wgpu")]
pub fn wgpu_device() -> burn::tensor::Device {
    burn::tensor::Device::wgpu(burn::tensor::DeviceKind::DefaultDevice).autodiff()
}
