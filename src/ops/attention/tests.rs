use super::*;
use crate::gpu::tensor::test_util::*;
use crate::ops::rope::{inv_freq, rope_kv_write, RopeParams};
use crate::ops::StepParams;
use half::f16;

const SENTINEL: f32 = 12345.0;

/// GPU state of one layer plus its CPU mirror.
struct Layer {
    p: AttnParams,
    k: Tensor,
    v: Tensor,
    k_cpu: Vec<f16>,
    v_cpu: Vec<f16>,
    step: wgpu::Buffer,
}

impl Layer {
    fn new(gpu: &Gpu, p: AttnParams) -> Layer {
        let (k, v) = kv_cache(gpu, "cache", &p, 1).unwrap();
        let n = p.kv_heads * p.max_ctx * p.head_dim;
        Layer {
            p,
            k,
            v,
            k_cpu: vec![f16::ZERO; n],
            v_cpu: vec![f16::ZERO; n],
            step: gpu.uniform("step", &StepParams::default()),
        }
    }

    /// Runs a pass of `n` tokens at `pos` with kernels recorded for `record_t` tokens and
    /// `splits`; checks the caches bit for bit and the output against the CPU; returns the
    /// output rows.
    fn pass(
        &mut self,
        gpu: &Gpu,
        pos: usize,
        n: usize,
        record_t: usize,
        tiling: Option<Tiling>,
        seed: u64,
    ) -> Vec<f32> {
        let p = AttnParams { n_tokens: record_t, ..self.p };
        let row = p.row_stride();
        // Random rows for the whole recorded T; rows >= n must be ignored.
        let mut data = random(record_t * row, seed, 1.0);
        // Sharper softmax: larger q.
        for t in 0..record_t {
            data[t * row..][..p.heads * p.head_dim].iter_mut().for_each(|x| *x *= 3.0);
        }
        let qkv = gpu.upload_f32("qkv", &[record_t, row], &data).unwrap();
        let out_len = record_t * p.heads * p.head_dim;
        let out = gpu.upload_f32("out", &[record_t, p.heads * p.head_dim], &vec![SENTINEL; out_len]).unwrap();
        let sp = StepParams { pos: pos as u32, n_tokens: n as u32, slot: 0, _pad: 0 };
        gpu.queue.write_buffer(&self.step, 0, bytemuck::bytes_of(&sp));
        let write = kv_cache_write(gpu, &qkv, &self.k, &self.v, &self.step, p).unwrap();
        let tiling = tiling.unwrap_or_else(|| Tiling::choose(gpu, &p).unwrap());
        let attn = attention_with(gpu, &qkv, &self.k, &self.v, &out, &self.step, p, tiling, None, None).unwrap();
        let mut ks = vec![&write];
        ks.extend(attn.iter());
        gpu.run(&ks).unwrap();

        cpu::kv_cache_write(&data, &mut self.k_cpu, &mut self.v_cpu, pos, n, &p);
        assert!(gpu.read_f16(&self.k).unwrap() == self.k_cpu, "K cache differs");
        assert!(gpu.read_f16(&self.v).unwrap() == self.v_cpu, "V cache differs");

        let mut got = gpu.read_f32(&out).unwrap();
        let want = cpu::attention(&data, &self.k_cpu, &self.v_cpu, pos, n, &p, q_f16(p.head_dim));
        let valid = n * p.heads * p.head_dim;
        assert!(got[valid..].iter().all(|&x| x == SENTINEL), "rows >= n_tokens were written");
        let (diff, at) = max_abs_diff(&got[..valid], &want);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(
            diff <= 2e-5 * scale.max(1.0),
            "{p:?} {tiling:?} pos={pos} n={n}: max diff {diff} at {at} ({} vs {})",
            got[at],
            want[at]
        );
        got.truncate(valid);
        got
    }
}

/// The GPU operands of a decode step of `seqs` ((position, slot) per token, T = seqs.len()): the
/// qkv rows `data`, K and V caches `[S, Hkv, max_ctx, D]` both loaded with `cache`, the output,
/// the sequences (u32 `[T, 2]`) and the step's uniform.
struct BatchStep {
    qkv: Tensor,
    kc: Tensor,
    vc: Tensor,
    out: Tensor,
    sq: Tensor,
    step: wgpu::Buffer,
}

impl BatchStep {
    fn new(gpu: &Gpu, p: &AttnParams, data: &[f32], cache: &[f16], seqs: &[(u32, u32)]) -> BatchStep {
        let b = seqs.len();
        let slots = cache.len() / (p.kv_heads * p.max_ctx * p.head_dim);
        let shape = [slots, p.kv_heads, p.max_ctx, p.head_dim];
        let flat: Vec<u32> = seqs.iter().flat_map(|&(p, s)| [p, s]).collect();
        BatchStep {
            qkv: gpu.upload_f32("qkv", &[b, p.row_stride()], data).unwrap(),
            kc: gpu.upload_f16("k", &shape, cache).unwrap(),
            vc: gpu.upload_f16("v", &shape, cache).unwrap(),
            out: gpu.empty("out", &[b, p.heads * p.head_dim], ElemType::F32).unwrap(),
            sq: gpu.upload_u32("seqs", &[b, 2], &flat).unwrap(),
            step: gpu.uniform("step", &StepParams { pos: 0, n_tokens: b as u32, slot: 0, _pad: 0 }),
        }
    }
}

