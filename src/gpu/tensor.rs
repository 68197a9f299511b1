//! GPU tensors: a buffer range with a shape and an element type.
//!
//! f16 data is stored packed, two per `u32` (element 2i in the low half), and read in WGSL with
//! `unpack2x16float`: this works with or without the shader-f16 feature. A tensor of f16 with an
//! odd element count is padded to a whole `u32`.

use super::Gpu;
use crate::error::{Error, Result};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemType {
    F32,
    /// Packed pairs in `u32` words.
    F16,
    U32,
}

impl ElemType {
    /// Bytes of `n` elements as stored (f16 rounded up to whole u32 words).
    pub fn bytes(self, n: usize) -> u64 {
        match self {
            ElemType::F32 | ElemType::U32 => 4 * n as u64,
            ElemType::F16 => 4 * n.div_ceil(2) as u64,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Tensor {
    pub buffer: Arc<wgpu::Buffer>,
    /// Byte offset into `buffer`.
    pub offset: u64,
    pub shape: Vec<usize>,
    pub ty: ElemType,
}

impl Tensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Whether `other` starts at the same place of the same buffer (the same data, whatever shape
    /// each gives it).
    pub fn starts_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.buffer, &other.buffer) && self.offset == other.offset
    }
    pub fn size_bytes(&self) -> u64 {
        self.ty.bytes(self.numel())
    }
    /// A view of `shape` starting `elems` elements in (the byte offset must suit the device's
    /// storage offset alignment, 256 bytes at most, when the view is bound).
    pub fn view(&self, elems: usize, shape: &[usize]) -> Tensor {
        assert!(self.ty != ElemType::F16 || elems.is_multiple_of(2), "f16 views start on a u32 word");
        let t = Tensor {
            buffer: self.buffer.clone(),
            offset: self.offset + self.ty.bytes(elems),
            shape: shape.to_vec(),
            ty: self.ty,
        };
        assert!(t.offset + t.size_bytes() <= self.offset + self.size_bytes(), "view out of range");
        t
    }

    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.offset,
            size: std::num::NonZeroU64::new(self.size_bytes().max(4)),
        })
    }
}

const STORAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

impl Gpu {
    fn check_binding(&self, label: &str, bytes: u64) -> Result<()> {
        let max = self.limits.max_storage_buffer_binding_size;
        if bytes > max {
            return Err(Error::Gpu(format!(
                "{label}: {} MiB exceeds the device's max storage binding of {} MiB (split it by rows)",
                bytes >> 20,
                max >> 20
            )));
        }
        Ok(())
    }

    /// An uninitialized storage tensor.
    pub fn empty(&self, label: &str, shape: &[usize], ty: ElemType) -> Result<Tensor> {
        let bytes = ty.bytes(shape.iter().product()).max(4);
        self.check_binding(label, bytes)?;
        let buffer = self.scoped(&format!("allocating {label} ({} MiB)", bytes >> 20), || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes.next_multiple_of(4),
                usage: STORAGE,
                mapped_at_creation: false,
            })
        })?;
        Ok(Tensor { buffer: Arc::new(buffer), offset: 0, shape: shape.to_vec(), ty })
    }

    fn upload_bytes(&self, label: &str, shape: &[usize], ty: ElemType, bytes: &[u8]) -> Result<Tensor> {
        let t = self.empty(label, shape, ty)?;
        let mut padded;
        let data = if !bytes.len().is_multiple_of(4) {
            padded = bytes.to_vec();
            padded.resize(bytes.len().next_multiple_of(4), 0);
            &padded[..]
        } else {
            bytes
        };
        if !data.is_empty() {
            self.queue.write_buffer(&t.buffer, 0, data);
        }
        Ok(t)
    }

    pub fn upload_f32(&self, label: &str, shape: &[usize], data: &[f32]) -> Result<Tensor> {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "{label}: shape/data mismatch");
        self.upload_bytes(label, shape, ElemType::F32, bytemuck::cast_slice(data))
    }

    pub fn upload_f16(&self, label: &str, shape: &[usize], data: &[half::f16]) -> Result<Tensor> {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "{label}: shape/data mismatch");
        self.upload_bytes(label, shape, ElemType::F16, bytemuck::cast_slice(data))
    }

    pub fn upload_u32(&self, label: &str, shape: &[usize], data: &[u32]) -> Result<Tensor> {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "{label}: shape/data mismatch");
        self.upload_bytes(label, shape, ElemType::U32, bytemuck::cast_slice(data))
    }

    /// Copies `bytes` bytes at `offset` of `buffer` back to the host (submits and waits).
    pub fn read_bytes(&self, buffer: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<Vec<u8>> {
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: bytes.max(4).next_multiple_of(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buffer, offset, &staging, 0, bytes.next_multiple_of(4));
        self.queue.submit([enc.finish()]);
        let mut out = self.map_read(&staging, bytes.max(4).next_multiple_of(4))?;
        out.truncate(bytes as usize);
        Ok(out)
    }

    /// Maps the first `bytes` of a `MAP_READ` buffer whose copy was submitted, waits for the
    /// device, copies them out and unmaps.
    pub fn map_read(&self, staging: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        let slice = staging.slice(..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|_| Error::Gpu("readback callback never ran".into()))?
            .map_err(|e| Error::Gpu(format!("mapping a readback buffer: {e}")))?;
        let out = slice.get_mapped_range().map_err(|e| Error::Gpu(format!("reading a mapped buffer: {e}")))?.to_vec();
        staging.unmap();
        Ok(out)
    }

    pub fn read_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        assert_eq!(t.ty, ElemType::F32);
        let b = self.read_bytes(&t.buffer, t.offset, t.size_bytes())?;
        Ok(bytemuck::pod_collect_to_vec(&b))
    }

    pub fn read_u32(&self, t: &Tensor) -> Result<Vec<u32>> {
        assert_eq!(t.ty, ElemType::U32);
        let b = self.read_bytes(&t.buffer, t.offset, t.size_bytes())?;
        Ok(bytemuck::pod_collect_to_vec(&b))
    }

    pub fn read_f16(&self, t: &Tensor) -> Result<Vec<half::f16>> {
        assert_eq!(t.ty, ElemType::F16);
        let b = self.read_bytes(&t.buffer, t.offset, t.size_bytes())?;
        let mut v: Vec<half::f16> = bytemuck::pod_collect_to_vec(&b);
        v.truncate(t.numel());
        Ok(v)
    }
}

