//! Model description and the layer loop.
pub mod config;