/// One decode token's kernels on `io`: fused, [`attention_rope`]; else [`rope_kv_write`] (`rp`)
/// then [`attention`].
fn rope_attention(gpu: &Gpu, io: Io, fused: bool, p: AttnParams, rp: RopeParams, table: &Tensor) -> Vec<Kernel> {
    let Io { qkv, k_cache, v_cache, out, step } = io;
    if fused {
        return attention_rope(gpu, qkv, k_cache, v_cache, out, step, p, table).unwrap();
    }
    let mut ks = vec![rope_kv_write(gpu, qkv, step, rp, None, k_cache, v_cache).unwrap()];
    ks.extend(attention(gpu, qkv, k_cache, v_cache, out, step, p).unwrap());
    ks
}

fn params(heads: usize, kv_heads: usize, head_dim: usize, max_ctx: usize, window: usize) -> AttnParams {
    AttnParams::one_token(heads, kv_heads, head_dim, max_ctx, window)
}

/// Heads of 512 stage their queries as f16: against the exact attention (f32 queries), the
/// output moves by no more than that rounding allows. Each query element moves by at most
/// 2^-11 of itself, so score j by at most E_j = scale · 2^-11 · Σ_i |q_i k_ji|, each
/// probability by a factor within e^(±2E), E = max_j E_j, and the output by at most
/// (e^(2E) - 1) · max |v| (plus the kernel's own f32 error, 2e-5 of the output's scale).
#[test]
fn wide_heads_stay_within_the_query_rounding_bound() {
    for gpu in gpu_variants() {
        let (h, hkv, d, ctx, n) = (8usize, 1usize, 512usize, 64usize, 5usize);
        let p = AttnParams { n_tokens: n, ..params(h, hkv, d, ctx, 0) };
        let row = p.row_stride();
        let mut data = random(n * row, 97, 1.0);
        for t in 0..n {
            data[t * row..][..h * d].iter_mut().for_each(|x| *x *= 3.0);
        }
        let step = gpu.uniform("step", &StepParams { pos: 40, n_tokens: n as u32, slot: 0, _pad: 0 });
        let (kc, vc) = kv_cache(&gpu, "wide", &p, 1).unwrap();
        // Earlier positions' keys and values: random, written as the cache holds them.
        let (mut k_cpu, mut v_cpu) = (vec![f16::ZERO; hkv * ctx * d], vec![f16::ZERO; hkv * ctx * d]);
        let old = random(40 * row, 98, 1.0);
        cpu::kv_cache_write(&old, &mut k_cpu, &mut v_cpu, 0, 40, &AttnParams { n_tokens: 40, ..p });
        gpu.queue.write_buffer(&kc.buffer, kc.offset, bytemuck::cast_slice(&k_cpu));
        gpu.queue.write_buffer(&vc.buffer, vc.offset, bytemuck::cast_slice(&v_cpu));
        let qkv = gpu.upload_f32("qkv", &[n, row], &data).unwrap();
        let out = gpu.empty("out", &[n, h * d], ElemType::F32).unwrap();
        let write = kv_cache_write(&gpu, &qkv, &kc, &vc, &step, p).unwrap();
        let attn = attention(&gpu, &qkv, &kc, &vc, &out, &step, p).unwrap();
        let mut ks = vec![&write];
        ks.extend(attn.iter());
        gpu.run(&ks).unwrap();
        let got = gpu.read_f32(&out).unwrap();
        cpu::kv_cache_write(&data, &mut k_cpu, &mut v_cpu, 40, n, &p);
        let exact = cpu::attention(&data, &k_cpu, &v_cpu, 40, n, &p, false);
        let vmax = v_cpu.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
        let mut moved = 0f32;
        for t in 0..n {
            for hh in 0..h {
                let q = &data[t * row + hh * d..][..d];
                let e = (0..=40 + t)
                    .map(|j| {
                        let k = &k_cpu[j * d..][..d];
                        q.iter().zip(k).map(|(a, b)| (a * b.to_f32()).abs()).sum::<f32>() * p.scale / 2048.0
                    })
                    .fold(0f32, f32::max);
                let bound = ((2.0 * e).exp() - 1.0) * vmax + 2e-5;
                let at = (t * h + hh) * d;
                let (diff, i) = max_abs_diff(&got[at..][..d], &exact[at..][..d]);
                assert!(diff <= bound, "t={t} head {hh}: {diff} at {i} beyond the rounding bound {bound}");
                moved = moved.max(diff);
            }
        }
        eprintln!("D=512 against exact attention: max |diff| {moved}");
    }
}

