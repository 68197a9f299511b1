use super::table::{rows, Fam};
use super::*;
use crate::dtype::DType;
use crate::gpu::tensor::test_util::gpu;
use crate::ops::matmul::gguf::tuned_matvec;

/// Every row says where it was measured and cites the measurement; a row measured nowhere says
/// why it is there.
#[test]
fn every_row_cites_its_measurement() {
    for r in RULES {
        assert!(!r.cite.is_empty() && !r.measured.is_empty(), "{r}");
        if r.measured.starts_with("nowhere") {
            assert!(r.measured.len() > "nowhere: ".len() + 10, "a row measured nowhere says why: {r}");
        } else {
            // The device it was measured on comes first ("H100 ...", "Radeon RX 7900 ..."), then
            // the measurement: a BENCHMARKS run or the bench that chose it.
            assert!(r.measured.split_whitespace().next().is_some_and(|d| d.len() >= 2), "{r}");
            assert!(r.cite.contains("BENCHMARKS") || r.cite.contains("bench_quant"), "{r}");
        }
    }
    // Every op has a row for every family.
    for f in Family::ALL {
        for op in Op::ALL {
            assert!(!rows(f, op).is_empty(), "{f:?} {op:?}");
        }
    }
}

/// Families never measured take the generic rows (those for any family, measured on the H100
/// only), but for Apple's own. A family that gains a row of its own leaves this list for a test
/// of its own (CONTRIBUTING.md, "Adding a tuning rule").
#[test]
fn unknown_families_get_the_generic_rows() {
    for f in [Family::Nvidia, Family::Amd, Family::Intel, Family::Software, Family::Other] {
        let t = Tuning::new(DeviceProfile { family: f, ..DeviceProfile::h100() });
        assert!(t.applicable().iter().all(|r| r.family == Fam::Any), "{f:?}");
        assert_eq!(t.applicable().len(), Tuning::new(DeviceProfile::h100()).applicable().len());
        assert!(t.int_dot());
    }
    let apple = Tuning::new(DeviceProfile::h100().emulating(Family::Apple));
    let own: Vec<_> = apple.applicable().into_iter().filter(|r| r.family != Fam::Any).collect();
    assert_eq!(own.len(), 1, "{own:?}");
    assert_eq!(own[0].op, Op::IntDot);
    assert!(!apple.int_dot());
}

/// The table's thresholds are the ones the ops document.
#[test]
fn single_rows_hold_the_documented_values() {
    let t = Tuning::new(DeviceProfile::h100());
    assert_eq!(t.decode_attention(), Some((8, 128)));
    assert_eq!(t.stage_apart(), Some((16384, 4096, 0)));
    assert_eq!(t.mix_max_k(), Some(1536));
    assert_eq!(t.mix_float_wg(), 256);
    assert_eq!(t.attn_key_tile(), 64);
    assert_eq!(t.decode_chunks(), [8192, 4096]);
    assert_eq!(t.norm_wg(4096, 256, |_| true), 256);
    assert_eq!(t.norm_wg(5376, 256, |_| true), 512);
    assert_eq!(t.norm_wg(5376, 256, |wg| wg <= 256), 256);
    assert!(!t.bounds_checked("matvec_quant") && t.bounds_checked("attention"));
}

/// On the H100's profile the table chooses what the if-chain it replaced chose (7935e03), for the
/// shapes `one_token_shapes_follow_the_step_measurements` lists and the rest of the step's:
/// (wg, tpr, dp4, prefetch).
#[test]
fn h100_profile_keeps_the_measured_shapes() {
    let g = gpu().choosing_as(DeviceProfile::h100());
    let pick = |ty: DType, n: usize, k: usize| tuned_matvec(&g, ty, 1, n, k, false);
    assert_eq!(pick(DType::Q6_K, 1536, 8960), (512, 128, true, false), "Qwen2.5-1.5B's Q6_K down (run 67)");
    assert_eq!(pick(DType::Q6_K, 896, 4864), (256, 128, true, false), "Qwen2.5-0.5B's Q6_K down");
    assert_eq!(pick(DType::Q4_1, 576, 1536), (256, 64, true, false), "SmolLM2's Q4_1 down");
    assert_eq!(pick(DType::Q6_K, 256, 1536), (256, 32, true, false), "Qwen2.5-1.5B's Q6_K v");
    assert_eq!(pick(DType::Q4_K, 43008, 5376), (1024, 32, true, true), "Gemma's gate_up (run 40)");
    assert_eq!(pick(DType::Q4_K, 5376, 8192), (256, 32, true, true), "Gemma's o projection");
    assert_eq!(pick(DType::Q6_K, 262144, 5376), (128, 32, true, true), "Gemma's lm_head");
    assert_eq!(pick(DType::Q4_K, 17920, 1536), (128, 32, true, false), "Qwen2.5-1.5B's gate_up");
    assert_eq!(pick(DType::Q4_K, 1536, 1536), (256, 64, true, false), "Qwen2.5-1.5B's o projection (run 65)");
    assert_eq!(pick(DType::Q4_K, 896, 896), (128, 32, true, false), "Qwen2.5-0.5B's o projection");
    assert_eq!(pick(DType::Q6_K, 151936, 1536), (128, 32, true, false), "Qwen2.5's lm_head");
    assert_eq!(tuned_matvec(&g, DType::Q4_K, 1, 2048, 1536, true), (256, 64, true, false), "the 1.5B's q/k/v");
    assert!(!tuned_matvec(&g, DType::Q4_K, 1, 1152, 896, true).2, "0.5B-like q/k/v through the norm: float");
}

