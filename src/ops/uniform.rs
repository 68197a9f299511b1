//! One source for the uniform layouts: every kernel's `var<uniform>` struct has a `#[repr(C)]`
//! Rust twin declared with [`uniform_struct!`](crate::ops::uniform::uniform_struct), next to the constructor that
//! fills it. The macro lists the fields once and implements [`UniformLayout`]; a test
//! (`ops::uniform_registry`) parses every kernel with naga and checks each WGSL struct's member
//! names, offsets and size against its twin, and that no kernel's uniform is missing from the
//! registry.

/// The layout of a uniform struct as WGSL sees it: its WGSL name and its members (name, byte
/// offset), in order; the size is `size_of::<Self>()`.
pub trait UniformLayout: bytemuck::Pod {
    /// The name of the WGSL struct this type mirrors (`Params`, `Step`, `MixParams`, `Info`).
    const WGSL: &'static str;
    /// The members, in declaration order, with their byte offsets.
    fn members() -> Vec<(&'static str, u32)>;
}

/// Declares a `#[repr(C)]`, `Pod` uniform struct and its [`UniformLayout`] from one field list:
///
/// ```text
/// uniform_struct! {
///     /// WGSL twin: `struct Params` of `wgsl/add.wgsl`.
///     pub(crate) struct InPlaceUniform = "Params" { n: u32, _pad0: u32, _pad1: u32, _pad2: u32 }
/// }
/// ```
///
/// Field names must be the WGSL member names (padding members included).
macro_rules! uniform_struct {
    ($(#[$meta:meta])* $vis:vis struct $name:ident = $wgsl:literal {
        $($(#[$fmeta:meta])* $fvis:vis $field:ident : $ty:ty),* $(,)?
    }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        $vis struct $name {
            $($(#[$fmeta])* $fvis $field: $ty),*
        }

        impl $crate::ops::uniform::UniformLayout for $name {
            const WGSL: &'static str = $wgsl;
            fn members() -> Vec<(&'static str, u32)> {
                vec![$((stringify!($field), std::mem::offset_of!($name, $field) as u32)),*]
            }
        }
    };
}
pub(crate) use uniform_struct;