#[test]
fn prefill_then_decode() {
    for gpu in gpu_variants() {
        for (h, hkv, d) in
            [(4, 2, 64), (4, 1, 64), (6, 2, 64), (4, 1, 256), (6, 2, 256), (2, 2, 128), (8, 1, 512), (8, 2, 512)]
        {
            let mut l = Layer::new(&gpu, params(h, hkv, d, 64, 0));
            l.pass(&gpu, 0, 7, 7, None, 1);
            let mut l = Layer::new(&gpu, params(h, hkv, d, 64, 0));
            l.pass(&gpu, 0, 37, 37, None, 2);
            l.pass(&gpu, 37, 1, 1, None, 3);
            l.pass(&gpu, 38, 1, 1, None, 4);
        }
    }
}

/// attention_rope (rotation and cache write inside attention) leaves what rope_kv_write +
/// attention leave: the caches bit for bit (the same f32 rotation, rounded to nearest even),
/// and the output within f32 rounding of the same sums; at the first position, mid-context,
/// and near the end of the cache, with and without key splits.
#[test]
fn attention_rope_equals_rope_then_attention() {
    for gpu in gpu_variants() {
        for (h, hkv, d, ctx, pos) in
            [(12, 2, 128, 641, 600), (6, 2, 64, 40, 0), (4, 1, 256, 80, 79), (8, 8, 64, 300, 123)]
        {
            let p = params(h, hkv, d, ctx, 0);
            let rp = RopeParams::new(h, hkv, d, 1e6, 1);
            let row = p.row_stride();
            let data = random(row, 91 + pos as u64, 1.5);
            let cache: Vec<f16> = random(hkv * ctx * d, 92, 1.0).iter().map(|x| f16::from_f32(*x)).collect();
            let step = gpu.uniform("step", &StepParams { pos: pos as u32, n_tokens: 1, slot: 0, _pad: 0 });
            let table = gpu.upload_f32("inv_freq", &[d / 2], &inv_freq(d, 1e6, 1.0)).unwrap();
            let run = |fused: bool| {
                let qkv = gpu.upload_f32("qkv", &[1, row], &data).unwrap();
                let kc = gpu.upload_f16("k", &[hkv, ctx, d], &cache).unwrap();
                let vc = gpu.upload_f16("v", &[hkv, ctx, d], &cache).unwrap();
                let out = gpu.empty("out", &[1, h * d], ElemType::F32).unwrap();
                let io = Io { qkv: &qkv, k_cache: &kc, v_cache: &vc, out: &out, step: &step };
                let ks = rope_attention(&gpu, io, fused, p, rp, &table);
                gpu.run(&ks.iter().collect::<Vec<_>>()).unwrap();
                (gpu.read_f32(&out).unwrap(), gpu.read_f16(&kc).unwrap(), gpu.read_f16(&vc).unwrap())
            };
            let (oa, ka, va) = run(false);
            let (ob, kb, vb) = run(true);
            let what = format!("H {h} Hkv {hkv} D {d} ctx {ctx} pos {pos} f16={}", gpu.caps.f16);
            let bits = |a: &[f16], b: &[f16]| a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(bits(&ka, &kb), 0, "K cache: {what}");
            assert_eq!(bits(&va, &vb), 0, "V cache: {what}");
            assert_ne!(ka[pos * d], cache[pos * d], "the key at pos was written: {what}");
            let (diff, at) = max_abs_diff(&oa, &ob);
            assert!(diff <= 1e-5 * (1.0 + oa[at].abs()), "out differs by {diff} at {at}: {what}");
        }
    }
}

/// Decode tilings: a short context takes small key tiles for more splits (Qwen2.5-1.5B's 12 /
/// 2 heads of 128 at 641 positions: 16-key tiles, 41 splits; at 4096: 16, 128), a long one
/// keeps 64-key tiles (32768: 128 splits of 4 tiles); 512 rows need no split.
#[test]
fn tiling_follows_the_context() {
    let gpu = gpu();
    let t = |ctx: usize, n_tokens: usize| {
        let tl = Tiling::choose(&gpu, &AttnParams { n_tokens, ..params(12, 2, 128, ctx, 0) }).unwrap();
        (tl.bk, tl.nsplit)
    };
    assert_eq!(t(641, 1), (16, 41));
    assert_eq!(t(4096, 1), (16, 128));
    assert_eq!(t(32768, 1), (64, 128));
    assert_eq!(t(4096, 512).1, 1);
}

