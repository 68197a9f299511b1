//! [`shared_params!`]: a family of functions whose first parameters are the same, the list
//! written once.

/// Writes functions whose parameter lists start the same: the shared parameters once, in
/// parentheses, then the functions, each with the parameters after them. Attributes (docs) and
/// visibility are kept; the written functions allow `clippy::too_many_arguments`.
///
/// ```text
/// shared_params! {
///     (gpu: &Gpu, x: &Tensor, w: &Tensor)
///
///     /// The doc of `a(gpu, x, w, eps)`.
///     pub fn a(eps: f32) -> Result<Kernel> { ... }
///
///     /// The doc of `b(gpu, x, w, eps, xs)`.
///     pub fn b(eps: f32, xs: &Tensor) -> Result<Kernel> { ... }
/// }
/// ```
macro_rules! shared_params {
    (($($p:ident: $t:ty),* $(,)?)) => {};
    (
        ($($p:ident: $t:ty),* $(,)?)
        $(#[$attr:meta])* $vis:vis fn $name:ident($($q:ident: $u:ty),* $(,)?) -> $ret:ty $body:block
        $($rest:tt)*
    ) => {
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($p: $t,)* $($q: $u),*) -> $ret $body
        $crate::ops::signature::shared_params! { ($($p: $t),*) $($rest)* }
    };
}
pub(crate) use shared_params;

#[cfg(test)]
mod tests {
    super::shared_params! {
        (a: u32, b: &[u32])

        fn sum(c: u32) -> u32 {
            a + b.iter().sum::<u32>() + c
        }

        fn product() -> u32 {
            a * b.iter().product::<u32>()
        }
    }

    #[test]
    fn functions_take_the_shared_parameters_first() {
        assert_eq!(sum(1, &[2, 3], 4), 10);
        assert_eq!(product(2, &[3, 4]), 24);
    }
}