/// Test support shared by the unit tests and the integration tests (`tests/common` re-exports
/// it): one shared device, its kernel configurations, deterministic random inputs.
#[doc(hidden)]
pub mod test_util {
    use super::super::{Gpu, GpuOptions};
    use std::sync::OnceLock;

    static GPU: OnceLock<Gpu> = OnceLock::new();

    /// At process exit, before the shared libraries' destructors: the shared device (a static,
    /// never dropped) finishes what was submitted to it. Lavapipe compiles kernels on its queue
    /// thread as it runs them, and a test binary whose last submissions were still running when
    /// exit tore LLVM down died there (SIGSEGV or "free(): invalid pointer" after every test
    /// had passed, ~1 run in 20).
    extern "C" fn idle_at_exit() {
        if let Some(g) = GPU.get() {
            let _ = g.device.poll(wgpu::PollType::wait_indefinitely());
        }
    }

    /// The device every GPU unit test shares (lavapipe in CI). Panics with instructions when there
    /// is no adapter: GPU tests are not optional.
    pub fn gpu() -> Gpu {
        GPU.get_or_init(|| {
            let g = Gpu::new(&GpuOptions::default()).unwrap_or_else(|e| {
                panic!(
                    "GPU tests need an adapter ({e}); install lavapipe: apt-get install mesa-vulkan-drivers libvulkan1"
                )
            });
            // SAFETY: registers a plain function with no captured state; it runs once, at exit.
            unsafe { libc::atexit(idle_at_exit) };
            g
        })
        .clone()
    }

    /// The shared device in each kernel configuration it supports: as is, and with f16 and
    /// subgroups off (the fallback every kernel must have).
    pub fn gpu_variants() -> Vec<Gpu> {
        let g = gpu();
        let mut v = vec![g.clone()];
        if g.caps.f16 || g.caps.subgroups {
            v.push(g.restricted(false, false));
        }
        v
    }

    /// Deterministic pseudo-random values in [-scale, scale] (xorshift; never all zeros).
    pub fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        xorshift(seed).take(n).map(|s| ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale).collect()
    }

    /// The xorshift64 sequence from `seed` (never 0) that the tests' random data comes from.
    pub fn xorshift(seed: u64) -> impl Iterator<Item = u64> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        std::iter::repeat_with(move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        })
    }

    /// Max |a - b| and the index where it occurs.
    pub fn max_abs_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).enumerate().fold((0.0, 0), |(m, mi), (i, d)| {
            if d > m || d.is_nan() {
                (d, i)
            } else {
                (m, mi)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::gpu;
    use super::*;

    #[test]
    fn oversized_allocation_is_a_clear_error() {
        // What no device can bind fails before wgpu sees it; true out-of-memory from the driver
        // goes through `Gpu::scoped` (an error scope), which cannot be provoked on lavapipe.
        let g = gpu();
        let n = (g.limits.max_storage_buffer_binding_size / 4) as usize + 1;
        match g.empty("huge", &[n], ElemType::F32) {
            Err(Error::Gpu(m)) => assert!(m.contains("huge") && m.contains("max storage binding"), "{m}"),
            other => panic!("expected a GPU error, got {:?}", other.map(|t| t.shape)),
        }
    }

    #[test]
    fn views_read_their_range() {
        let g = gpu();
        let data: Vec<f32> = (0..256).map(|i| i as f32 * 0.5 - 3.0).collect();
        let t = g.upload_f32("t", &[4, 64], &data).unwrap();
        let row2 = t.view(128, &[1, 64]);
        assert_eq!(g.read_f32(&row2).unwrap(), data[128..192].to_vec());
    }
}