/// The decode kernel's output staged for the o projection (STAGE8): out the same bits as
/// without, xs word for word what quantize_x16's twin makes of it; split and whole runs, one
/// and two pairs a thread (G · D / 4 over 256), sliding and full. Without subgroups of 8+ it
/// says it cannot stage.
#[test]
fn decode_kernel_stages_its_output() {
    for gpu in gpu_variants() {
        let can = gpu.caps.shuffles8();
        let limit = gpu.limits.max_compute_workgroup_storage_size as usize;
        for (h, hkv, d, ctx, window) in
            [(12, 2, 128, 300, 0), (4, 1, 256, 100, 45), (8, 1, 256, 150, 0), (8, 1, 128, 150, 45), (4, 2, 32, 600, 0)]
        {
            let p = params(h, hkv, d, ctx, window);
            assert_eq!(stages_output(&gpu, &p), can);
            if !can {
                continue;
            }
            for rope in [false, true] {
                let mut tilings: Vec<DecodeTiling> = DecodeTiling::choose(&gpu, &p, rope).into_iter().collect();
                for nsplit in [1, 3] {
                    let tl = DecodeTiling { ck: 4096 / d, nsplit };
                    if tl.valid(d, h / hkv, limit, rope, sg32(&gpu)) && !tilings.contains(&tl) {
                        tilings.push(tl);
                    }
                }
                assert!(tilings.len() >= 2, "H {h} Hkv {hkv} D {d} rope {rope}: {tilings:?}");
                let table = rope.then(|| {
                    let f = crate::ops::rope::inv_freq(d, 10000.0, 1.0);
                    gpu.upload_f32("inv_freq", &[d / 2], &f).unwrap()
                });
                for tl in tilings {
                    let row = p.row_stride();
                    let kv: Vec<f16> = random(hkv * ctx * d, 80, 1.0).iter().map(|x| f16::from_f32(*x)).collect();
                    let kc = gpu.upload_f16("k", &[hkv, ctx, d], &kv).unwrap();
                    let vc =
                        gpu.upload_f16("v", &[hkv, ctx, d], &kv[..].iter().rev().copied().collect::<Vec<_>>()).unwrap();
                    let mut data = random(row, 81, 1.0);
                    data[..h * d].iter_mut().for_each(|x| *x *= 3.0);
                    let qkv = gpu.upload_f32("qkv", &[1, row], &data).unwrap();
                    let step =
                        gpu.uniform("step", &StepParams { pos: (ctx - 3) as u32, n_tokens: 1, slot: 0, _pad: 0 });
                    let (a, b) = (
                        gpu.empty("a", &[1, h * d], ElemType::F32).unwrap(),
                        gpu.empty("b", &[1, h * d], ElemType::F32).unwrap(),
                    );
                    let words = crate::ops::matmul::gguf::staged_x_words(1, h * d);
                    let xs = gpu.upload_u32("xs", &[words], &vec![7; words]).unwrap();
                    let rt = table.as_ref();
                    let plain = attention_decode(&gpu, &qkv, &kc, &vc, &a, &step, p, tl, rt, None, None).unwrap();
                    let staged = attention_decode(&gpu, &qkv, &kc, &vc, &b, &step, p, tl, rt, None, Some(&xs)).unwrap();
                    assert!(staged[0].variant.split('+').any(|f| f == "STAGE8"));
                    assert_eq!(staged[0].variant.split('+').any(|f| f == "ROPE"), rope);
                    gpu.run(&plain.iter().chain(&staged).collect::<Vec<_>>()).unwrap();
                    let (got_a, got_b) = (gpu.read_f32(&a).unwrap(), gpu.read_f32(&b).unwrap());
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got_a), bits(&got_b), "{p:?} {tl:?} rope {rope}: the output");
                    let want = crate::ops::matmul::gguf::cpu::quantize_x16(&got_b, h * d);
                    assert_eq!(gpu.read_u32(&xs).unwrap(), want, "{p:?} {tl:?} rope {rope}: the staged output");
                }
            }
        }
    }
}