/// An emulated Apple profile: its hazards are facts of the profile, and the device is requested
/// with them.
#[test]
fn apple_profile_holds_its_hazards() {
    let mut big = DeviceProfile::h100();
    big.backend = wgpu::Backend::Metal;
    big.max_storage_binding = 14 << 30;
    big.max_buffer = 14 << 30;
    big.bindings_per_stage = 64;
    big.coop_shapes.push(profile::CoopShape { m: 8, n: 8, k: 8, ab: "F16".into(), cr: "F32".into() });
    let a = big.emulating(Family::Apple);
    assert_eq!((a.subgroup_min_size, a.subgroup_max_size), (32, 32));
    assert!(a.max_storage_binding < 4 << 30, "{a}");
    assert_eq!(a.bindings_per_stage, 31);
    assert_eq!(a.workgroup_memory, 32 << 10);
    assert!(a.coop_shapes.iter().all(|c| (c.m, c.n, c.k) == (8, 8, 8)) && !a.coop_shapes.is_empty());
    assert!(a.one_pass_per_step && !a.int_dot);
    let l = a.clamp_limits(&wgpu::Limits { max_storage_buffer_binding_size: 14 << 30, ..Default::default() });
    assert!(l.max_storage_buffer_binding_size < 4 << 30);
    // The family of a real adapter.
    let info = |vendor: u32, name: &str, backend| wgpu::AdapterInfo {
        name: name.into(),
        vendor,
        device: 0,
        device_type: wgpu::DeviceType::DiscreteGpu,
        driver: String::new(),
        driver_info: String::new(),
        backend,
        ..gpu().info.clone()
    };
    assert_eq!(Family::of(&info(0x10de, "NVIDIA H100 80GB HBM3", wgpu::Backend::Vulkan)), Family::NvidiaHopper);
    assert_eq!(Family::of(&info(0x10de, "NVIDIA GeForce RTX 4090", wgpu::Backend::Vulkan)), Family::Nvidia);
    assert_eq!(Family::of(&info(0x1002, "AMD Radeon RX 7900 XTX", wgpu::Backend::Vulkan)), Family::Amd);
    assert_eq!(Family::of(&info(0, "Apple M4 Pro", wgpu::Backend::Metal)), Family::Apple);
    assert_eq!(Family::of(&info(0x10005, "llvmpipe (LLVM 19.1.7, 256 bits)", wgpu::Backend::Vulkan)), Family::Software);
}

/// The knobs: the environment's text forms and the TOML file's set the same fields.
#[test]
fn knobs_parse_from_text_and_toml() {
    let mut k = Knobs::default();
    k.set("WGPU_LLM_QMV", "Q6_K:1536:8960:256:64:1,bad,any:1:2:3:4:0").unwrap();
    k.set("ATTN_DECODE_MIN_KV", "1").unwrap();
    k.set("XG_CFG", "128:64:1").unwrap();
    k.set("MIX_CFG", "256:64:1").unwrap();
    k.set("PROBE_DROP", "rms_norm:STAGE,attention_decode:main:ROPE").unwrap();
    assert_eq!(k.qmv.len(), 2);
    assert_eq!(k.qmv[0], QmvOverride { ty: "Q6_K".into(), n: 1536, k: 8960, wg: 256, tpr: 64, dp4: 1 });
    assert_eq!(k.attn_decode_min_kv, Some(1));
    assert_eq!(k.xg_cfg, Some([128, 64, 1]));
    assert_eq!(k.mix_cfg, None, "three fields of four");
    assert_eq!(k.probe_drop[1], ("attention_decode:main".to_string(), "ROPE".to_string()));
    assert!(k.set("WGPU_LLM_NOPE", "1").is_err());
    let mut t = Tuning::new(DeviceProfile::h100());
    t.override_from_toml(
        "attn_decode_min_kv = 1\nnorms_apart = true\nqmv = \"Q4_K:1:2:3:4:0\"\nxg = 0\nmoe_group = 0\n",
    )
    .unwrap();
    assert_eq!(t.knobs.attn_decode_min_kv, Some(1));
    assert!(t.knobs.norms_apart && t.knobs.xg_off && t.stage_apart().is_none() && !t.moe_batch_group());
    assert_eq!(t.knobs.qmv.len(), 1);
    assert!(t.override_from_toml("nope = 1").is_err());
    assert_eq!(t.decode_attention(), Some((1, 128)));
}

/// A value that does not parse leaves the knob as the file (or an earlier value) set it: the
/// environment's typo never silently undoes the tuning file.
#[test]
fn a_value_that_does_not_parse_keeps_the_earlier_one() {
    let mut k = Knobs::default();
    for (name, good) in
        [("XG_K", "8192"), ("ATTN_BK", "32"), ("NORM_WG", "512"), ("QMV_PF", "1"), ("BOUNDS_CHECKS", "0")]
    {
        k.set(name, good).unwrap();
        let before = format!("{k:?}");
        k.set(name, "abc").unwrap();
        assert_eq!(format!("{k:?}"), before, "{name}");
    }
    assert_eq!(
        (k.xg_k, k.attn_bk, k.norm_wg, k.qmv_pf, k.bounds_checks),
        (Some(8192), Some(32), Some(512), Some(true), Some(false))
    );
}