/// The one-dispatch decode kernel (attention_decode) against the CPU: runs of decode steps
/// through the same recorded kernel (the merge's counters reset between dispatches), from
/// the first position, inside one chunk and across several, with one run, a few, and more
/// runs than chunks (empty runs); 8192- and 4096-element chunks, full and sliding-window
/// attention, every head shape the kernel takes. The caches past the token hold random
/// values the kernel must not see.
#[test]
fn decode_kernel_matches_cpu() {
    for gpu in gpu_variants() {
        let limit = gpu.limits.max_compute_workgroup_storage_size as usize;
        for (h, hkv, d, ctx) in [
            (12, 2, 128, 300),
            (14, 2, 64, 400),
            (9, 3, 64, 200),
            (4, 1, 256, 100),
            (8, 1, 128, 150),
            (4, 2, 32, 600),
            (8, 1, 16, 600),
        ] {
            for window in [0usize, 45] {
                let p = params(h, hkv, d, ctx, window);
                let g = h / hkv;
                let mut tilings: Vec<DecodeTiling> = DecodeTiling::choose(&gpu, &p, false).into_iter().collect();
                for (ce, nsplit) in [(8192, 1), (8192, 3), (4096, 2), (4096, 7), (8192, 40)] {
                    let tl = DecodeTiling { ck: ce / d, nsplit };
                    if ce % d == 0 && tl.valid(d, g, limit, false, sg32(&gpu)) && !tilings.contains(&tl) {
                        tilings.push(tl);
                    }
                }
                assert!(tilings.len() >= 2, "H {h} Hkv {hkv} D {d}: {tilings:?}");
                for tl in tilings {
                    let row = p.row_stride();
                    let (mut k_cpu, mut v_cpu): (Vec<f16>, Vec<f16>) = (
                        random(hkv * ctx * d, 60, 1.0).iter().map(|x| f16::from_f32(*x)).collect(),
                        random(hkv * ctx * d, 61, 1.0).iter().map(|x| f16::from_f32(*x)).collect(),
                    );
                    let kc = gpu.upload_f16("k", &[hkv, ctx, d], &k_cpu).unwrap();
                    let vc = gpu.upload_f16("v", &[hkv, ctx, d], &v_cpu).unwrap();
                    let qkv = gpu.upload_f32("qkv", &[1, row], &vec![0.0; row]).unwrap();
                    let out = gpu.empty("out", &[1, h * d], ElemType::F32).unwrap();
                    let step = gpu.uniform("step", &StepParams::default());
                    let write = kv_cache_write(&gpu, &qkv, &kc, &vc, &step, p).unwrap();
                    let attn = attention_decode(&gpu, &qkv, &kc, &vc, &out, &step, p, tl, None, None, None).unwrap();
                    assert_eq!(attn.len(), 1, "one dispatch");
                    let mut ks = vec![&write];
                    ks.extend(attn.iter());
                    for pos in [0usize, 1, 2, 3, ctx / 2, ctx / 2 + 1, ctx - 2, ctx - 1] {
                        let mut data = random(row, 70 + pos as u64, 1.0);
                        data[..h * d].iter_mut().for_each(|x| *x *= 3.0);
                        gpu.queue.write_buffer(&qkv.buffer, qkv.offset, bytemuck::cast_slice(&data));
                        let sp = StepParams { pos: pos as u32, n_tokens: 1, slot: 0, _pad: 0 };
                        gpu.queue.write_buffer(&step, 0, bytemuck::bytes_of(&sp));
                        gpu.run(&ks).unwrap();
                        cpu::kv_cache_write(&data, &mut k_cpu, &mut v_cpu, pos, 1, &p);
                        let got = gpu.read_f32(&out).unwrap();
                        let want = cpu::attention(&data, &k_cpu, &v_cpu, pos, 1, &p, q_f16(p.head_dim));
                        let (diff, at) = max_abs_diff(&got, &want);
                        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
                        assert!(
                            diff <= 2e-5 * scale.max(1.0),
                            "{p:?} {tl:?} pos={pos} f16={}: max diff {diff} at {at} ({} vs {})",
                            gpu.caps.f16,
                            got[at],
                            want[at]
                        );
                    }
                }
            }
        }
    }
}

/// The decode path picks the one-dispatch kernel for the shapes it takes (Qwen2.5-1.5B's 12 /
/// 2 heads of 128: 64-key chunks, 11 runs at 641 positions, 32 at 4096; Gemma 4's 512-dim
/// heads fall back to the split kernel), and never for more than one token.
#[test]
fn decode_tiling_follows_the_context() {
    let gpu = gpu();
    let t = |h: usize, hkv: usize, d: usize, ctx: usize| DecodeTiling::choose(&gpu, &params(h, hkv, d, ctx, 0), true);
    // 2 KV heads: the one-dispatch kernel for heads of 128 (Qwen2.5-1.5B), else the split
    // kernel and its merge (the 0.5B's 64).
    assert_eq!(t(12, 2, 128, 641), Some(DecodeTiling { ck: 64, nsplit: 11 }), "Qwen2.5-1.5B");
    assert_eq!(t(12, 2, 128, 4096), Some(DecodeTiling { ck: 64, nsplit: 32 }));
    assert_eq!(t(14, 2, 64, 641), None, "Qwen2.5-0.5B");
    assert_eq!(t(64, 8, 128, 641), Some(DecodeTiling { ck: 32, nsplit: 8 }));
    assert_eq!(t(32, 16, 256, 640), Some(DecodeTiling { ck: 32, nsplit: 8 }));
    assert_eq!(t(32, 16, 256, 4096), Some(DecodeTiling { ck: 32, nsplit: 8 }));
    assert_eq!(t(32, 4, 512, 4096), None);
    assert_eq!(DecodeTiling::choose(&gpu, &AttnParams { n_tokens: 2, ..params(64, 8, 128, 641, 0) }, false), None);
}

#[test]
fn key_splits() {
    for gpu in gpu_variants() {
        for (h, hkv, d) in [(4, 1, 64), (6, 2, 256)] {
            let p = params(h, hkv, d, 128, 0);
            let t = Tiling::choose(&gpu, &AttnParams { n_tokens: 1, ..p }).unwrap();
            let mut l = Layer::new(&gpu, p);
            l.pass(&gpu, 0, 70, 70, Some(Tiling { nsplit: 3, ..t }), 5);
            for (pos, splits) in [(70, 1), (71, 2), (72, 7), (73, 64)] {
                l.pass(&gpu, pos, 1, 1, Some(Tiling { nsplit: splits, ..t }), 6 + pos as u64);
            }
            // chunk of 5 after 74 positions, split
            let t5 = Tiling::choose(&gpu, &AttnParams { n_tokens: 5, ..p }).unwrap();
            l.pass(&gpu, 74, 5, 5, Some(Tiling { nsplit: 4, ..t5 }), 9);
        }
    }
}

/// Every valid tiling on a causal prefill and a decode step (sliding window, GQA 3:1).
#[test]
fn all_tilings() {
    for gpu in gpu_variants() {
        let limit = gpu.limits.max_compute_workgroup_storage_size as usize;
        for d in [64, 256] {
            let p = params(6, 2, d, 128, 40);
            let mut l = Layer::new(&gpu, p);
            let mut seed = 50;
            let mut pos = 0;
            for bq in [4, 8, 16] {
                for bk in [8, 16, 32, 64, 128] {
                    for nsplit in [1, 3] {
                        let tl = Tiling { bq, lpr: 128 / bq, bk, nsplit };
                        if !tl.valid(d, limit) {
                            continue;
                        }
                        seed += 1;
                        if pos + 9 > p.max_ctx {
                            l = Layer::new(&gpu, p);
                            pos = 0;
                        }
                        l.pass(&gpu, pos, 8, 8, Some(tl), seed);
                        l.pass(&gpu, pos + 8, 1, 1, Some(tl), seed + 1000);
                        pos += 9;
                    }
                }
            }
        }
    }
}

#[test]
fn sliding_window() {
    for gpu in gpu_variants() {
        for (h, hkv, d) in [(4, 2, 64), (4, 1, 256)] {
            let p = params(h, hkv, d, 64, 5);
            let mut l = Layer::new(&gpu, p);
            l.pass(&gpu, 0, 20, 20, None, 10);
            let windowed = l.pass(&gpu, 20, 1, 1, None, 11);
            // the same keys with full attention differ
            let mut full = Layer::new(&gpu, AttnParams { window: 0, ..p });
            full.pass(&gpu, 0, 20, 20, None, 10);
            let all = full.pass(&gpu, 20, 1, 1, None, 11);
            assert!(max_abs_diff(&windowed, &all).0 > 1e-3, "window had no effect");
            // windowed prefill chunk (the window moves inside the block), split and not
            l.pass(&gpu, 21, 8, 8, None, 12);
            let t = Tiling::choose(&gpu, &AttnParams { n_tokens: 8, ..p }).unwrap();
            l.pass(&gpu, 29, 8, 8, Some(Tiling { nsplit: 3, ..t }), 13);
            l.pass(&gpu, 37, 8, 8, Some(Tiling { nsplit: 1, ..t }), 14);
        }
    }
}

#[test]
fn chunked_prefill_equals_single() {
    for gpu in gpu_variants() {
        for (h, hkv, d) in [(4, 2, 64), (6, 2, 256)] {
            let p = params(h, hkv, d, 32, 0);
            let row = p.row_stride();
            let width = h * d;
            // the same 15 tokens: rows 0..10 then 10..15 of one random block
            let seed = 21;
            let mut single = Layer::new(&gpu, p);
            let all = single.pass(&gpu, 0, 15, 15, None, seed);
            let data = {
                let mut x = random(15 * row, seed, 1.0);
                for t in 0..15 {
                    x[t * row..][..width].iter_mut().for_each(|v| *v *= 3.0);
                }
                x
            };
            let chunked = Layer::new(&gpu, p);
            let step = &chunked.step;
            let mk = |rows: std::ops::Range<usize>| {
                let mut x = data[rows.start * row..rows.end * row].to_vec();
                x.resize(10 * row, 0.5); // recorded T = 10; the tail is ignored
                gpu.upload_f32("qkv", &[10, row], &x).unwrap()
            };
            let out = gpu.empty("out", &[10, width], ElemType::F32).unwrap();
            let q1 = mk(0..10);
            let q2 = mk(10..15);
            let pp = AttnParams { n_tokens: 10, ..p };
            let mut got = Vec::new();
            for (qkv, pos, n) in [(&q1, 0, 10), (&q2, 10, 5)] {
                let sp = StepParams { pos, n_tokens: n, slot: 0, _pad: 0 };
                gpu.queue.write_buffer(step, 0, bytemuck::bytes_of(&sp));
                let w = kv_cache_write(&gpu, qkv, &chunked.k, &chunked.v, step, pp).unwrap();
                let a = attention(&gpu, qkv, &chunked.k, &chunked.v, &out, step, pp).unwrap();
                let mut ks = vec![&w];
                ks.extend(a.iter());
                gpu.run(&ks).unwrap();
                got.extend_from_slice(&gpu.read_f32(&out).unwrap()[..n as usize * width]);
            }
            assert!(gpu.read_f16(&chunked.k).unwrap() == single.k_cpu);
            assert!(gpu.read_f16(&chunked.v).unwrap() == single.v_cpu);
            let (diff, at) = max_abs_diff(&got, &all);
            assert!(diff <= 2e-5, "chunked vs single d={d}: {diff} at {at}");
        }
    }
}

/// A decode step of many sequences (each token its own slot and position, some slots idle)
/// gives each sequence the output and cache entries it gets alone in a one-token pass, bit
/// for bit, with the cache write in rope (q/k norm models) or inside attention (rope fused),
/// with and without key splits; and the output matches the CPU reference.
#[test]
fn batch_of_sequences_equals_each_alone() {
    use crate::ops::rope::rope_kv_write_batch;
    for gpu in gpu_variants() {
        for (h, hkv, d, ctx, fused) in
            [(12, 2, 128, 300, true), (6, 2, 64, 64, false), (4, 1, 256, 40, true), (8, 1, 512, 40, false)]
        {
            let slots = 5;
            // (position, slot) per token: different lengths, slot 2 idle, a sequence at 0.
            let seqs: [(u32, u32); 4] = [(17, 3), (0, 0), ((ctx - 1) as u32, 4), (123 % ctx as u32, 1)];
            let b = seqs.len();
            let p = AttnParams { n_tokens: b, ..params(h, hkv, d, ctx, 0) };
            let rp = RopeParams::new(h, hkv, d, 1e4, b);
            let row = p.row_stride();
            let data = random(b * row, 7 + d as u64, 1.5);
            let cache: Vec<f16> = random(slots * hkv * ctx * d, 8, 1.0).iter().map(|x| f16::from_f32(*x)).collect();
            let table = gpu.upload_f32("inv_freq", &[d / 2], &inv_freq(d, 1e4, 1.0)).unwrap();
            let what = format!("H {h} Hkv {hkv} D {d} ctx {ctx} fused {fused} f16={}", gpu.caps.f16);
            let shape = [slots, hkv, ctx, d];
            // The batch.
            let BatchStep { qkv, kc, vc, out, sq, step } = BatchStep::new(&gpu, &p, &data, &cache, &seqs);
            let mut ks = Vec::new();
            if fused {
                ks.extend(attention_batch(&gpu, &qkv, &kc, &vc, &out, &step, &sq, p, Some(&table)).unwrap());
            } else {
                ks.push(rope_kv_write_batch(&gpu, &qkv, &step, &sq, rp, None, &kc, &vc).unwrap());
                ks.extend(attention_batch(&gpu, &qkv, &kc, &vc, &out, &step, &sq, p, None).unwrap());
            }
            gpu.run(&ks.iter().collect::<Vec<_>>()).unwrap();
            let (got, gk, gv) = (gpu.read_f32(&out).unwrap(), gpu.read_f16(&kc).unwrap(), gpu.read_f16(&vc).unwrap());
            // Each sequence alone, one after another on the same caches.
            let kc1 = gpu.upload_f16("k", &shape, &cache).unwrap();
            let vc1 = gpu.upload_f16("v", &shape, &cache).unwrap();
            let p1 = AttnParams { n_tokens: 1, ..p };
            let rp1 = RopeParams { n_tokens: 1, ..rp };
            for (t, &(pos, slot)) in seqs.iter().enumerate() {
                let qkv1 = gpu.upload_f32("qkv", &[1, row], &data[t * row..][..row]).unwrap();
                let out1 = gpu.empty("out", &[1, h * d], ElemType::F32).unwrap();
                let step1 = gpu.uniform("step", &StepParams { pos, n_tokens: 1, slot, _pad: 0 });
                let io = Io { qkv: &qkv1, k_cache: &kc1, v_cache: &vc1, out: &out1, step: &step1 };
                let ks = rope_attention(&gpu, io, fused, p1, rp1, &table);
                gpu.run(&ks.iter().collect::<Vec<_>>()).unwrap();
                let alone = gpu.read_f32(&out1).unwrap();
                let mine = &got[t * h * d..][..h * d];
                let same = mine.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "sequence {t} (pos {pos}, slot {slot}) differs from its one-token pass: {what}");
                // This step's key was written to its slot (at its position).
                let at = (slot as usize * hkv * ctx + pos as usize) * d;
                assert_ne!(gk[at], cache[at], "sequence {t}'s key was not written: {what}");
            }
            let bits = |a: &[f16], b: &[f16]| a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(bits(&gk, &gpu.read_f16(&kc1).unwrap()), 0, "K caches: {what}");
            assert_eq!(bits(&gv, &gpu.read_f16(&vc1).unwrap()), 0, "V caches: {what}");
            // Slot 2 (idle) untouched.
            let per_slot = hkv * ctx * d;
            assert_eq!(bits(&gk[2 * per_slot..][..per_slot], &cache[2 * per_slot..][..per_slot]), 0, "{what}");
        }
    }
}

/// The batch's output against the CPU reference (unrotated keys: the cache write by
/// kv_cache_write per slot first, then attention over every sequence in one step).
#[test]
fn batch_of_sequences_matches_cpu() {
    let gpu = gpu();
    let (h, hkv, d, ctx, slots) = (8, 2, 64, 96, 3);
    let seqs: [(u32, u32); 3] = [(95, 2), (40, 0), (3, 1)];
    let b = seqs.len();
    let p = AttnParams { n_tokens: b, ..params(h, hkv, d, ctx, 0) };
    let row = p.row_stride();
    let mut data = random(b * row, 31, 1.0);
    for t in 0..b {
        data[t * row..][..h * d].iter_mut().for_each(|x| *x *= 3.0);
    }
    let cache: Vec<f16> = random(slots * hkv * ctx * d, 32, 1.0).iter().map(|x| f16::from_f32(*x)).collect();
    let BatchStep { qkv, kc, vc, out, sq, step } = BatchStep::new(&gpu, &p, &data, &cache, &seqs);
    let ks = attention_batch(&gpu, &qkv, &kc, &vc, &out, &step, &sq, p, None).unwrap();
    gpu.run(&ks.iter().collect::<Vec<_>>()).unwrap();
    let got = gpu.read_f32(&out).unwrap();
    let per_slot = hkv * ctx * d;
    for (t, &(pos, slot)) in seqs.iter().enumerate() {
        let s = slot as usize * per_slot;
        let want = cpu::attention(
            &data[t * row..][..row],
            &cache[s..][..per_slot],
            &cache[s..][..per_slot],
            pos as usize,
            1,
            &AttnParams { n_tokens: 1, ..p },
            q_f16(d),
        );
        let (diff, at) = max_abs_diff(&got[t * h * d..][..h * d], &want);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(diff <= 2e-5 * scale.max(1.0), "sequence {t}: max diff {diff} at {at}");
    }
}

/// Every rounding case of the f32 -> f16 conversion (ties, subnormals, overflow, inf, NaN).
#[test]
fn cache_write_rounds_to_nearest_even() {
    let gpu = gpu();
    let mut vals: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        65504.0,
        65519.0,
        65520.0,
        -65520.0,
        1e9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        6.1035156e-5,
        6.097555e-5,
        5.9604645e-8,
        2.9802322e-8,
        2.9802326e-8,
        1.0e-8,
        -4.5e-6,
        1.0009766,
        1.0004883,
        1.0014648,
        2049.0,
        2051.0,
        0.1,
        1.0 / 3.0,
    ];
    vals.extend(random(900, 31, 8.0).iter().map(|x| x * x * x * 1e-3));
    // exact ties between neighbouring halves (normal and subnormal, even and odd), and the
    // f32 values just below and above them
    for b in [0x0000u16, 0x0001, 0x0002, 0x03fe, 0x03ff, 0x0400, 0x3c00, 0x3c01, 0x7bfe, 0x7bff] {
        let lo = f16::from_bits(b).to_f64();
        let hi = if b == 0x7bff { 65536.0 } else { f16::from_bits(b + 1).to_f64() };
        let tie = ((lo + hi) / 2.0) as f32;
        for x in [tie, f32::from_bits(tie.to_bits() - 1), f32::from_bits(tie.to_bits() + 1)] {
            vals.push(x);
            vals.push(-x);
        }
    }
    let p = AttnParams { n_tokens: 8, ..params(2, 2, 64, 8, 0) };
    let row = p.row_stride();
    let mut data = random(8 * row, 32, 1.0);
    let ks = p.heads * p.head_dim;
    for t in 0..8 {
        for i in 0..2 * p.kv_heads * p.head_dim {
            data[t * row + ks + i] = vals[(t * 256 + i) % vals.len()];
        }
    }
    let mut l = Layer::new(&gpu, p);
    let qkv = gpu.upload_f32("qkv", &[8, row], &data).unwrap();
    let sp = StepParams { pos: 0, n_tokens: 8, slot: 0, _pad: 0 };
    gpu.queue.write_buffer(&l.step, 0, bytemuck::bytes_of(&sp));
    let k = kv_cache_write(&gpu, &qkv, &l.k, &l.v, &l.step, p).unwrap();
    gpu.run(&[&k]).unwrap();
    cpu::kv_cache_write(&data, &mut l.k_cpu, &mut l.v_cpu, 0, 8, &p);
    let got = gpu.read_f16(&l.k).unwrap();
    for (i, (a, b)) in got.iter().zip(&l.k_cpu).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "K[{i}]: {a} vs {b}");
    }
    let got = gpu.read_f16(&l.v).unwrap();
    for (i, (a, b)) in got.iter().zip(&l.v_cpu).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "V[{i}]: {a} vs {b}");
    }
    // NaN stays NaN
    let nan = gpu.upload_f32("nan", &[8, row], &vec![f32::NAN; 8 * row]).unwrap();
    let k = kv_cache_write(&gpu, &nan, &l.k, &l.v, &l.step, p).unwrap();
    gpu.run(&[&k]).unwrap();
    assert!(gpu.read_f16(&l.k).unwrap()[..64].iter().all(|x| x.is_nan()));
}
